"""Stateless selection (``POST /v1/select``): arrays in, indices out.

The arrays are validated here with numpy (shapes, NaN/inf, index ranges, batch size; no torch), stored
with the job as ``.npz`` bytes, and selected on by ``worker.select_job.run_select``. Small requests
(``n * d * max(k, 1) <= sync_select_max_cells``) wait for the job and answer with the result; larger
ones answer 202 with a job to poll.
"""

from __future__ import annotations

import io
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
from sqlalchemy.orm import Session, sessionmaker

from service import catalog
from service.config import Settings
from service.db import session_scope
from service.domain import strategies
from service.errors import BadRequest, NotFound, ServiceError
from service.queue import JobQueue, enqueue_on_commit
from service.store import batches as store
from service.store.models import SelectJob

TASKS = ("classification", "regression")
TERMINAL = ("succeeded", "failed")


class SelectionFailed(ServiceError):
    """The selection library refused the input (its message is passed on verbatim)."""

    status_code = 400
    code = "selection_error"


class JobError(ServiceError):
    status_code = 500
    code = "job_failed"


@dataclass
class SelectInput:
    strategy: Any
    batch_size: Any
    task: Any
    params: Any
    arrays: dict[str, np.ndarray]


def _as_matrix(name: str, value: Any) -> np.ndarray:
    try:
        arr = np.asarray(value, dtype=np.float64) if not isinstance(value, np.ndarray) else value
    except (ValueError, TypeError) as exc:
        raise BadRequest(f"{name} must be a rectangular array of numbers ({exc})") from exc
    if arr.dtype.kind not in "fiu" or arr.ndim != 2:
        raise BadRequest(f"{name} must be a 2-D array of numbers, got shape {arr.shape} and dtype {arr.dtype}")
    if arr.shape[0] == 0 or arr.shape[1] == 0:
        raise BadRequest(f"{name} is empty (shape {arr.shape})")
    if not np.isfinite(arr).all():
        rows = np.flatnonzero(~np.isfinite(arr).all(axis=1))
        raise BadRequest(f"{name} contains NaN or inf in {rows.size} row(s), first row {int(rows[0])}")
    return arr


def _as_rows(name: str, value: Any, n: int) -> np.ndarray:
    """Indices (or a boolean mask of length n) as sorted unique int64 rows."""
    try:
        arr = np.asarray(value) if not isinstance(value, np.ndarray) else value
    except (ValueError, TypeError) as exc:
        raise BadRequest(f"{name} must be a list of row indices ({exc})") from exc
    if arr.size == 0:
        return np.empty(0, dtype=np.int64)
    if arr.ndim != 1:
        raise BadRequest(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.dtype == np.bool_:
        if arr.shape[0] != n:
            raise BadRequest(f"{name} as a boolean mask must have length n={n}, got {arr.shape[0]}")
        return np.flatnonzero(arr).astype(np.int64)
    if arr.dtype.kind not in "iu":
        raise BadRequest(f"{name} must hold integer row indices, got dtype {arr.dtype}")
    if int(arr.min()) < 0 or int(arr.max()) >= n:
        raise BadRequest(f"{name} has indices outside [0, {n - 1}]: range [{int(arr.min())}, {int(arr.max())}]")
    return np.unique(arr.astype(np.int64))


def validate(inp: SelectInput) -> tuple[dict[str, Any], dict[str, np.ndarray], int]:
    """Check a request; returns the job's request fields, its arrays and its size in cells."""
    if inp.task not in TASKS:
        raise BadRequest(f"task must be one of {', '.join(TASKS)}, got {inp.task!r}")
    strategies.check_request(inp.strategy, inp.task, inp.params)  # name, task, params: before the arrays
    if "embeddings" not in inp.arrays:
        raise BadRequest("embeddings are required (an n x d array)")
    X = _as_matrix("embeddings", inp.arrays["embeddings"])
    n, d = X.shape
    spec, params = strategies.check_request(inp.strategy, inp.task, inp.params, d)
    arrays: dict[str, np.ndarray] = {"embeddings": X}
    k = 1
    probs = inp.arrays.get("probs")
    if probs is not None:
        if inp.task == "regression":
            raise BadRequest("probs are for classification; a regression request takes none")
        P = _as_matrix("probs", probs)
        if P.shape[0] != n:
            raise BadRequest(f"probs has {P.shape[0]} rows but embeddings has {n}")
        if P.shape[1] < 2:
            raise BadRequest(f"probs must have at least 2 columns (classes), got {P.shape[1]}")
        if (P < 0).any() or not np.allclose(P.sum(axis=1), 1.0, atol=1e-3):
            raise BadRequest("probs must be non-negative and each row must sum to 1")
        arrays["probs"] = P
        k = P.shape[1]
    labeled = _as_rows("labeled", inp.arrays.get("labeled", []), n)
    reserved = _as_rows("reserved", inp.arrays.get("reserved", []), n)
    arrays["labeled"] = labeled
    arrays["reserved"] = reserved
    size = inp.batch_size
    if isinstance(size, bool) or not isinstance(size, int | np.integer):
        raise BadRequest(f"batch_size must be an integer, got {size!r}")
    candidates = n - np.union1d(labeled, reserved).size
    if not 1 <= int(size) <= candidates:
        raise BadRequest(
            f"batch_size must be between 1 and the {candidates} candidate row(s) (n minus labeled and reserved), "
            f"got {size}",
            details={"available": int(candidates)},
        )
    if inp.task == "classification" and "probs" not in arrays and "probs" in spec.inputs:
        raise BadRequest(
            f"classification with {spec.name!r} needs probs: an n x k array of predicted class probabilities"
        )
    request = {"batch_size": int(size), "task": inp.task, "params": params, "n": n, "d": d, "k": k}
    return {"strategy": spec.name, **request}, arrays, int(n * d * max(k, 1))


def _npz(arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # type: ignore[arg-type]
    return buf.getvalue()


def submit(
    factory: sessionmaker[Session], queue: JobQueue, settings: Settings, tenant_id: str, inp: SelectInput
) -> tuple[str, bool]:
    """Validate, store the job and submit it (after its own commit). Returns ``(job id, synchronous)``."""
    request, arrays, cells = validate(inp)
    strategy = request.pop("strategy")
    with session_scope(factory) as session:
        job = SelectJob(
            tenant_id=tenant_id,
            strategy=strategy,
            request=request,
            arrays=_npz(arrays),
            status="queued",
            progress_stage="queued",
            progress_done=0,
            progress_total=0,
            attempts=0,
            created_at=datetime.now(UTC),
        )
        session.add(job)
        session.flush()
        job_id = job.id
        enqueue_on_commit(session, queue, catalog.RUN_SELECT, job_id, job_id=job_id)
    return job_id, cells <= settings.sync_select_max_cells


def wait(factory: sessionmaker[Session], tenant_id: str, job_id: str, timeout: float) -> dict[str, Any]:
    """Poll the job until it ends or ``timeout`` passes; returns its view."""
    deadline = time.monotonic() + timeout
    delay = 0.01
    while True:
        with session_scope(factory) as session:
            view = job_view(session, tenant_id, job_id)
        if view["status"] in TERMINAL or time.monotonic() >= deadline:
            return view
        time.sleep(delay)
        delay = min(delay * 1.5, 0.1)


def raise_if_failed(view: dict[str, Any]) -> None:
    """A failed synchronous job as an error response: 400 with the library's message for bad input."""
    if view["status"] != "failed":
        return
    error_type = view.get("error_type") or ""
    if error_type.endswith("Error") and not (view["error"] or "").startswith("internal error"):
        raise SelectionFailed(view["error"] or "selection failed", details={"type": error_type, "job_id": view["id"]})
    raise JobError(view["error"] or "selection job failed", details={"job_id": view["id"]})


def job_view(session: Session, tenant_id: str, job_id: str) -> dict[str, Any]:
    job = store.get_select_job(session, tenant_id, job_id)
    if job is None:
        raise NotFound(f"select job {job_id!r} not found")
    result = job.result or {}
    done = job.status == "succeeded"
    return {
        "id": job.id,
        "status": job.status,
        "strategy": job.strategy,
        "batch_size": job.request.get("batch_size"),
        "progress": {"stage": job.progress_stage, "done": job.progress_done, "total": job.progress_total},
        "indices": result.get("indices") if done else None,
        "objective": result.get("objective") if done else None,
        "diagnostics": result.get("diagnostics") if done else None,
        "error": job.error,
        "error_type": result.get("error_type"),
        "created_at": job.created_at,
        "finished_at": job.finished_at,
    }

"""The stateless ``POST /v1/select`` job: arrays from the job row, indices back into it."""

from __future__ import annotations

import io
import logging
import time
import traceback
from typing import Any

import numpy as np

import selection
from selection.errors import SelectionError
from service.db import session_scope
from service.store import batches as store
from worker import context
from worker.runtime import PROGRESS_EVERY_S, describe_error, jsonable, resolve_device, start_job, utcnow

log = logging.getLogger(__name__)


def run_select(job_id: str) -> None:
    """Run a ``POST /v1/select`` job: arrays from the job row, indices back into it."""
    env = context.env()
    factory = env.sessionmaker
    started = start_job(
        factory,
        "select job",
        job_id,
        store.start_select_job,
        lambda s, jid: store.get_select_job(s, None, jid),
        lambda job, attempt, _now: (attempt, dict(job.request), job.arrays or b"", job.strategy),
    )
    if started is None:
        return
    attempt, request, blob, strategy = started
    last = [0.0]

    def progress(done: int, total: int) -> None:
        if time.monotonic() - last[0] >= PROGRESS_EVERY_S:
            last[0] = time.monotonic()
            with session_scope(factory) as s:
                store.select_job_progress(s, job_id, attempt, done, total)

    try:
        with np.load(io.BytesIO(blob), allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
        params = dict(request.get("params") or {})
        seed = params.pop("seed", 0)
        result = selection.select(
            strategy,
            embeddings=arrays["embeddings"],
            probs=arrays.get("probs"),
            labeled=arrays.get("labeled"),
            reserved=arrays.get("reserved"),
            batch_size=int(request["batch_size"]),
            task=request.get("task", "classification"),
            seed=int(seed or 0),
            device=resolve_device(env.settings.device),
            progress=progress,
            **params,
        )
        outcome: dict[str, Any] = {
            "status": "succeeded",
            "result": jsonable(
                {"indices": result.indices.tolist(), "objective": result.objective, "diagnostics": result.diagnostics}
            ),
            "error": None,
        }
    except Exception as exc:
        if not isinstance(exc, SelectionError):
            log.error("select job %s failed:\n%s", job_id, traceback.format_exc())
        outcome = {"status": "failed", "result": {"error_type": type(exc).__name__}, "error": describe_error(exc)}
    with session_scope(factory) as s:
        job = store.get_select_job(s, None, job_id, for_update=True)
        if job is None or job.status != "running" or job.attempts != attempt:
            return
        job.status = outcome["status"]
        job.result = outcome["result"]
        job.error = outcome["error"]
        job.finished_at = utcnow()
        job.arrays = None  # the inputs are not kept once answered
        if outcome["status"] == "succeeded":
            job.progress_done = job.progress_total = int(request["batch_size"])

"""Stateless ``POST /v1/select``: JSON and .npz requests, the synchronous and the job path, validation."""

from __future__ import annotations

import io
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

import selection
from service.config import Settings
from service.db import session_scope
from service.main import create_app
from service.store.models import SelectJob
from tests.worker.factories import blobs


def _probs(X: np.ndarray, k: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    logits = X @ rng.normal(size=(X.shape[1], k))
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def _post(client: TestClient, run_jobs: Any, **kwargs: Any) -> Any:
    """POST /v1/select while the jobs run (under RQ the test thread runs them)."""
    with ThreadPoolExecutor(1) as ex:
        fut = ex.submit(client.post, "/v1/select", **kwargs)
        run_jobs(until=fut.done, app_client=client)
        return fut.result()


def select_jobs(db: sessionmaker[Session]) -> int:
    with session_scope(db) as s:
        return int(s.execute(select(func.count()).select_from(SelectJob)).scalar_one())


def test_sync_json_select_matches_the_library(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any
) -> None:
    X, _ = blobs(60, 5, 3)
    P = _probs(X, 3)
    body = {
        "strategy": "bait",
        "batch_size": 6,
        "task": "classification",
        "embeddings": X.tolist(),
        "probs": P.tolist(),
        "labeled": [0, 1, 2],
        "reserved": [3],
        "params": {"seed": 4},
    }
    r = _post(client, run_jobs, json=body, headers=auth)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["status"] == "succeeded"
    expected = selection.select(
        "bait", embeddings=np.asarray(body["embeddings"]), probs=np.asarray(body["probs"]), labeled=[0, 1, 2],
        reserved=[3], batch_size=6, seed=4, device="cpu",
    )  # fmt: skip
    assert out["indices"] == expected.indices.tolist()
    assert out["objective"] == pytest.approx(expected.objective)
    assert out["diagnostics"]["strategy"] == "bait" and out["diagnostics"]["n"] == 60
    assert not {0, 1, 2, 3} & set(out["indices"])
    # the stored job keeps the answer, not the arrays
    got = client.get(f"/v1/select/{out['id']}", headers=auth).json()
    assert got["indices"] == out["indices"]
    with session_scope(db) as s:
        job = s.get(SelectJob, out["id"])
        assert job is not None and job.arrays is None


def test_sync_npz_select(client: TestClient, auth: dict[str, str], run_jobs: Any) -> None:
    X, _ = blobs(50, 4, 2, seed=1)
    buf = io.BytesIO()
    np.savez(buf, embeddings=X, labeled=np.array([0, 5]))
    r = _post(
        client,
        run_jobs,
        files={"arrays": ("pool.npz", buf.getvalue(), "application/octet-stream")},
        data={"strategy": "coreset", "batch_size": "7", "task": "regression", "params": '{"seed": 1}'},
        headers=auth,
    )
    assert r.status_code == 200, r.text
    expected = selection.select("coreset", embeddings=X, labeled=[0, 5], batch_size=7, task="regression", seed=1)
    assert r.json()["indices"] == expected.indices.tolist()


@pytest.fixture
def small_sync_client(settings: Settings, db: sessionmaker[Session]) -> Iterator[TestClient]:
    """An app whose synchronous limit is 100 cells, so any real request becomes a job."""
    with TestClient(create_app(settings.model_copy(update={"sync_select_max_cells": 100}))) as c:
        yield c


def test_large_select_becomes_a_job_to_poll(small_sync_client: TestClient, auth: dict[str, str], run_jobs: Any) -> None:
    client = small_sync_client
    X, _ = blobs(40, 4, 2, seed=2)
    body = {
        "strategy": "random",
        "batch_size": 5,
        "task": "regression",
        "embeddings": X.tolist(),
        "params": {"seed": 9},
    }
    r = client.post("/v1/select", json=body, headers=auth)
    assert r.status_code == 202, r.text
    job = r.json()
    assert job["status"] in ("queued", "running", "succeeded")  # a job, answered at once
    assert r.headers["Location"] == f"/v1/select/{job['id']}"
    run_jobs(
        until=lambda: client.get(f"/v1/select/{job['id']}", headers=auth).json()["status"] == "succeeded",
        app_client=client,
    )
    done = client.get(f"/v1/select/{job['id']}", headers=auth).json()
    expected = selection.select("random", embeddings=X, batch_size=5, task="regression", seed=9)
    assert done["indices"] == expected.indices.tolist()
    assert done["progress"]["done"] == 5


def test_selection_error_from_the_worker_is_a_400_with_its_message(
    client: TestClient, auth: dict[str, str], run_jobs: Any
) -> None:
    X, _ = blobs(30, 3, 2)
    body = {
        "strategy": "bait",
        "batch_size": 3,
        "embeddings": X.tolist(),
        "probs": _probs(X, 2).tolist(),
        # Valid for the web process, too small for the library's memory model: only the worker can tell.
        "params": {"max_memory_gb": 1e-9},
    }
    r = _post(client, run_jobs, json=body, headers=auth)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "selection_error"
    assert "memory" in err["message"] and "max_memory_gb" in err["message"]
    assert err["details"]["type"] == "MemoryBudgetError"
    failed = client.get(f"/v1/select/{err['details']['job_id']}", headers=auth).json()
    assert failed["status"] == "failed" and failed["error"] == err["message"]


@pytest.mark.parametrize(
    ("params", "words"),
    [
        ({"convention": "bogus"}, "must be one of reference, paper, sum"),
        ({"lam": 0}, "must be a finite number > 0"),
        ({"lam": -1.5}, "must be a finite number > 0"),
        ({"seed": 2**63}, "must be an integer in [0, 9223372036854775807]"),
        ({"seed": -1}, "must be an integer in [0, 9223372036854775807]"),
        ({"oversample": 0.5}, "must be a number in [1, 100]"),
        ({"approx": "exact", "approx_dim": 2}, "is only used with approx='pca', 'pca+topc' or 'pca+sampled' (or auto)"),
        ({"approx": "pca", "approx_classes": 1}, "is only used with approx='topc' or 'pca+topc' (or auto)"),
        ({"time_budget_s": 0}, "must be a finite number > 0"),
        ({"prefilter": {"top": 0}}, "keeps no candidate"),
        ({"prefilter": {"top": 5, "score": "entropy"}}, "needs 'score' to be one of gradnorm, margin"),
        ({"prefilter": "sometimes"}, "must be null/'auto', 'none' or an object"),
        ({"approx": "pca", "approx_dim": 3}, "at most the embedding dimension 2"),
        ({"approx": "sketch"}, "must be null/'auto', 'exact', 'pca', 'topc', 'pca+topc', 'sampled' or 'pca+sampled'"),
    ],
)
def test_select_refuses_bad_strategy_params_before_any_job(
    client: TestClient, auth: dict[str, str], params: dict[str, Any], words: str
) -> None:
    X, _ = blobs(30, 2, 2)
    body = {"strategy": "bait", "batch_size": 3, "embeddings": X.tolist(), "probs": _probs(X, 2).tolist()}
    r = client.post("/v1/select", json={**body, "params": params}, headers=auth)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "bad_request" and words in err["message"]
    assert "job_id" not in (err["details"] or {})  # refused in the web process: no job was created


X3 = [[0.0, 1.0], [1.0, 0.0], [1.0, 1.0], [2.0, 2.0]]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            {"strategy": "random", "batch_size": 1, "embeddings": [[0.0, float("nan")], [1.0, 1.0]]},
            "NaN or inf in 1 row",
        ),
        ({"strategy": "random", "batch_size": 1, "embeddings": [[0.0, 1.0], [1.0]]}, "rectangular array"),
        ({"strategy": "random", "batch_size": 1, "embeddings": []}, "embeddings must be a 2-D array"),
        ({"strategy": "random", "batch_size": 1}, "embeddings are required"),
        ({"strategy": "random", "batch_size": 4, "embeddings": X3, "labeled": [0]}, "between 1 and the 3 candidate"),
        (
            {"strategy": "random", "batch_size": 1, "embeddings": X3, "labeled": [4]},
            "labeled has indices outside [0, 3]",
        ),
        ({"strategy": "random", "batch_size": 1, "embeddings": X3, "reserved": [0.5]}, "reserved must hold integer"),
        (
            {"strategy": "margin", "batch_size": 1, "embeddings": X3, "probs": [[0.5, 0.6]] * 4},
            "each row must sum to 1",
        ),
        ({"strategy": "margin", "batch_size": 1, "embeddings": X3, "probs": [[0.5, 0.5]] * 3}, "probs has 3 rows"),
        (
            {"strategy": "coreset", "batch_size": 1, "task": "regression", "embeddings": X3, "probs": [[1, 0]] * 4},
            "probs are for classification",
        ),
        ({"strategy": "margin", "batch_size": 1, "task": "regression", "embeddings": X3}, "strategies for regression"),
        ({"strategy": "best", "batch_size": 1, "embeddings": X3}, "unknown strategy 'best'"),
        ({"strategy": "margin", "batch_size": 1, "embeddings": X3}, "classification with 'margin' needs probs"),
        ({"strategy": "random", "batch_size": 1, "embeddings": X3, "params": {"k": 1}}, "unknown parameter(s) 'k'"),
        ({"strategy": "random", "batch_size": 1, "embeddings": X3, "task": "ranking"}, "task must be one of"),
        ({"strategy": "random", "batch_size": 1, "embeddings": X3, "extra": 1}, "unknown field(s) ['extra']"),
    ],
)
def test_select_validation_writes_nothing(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], body: dict[str, Any], message: str
) -> None:
    import json

    r = client.post("/v1/select", content=json.dumps(body), headers={**auth, "Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    assert message in r.json()["error"]["message"]
    assert select_jobs(db) == 0


def test_select_rejects_a_bad_npz_and_other_media(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session]
) -> None:
    r = client.post("/v1/select", files={"arrays": ("x.npz", b"not a zip", "application/octet-stream")},
                    data={"strategy": "random", "batch_size": "1"}, headers=auth)  # fmt: skip
    assert r.status_code == 400 and ".npz file" in r.json()["error"]["message"]
    r = client.post("/v1/select", content=b"a,b", headers={**auth, "Content-Type": "text/csv"})
    assert r.status_code == 415
    assert select_jobs(db) == 0


def test_select_job_of_another_tenant_is_404(
    small_sync_client: TestClient, auth: dict[str, str], other_auth: dict[str, str], run_jobs: Any
) -> None:
    body = {"strategy": "random", "batch_size": 1, "task": "regression", "embeddings": X3 * 30}
    job = small_sync_client.post("/v1/select", json=body, headers=auth).json()
    assert small_sync_client.get(f"/v1/select/{job['id']}", headers=other_auth).status_code == 404
    run_jobs(app_client=small_sync_client)


def test_strategies_are_listed_with_tasks_and_params(client: TestClient, auth: dict[str, str]) -> None:
    r = client.get("/v1/strategies", headers=auth)
    assert r.status_code == 200
    listed = {s["name"]: s for s in r.json()["strategies"]}
    assert sorted(listed) == sorted(selection.STRATEGIES)
    assert listed["bait"]["tasks"] == ["classification", "regression"]
    assert listed["bait"]["params"]["oversample"] == {"type": "float", "default": 2}
    assert "fisher_weights" not in listed["bait"]["params"] and "seed" in listed["random"]["params"]
    defaults = r.json()["defaults"]["bait"]
    assert defaults["lam"] == listed["bait"]["params"]["lam"]["default"] == 0.01
    assert defaults["convention"] == listed["bait"]["params"]["convention"]["default"] == "reference"
    assert "tune half" in defaults["rule"] and defaults["evidence"] == "docs/results/heldout"
    assert client.get("/v1/strategies").status_code == 401

"""Torch threads around a job's small work (worker/threads.py) and the selection's restoring of them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

import selection
from selection.bait import threads as bait_threads
from service.config import Settings
from tests.worker.factories import make_pool
from worker import threads


@pytest.fixture
def two_threads() -> Iterator[None]:
    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def test_torch_threads_sets_and_restores(two_threads: None) -> None:
    with threads.torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    with pytest.raises(RuntimeError, match="boom"), threads.torch_threads(1):
        raise RuntimeError("boom")
    assert torch.get_num_threads() == 2  # restored on the way out of an exception too


def test_torch_threads_rejects_zero() -> None:
    with pytest.raises(ValueError, match="must be >= 1"), threads.torch_threads(0):
        pass


def test_bait_select_leaves_the_callers_threads_alone(two_threads: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # The exact engine runs its chunk workers with torch at 1 thread; it used to leave the caller at 1 (the
    # BLAS limit's restore reset the OpenMP pool after torch's count had been restored).
    monkeypatch.setattr(bait_threads, "THREADS", 2)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((300, 6))
    P = rng.dirichlet(np.ones(3), 300)
    result = selection.select(
        "bait", embeddings=X, probs=P, labeled=np.arange(10), batch_size=5, task="classification", seed=0
    )
    assert len(result.indices) == 5
    assert torch.get_num_threads() == 2


def test_warm_up_runs_once_per_process_and_measures_the_rates(monkeypatch: pytest.MonkeyPatch) -> None:
    from selection import calibrate
    from selection.bait.threads import resolve_threads

    monkeypatch.delenv("BAIT_RATES", raising=False)
    monkeypatch.setattr(threads, "_warmed", False)
    calibrate.clear_cache()
    cpu = torch.device("cpu")
    assert threads.warm_up() > 0.0
    # the first batch's plan then uses rates measured at the worker's start (float32 and float64 pools)
    for dtype in (torch.float32, torch.float64):
        assert calibrate.cached(cpu, dtype, resolve_threads(cpu))
        assert "measured" in calibrate.machine_rates(cpu, dtype, resolve_threads(cpu)).source
    assert threads.warm_up() == 0.0


def test_settings_validate_job_threads() -> None:
    assert Settings().job_threads == 1
    with pytest.raises(ValueError, match="job_threads"):
        Settings(job_threads=0)


def test_a_batch_trains_and_embeds_on_the_job_threads(
    client: TestClient,
    auth: dict[str, str],
    db: sessionmaker[Session],
    run_jobs: Any,
    two_threads: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from worker import batch as jobs

    seen: dict[str, int] = {}
    real_train, real_predict = jobs.train_head, jobs.head_predict

    def train_spy(*args: Any, **kwargs: Any) -> Any:
        seen["train"] = torch.get_num_threads()
        return real_train(*args, **kwargs)

    def predict_spy(*args: Any, **kwargs: Any) -> Any:
        seen["embed"] = torch.get_num_threads()
        return real_predict(*args, **kwargs)

    monkeypatch.setattr(jobs, "train_head", train_spy)
    monkeypatch.setattr(jobs, "head_predict", predict_spy)
    pool = make_pool(db, n=60, n_labeled=9)
    created = client.post(f"/v1/pools/{pool.pool_id}/batches", json={"size": 4, "strategy": "bait"}, headers=auth)
    assert created.status_code == 202, created.text
    run_jobs()
    got = client.get(created.headers["Location"], headers=auth).json()
    assert got["status"] == "succeeded", got.get("error")
    assert seen == {"train": 1, "embed": 1}  # BAIT_JOB_THREADS' default, whatever the process had

"""The batch job and the recovery of jobs whose worker died (re-queue while attempts are left, else
fail and release), on the configured backends."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service.api.batches import BatchOut
from service.config import Settings
from service.db import session_scope
from service.domain.batches import batch_view, cancel_batch
from service.domain.jobs import recover_jobs
from service.main import create_app
from service.store.attempts import opened, worker_name
from service.store.models import Batch, Item, Pool
from tests.conftest import REDIS_URL
from tests.worker.factories import item_states, make_pool


def dead_batch(
    db: sessionmaker[Session], pool_id: str, *, attempts: int, beat_age_s: float, status: str = "running", size: int = 5
) -> str:
    """A batch as a worker that died mid-job leaves it (nothing submitted to any queue)."""
    now = datetime.now(UTC)
    with session_scope(db) as s:
        batch = Batch(
            pool_id=pool_id, size=size, strategy="random", params={}, status=status, progress_stage="train",
            attempts=attempts, created_at=now - timedelta(seconds=beat_age_s + 5),
            started_at=now - timedelta(seconds=beat_age_s + 1), heartbeat_at=now - timedelta(seconds=beat_age_s),
        )  # fmt: skip
        s.add(batch)
        s.flush()
        return batch.id


def batch_row(db: sessionmaker[Session], batch_id: str) -> Batch:
    with session_scope(db) as s:
        batch = s.get(Batch, batch_id)
        assert batch is not None
        return batch


@pytest.fixture
def quick(settings: Settings) -> Settings:
    return settings.model_copy(update={"job_heartbeat_seconds": 0.2, "job_stale_seconds": 1.0})


def test_stale_running_batch_is_requeued_and_then_succeeds(
    client: TestClient, db: sessionmaker[Session], quick: Settings, run_jobs: Any
) -> None:
    pool = make_pool(db, n=40, n_labeled=5)
    batch_id = dead_batch(db, pool.pool_id, attempts=1, beat_age_s=30)
    report = recover_jobs(db, client.app.state.queue, quick, assume_dead=False)  # type: ignore[attr-defined]
    assert report.requeued == [batch_id] and report.failed == []
    # (no check of the intermediate "queued": the in-process runner may already have started it)
    run_jobs()
    batch = batch_row(db, batch_id)
    assert batch.status == "succeeded" and batch.attempts == 2 and batch.error is None
    assert batch.item_ids is not None and len(batch.item_ids) == 5


def test_requeued_batch_shows_its_attempt_history_with_the_reason(
    client: TestClient, db: sessionmaker[Session], quick: Settings, run_jobs: Any
) -> None:
    pool = make_pool(db, n=40, n_labeled=5)
    batch_id = dead_batch(db, pool.pool_id, attempts=1, beat_age_s=30)
    with session_scope(db) as s:  # what start_attempt wrote when the dead worker took it
        batch = s.get(Batch, batch_id)
        assert batch is not None and batch.started_at is not None
        batch.attempt_history = opened(None, 1, batch.started_at, "gone-host:4242")
    recover_jobs(db, client.app.state.queue, quick, assume_dead=False)  # type: ignore[attr-defined]
    run_jobs()
    batch = batch_row(db, batch_id)
    assert batch.status == "succeeded"
    view = BatchOut.model_validate(batch_view(batch)).model_dump(mode="json")
    first, second = view["attempt_history"]
    assert first["n"] == 1 and first["worker"] == "gone-host:4242" and first["outcome"] == "worker_lost"
    assert first["reason"] in ("no heartbeat for 30 s", "no heartbeat for 31 s") and first["ended_at"] is not None
    assert second["n"] == 2 and second["outcome"] == "succeeded" and second["reason"] is None
    assert second["worker"] == worker_name()  # this process ran it (in-process runner or SimpleWorker)
    assert second["started_at"] <= second["ended_at"]


def test_failed_and_cancelled_attempts_say_why(
    client: TestClient, db: sessionmaker[Session], quick: Settings, run_jobs: Any
) -> None:
    pool = make_pool(db, n=40, n_labeled=5)
    out_of_attempts = dead_batch(db, pool.pool_id, attempts=quick.job_max_attempts, beat_age_s=20)
    running = dead_batch(db, pool.pool_id, attempts=1, beat_age_s=0)
    with session_scope(db) as s:
        for bid in (out_of_attempts, running):
            batch = s.get(Batch, bid)
            assert batch is not None and batch.started_at is not None
            batch.attempt_history = opened(None, batch.attempts, batch.started_at, "w:1")
    recover_jobs(db, client.app.state.queue, quick, assume_dead=False)  # type: ignore[attr-defined]
    lost = batch_row(db, out_of_attempts)
    assert lost.status == "failed" and lost.attempt_history is not None
    assert lost.attempt_history[-1]["outcome"] == "worker_lost"
    assert lost.attempt_history[-1]["reason"].startswith("no heartbeat for 2")
    with session_scope(db) as s:
        pool_row = s.get(Pool, pool.pool_id)
        assert pool_row is not None
        cancel_batch(s, pool_row.tenant_id, pool.pool_id, running)
    history = batch_row(db, running).attempt_history
    assert history is not None and history[-1]["outcome"] == "cancelled" and history[-1]["ended_at"] is not None


def test_stale_batch_out_of_attempts_fails_and_releases_reservations(
    client: TestClient, db: sessionmaker[Session], quick: Settings
) -> None:
    pool = make_pool(db, n=40, n_labeled=5)
    batch_id = dead_batch(db, pool.pool_id, attempts=quick.job_max_attempts, beat_age_s=30)
    with session_scope(db) as s:  # items it held (as a crash between reserve and commit could never leave)
        for item in s.execute(select(Item).where(Item.external_id.in_(pool.external_ids[5:8]))).scalars():
            item.status, item.batch_id = "reserved", batch_id
            item.reserved_until = datetime.now(UTC) + timedelta(hours=1)
    report = recover_jobs(db, client.app.state.queue, quick, assume_dead=False)  # type: ignore[attr-defined]
    assert report.failed == [batch_id]
    batch = batch_row(db, batch_id)
    assert batch.status == "failed" and batch.finished_at is not None
    assert (
        batch.error is not None and "stopped responding" in batch.error and "gave up after 2 attempt(s)" in batch.error
    )
    assert not [i for i, (_, b) in item_states(db, pool.pool_id).items() if b == batch_id]


def test_batch_with_fresh_heartbeat_is_left_running(
    client: TestClient, db: sessionmaker[Session], quick: Settings
) -> None:
    pool = make_pool(db, n=20, n_labeled=5)
    batch_id = dead_batch(db, pool.pool_id, attempts=1, beat_age_s=0.0)
    report = recover_jobs(db, client.app.state.queue, quick, assume_dead=False)  # type: ignore[attr-defined]
    assert batch_id not in report.requeued + report.failed
    assert batch_row(db, batch_id).status == "running"


@pytest.fixture
def restarted(settings: Settings, db: sessionmaker[Session]) -> Iterator[Any]:
    """Start the processes that recover jobs on start: with Redis a burst `bait worker`, else the app."""

    def start() -> None:
        if REDIS_URL:
            from worker.rq_worker import run

            assert run(settings, burst=True) == 0
        else:
            with TestClient(create_app(settings)) as c:
                assert c.app.state.queue.wait_idle(60)  # type: ignore[attr-defined]

    yield start


def test_restart_requeues_jobs_left_by_a_dead_process(
    db: sessionmaker[Session], api_key: str, restarted: Any, settings: Settings
) -> None:
    pool = make_pool(db, n=40, n_labeled=5)
    # in-process mode: whatever was queued or running belonged to the dead process; under RQ the
    # worker's start-up sweep re-queues the running batch whose heartbeat is stale
    stale = settings.job_stale_seconds + 5
    running = dead_batch(db, pool.pool_id, attempts=1, beat_age_s=stale)
    queued = dead_batch(db, pool.pool_id, attempts=0, beat_age_s=stale, status="queued")
    restarted()
    for batch_id, attempts in ((running, 2), (queued, 1)):
        batch = batch_row(db, batch_id)
        assert batch.status == "succeeded", batch.error
        assert batch.attempts == attempts
    a, b = batch_row(db, running).item_ids, batch_row(db, queued).item_ids
    assert a and b and not set(a) & set(b)


def test_duplicate_delivery_runs_the_batch_once(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any
) -> None:
    from worker import batch_job as jobs

    pool = make_pool(db, n=30, n_labeled=5)
    created = client.post(f"/v1/pools/{pool.pool_id}/batches", json={"size": 4, "strategy": "random"}, headers=auth)
    run_jobs()
    first = batch_row(db, created.json()["id"])
    jobs.run_batch(first.id)  # a second delivery of the same job
    again = batch_row(db, first.id)
    assert (again.status, again.attempts, again.item_ids, again.checkpoint_id) == (
        "succeeded", 1, first.item_ids, first.checkpoint_id,
    )  # fmt: skip


def test_job_of_a_missing_batch_fails_clearly(client: TestClient) -> None:
    from worker import batch_job as jobs

    with pytest.raises(LookupError, match="batch nope does not exist"):
        jobs.run_batch("nope")


def test_an_attempt_cannot_finish_a_batch_cancelled_meanwhile(db: sessionmaker[Session], client: TestClient) -> None:
    from service.store.attempts import finish_attempt
    from service.store.batches import cancel_if

    pool = make_pool(db, n=20, n_labeled=5)
    batch_id = dead_batch(db, pool.pool_id, attempts=1, beat_age_s=0.0)  # running, attempt 1
    with session_scope(db) as s:  # the user's cancel commits while the job is still selecting
        assert cancel_if(s, batch_id, ("queued", "running", "succeeded"), datetime.now(UTC))
    with session_scope(db) as s:  # the job, which last saw "running", tries to finish
        assert not finish_attempt(
            s, Batch, batch_id, 1, {"status": "succeeded", "item_ids": ["x"]}, outcome="succeeded"
        )
    batch = batch_row(db, batch_id)
    assert batch.status == "cancelled" and batch.item_ids is None
    with session_scope(db) as s:  # and a cancelled batch cannot be cancelled again
        assert not cancel_if(s, batch_id, ("queued", "running", "succeeded"), datetime.now(UTC))


@pytest.mark.parametrize("strategy", ["bait", "random"])
def test_progress_total_of_a_stage_never_changes_once_known(
    client: TestClient,
    auth: dict[str, str],
    db: sessionmaker[Session],
    run_jobs: Any,
    monkeypatch: pytest.MonkeyPatch,
    strategy: str,
) -> None:
    """Each stage's total is known when it starts or left 0 (unknown) until the stage's own code reports it;
    it never jumps mid-stage (select used to go 0/20 -> 9/62)."""
    from worker import runtime

    writes: list[tuple[str, int, int]] = []
    touch = runtime.store.touch_batch

    def recording_touch(s: Session, batch_id: str, attempt: int, now: datetime, progress: Any = None) -> bool:
        if progress is not None:
            writes.append(progress)
        return touch(s, batch_id, attempt, now, progress)

    monkeypatch.setattr(runtime.store, "touch_batch", recording_touch)
    monkeypatch.setattr(runtime, "PROGRESS_EVERY_S", 0.0)  # record every report, not the throttled ones
    pool = make_pool(db, n=200, n_labeled=12)
    r = client.post(f"/v1/pools/{pool.pool_id}/batches", json={"size": 10, "strategy": strategy}, headers=auth)
    assert r.status_code == 202, r.text
    run_jobs()
    with session_scope(db) as s:
        assert s.get(Batch, r.json()["id"]).status == "succeeded"  # type: ignore[union-attr]
    stages = list(dict.fromkeys(stage for stage, _, _ in writes))
    expected = ["load", "train", "embed", "select", "store"] if strategy == "bait" else ["load", "select", "store"]
    assert stages == expected
    for stage in stages:
        seen = [(done, total) for name, done, total in writes if name == stage]
        totals = {total for _, total in seen if total}
        assert len(totals) <= 1, f"{stage}: total changed mid-stage: {seen}"
        assert all(0 <= done <= total for done, total in seen if total), f"{stage}: {seen}"
        dones = [done for done, _ in seen]
        assert dones == sorted(dones), f"{stage}: progress went back: {seen}"
    if strategy == "bait":  # BAIT reports its steps: the select stage ends complete
        select_writes = [(d, t) for name, d, t in writes if name == "select"]
        assert select_writes[0] == (0, 0) and select_writes[-1][0] == select_writes[-1][1] > 10

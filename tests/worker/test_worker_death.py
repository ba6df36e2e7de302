"""A process killed with SIGKILL mid-job leaves its batch re-queued (then succeeded) or failed, never
half-written, and no item reserved by a failed batch. Real processes: with Redis a `bait worker` on
the test database and queue; without, a `bait serve` with its in-process runner."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from service.catalog import RUN_BATCH
from service.db import session_scope
from service.queue import make_queue
from service.store.models import Batch, Checkpoint, Item, Pool
from tests.conftest import REDIS_URL
from tests.e2e.procs import Proc, bait_env, serve, wait_for
from tests.worker.factories import item_states, make_pool

pytestmark = pytest.mark.slow


def _batch(db: sessionmaker[Session], batch_id: str) -> Batch:
    with session_scope(db) as s:
        b = s.get(Batch, batch_id)
        assert b is not None
        return b


def _make_slow_pool(db: sessionmaker[Session]) -> str:
    # 1,500 labels that no head can fit (labels drawn at random): training runs its whole epoch cap
    pool = make_pool(db, n=6000, d=32, n_labeled=1500, head={"kind": "mlp", "max_epochs": 400, "batch_size": 16})
    with session_scope(db) as s:
        for i, item in enumerate(s.execute(select(Item).where(Item.status == "labeled")).scalars()):
            item.label = ["ant", "bee", "cat"][(i * 7919 + i // 7) % 3]
    return pool.pool_id


def _create_batch(db: sessionmaker[Session], pool_id: str) -> str:
    """A queued batch row (as POST /batches writes it); the caller submits the job."""
    with session_scope(db) as s:
        batch = Batch(pool_id=pool_id, size=25, strategy="confidence", params={}, status="queued", attempts=0)
        s.add(batch)
        s.flush()
        return batch.id


def _start(settings: Any, env: dict[str, str], log: Path) -> tuple[Proc, str | None]:
    if REDIS_URL:
        return Proc(["worker", "--name", f"death-{uuid.uuid4().hex[:6]}"], env, log), None
    proc, base = serve(env, log)
    return proc, base


@pytest.mark.parametrize("max_attempts", [2, 1])
def test_worker_killed_mid_job_leaves_batch_requeued_or_failed(
    db: sessionmaker[Session], settings: Any, tmp_path: Path, max_attempts: int
) -> None:
    pool_id = _make_slow_pool(db)
    env = bait_env(
        settings.database_url, REDIS_URL, settings.queue_name,
        job_heartbeat_seconds=0.3, job_stale_seconds=1.5, sweep_interval_seconds=0.5, job_max_attempts=max_attempts,
    )  # fmt: skip
    batch_id = _create_batch(db, pool_id)
    if REDIS_URL:
        queue = make_queue(settings)
        queue.enqueue(RUN_BATCH, batch_id, batch_id=batch_id)
        first, _ = _start(settings, env, tmp_path / "first.log")
    else:
        # the embedded server picks queued batches up when it starts
        first, _ = _start(settings, env, tmp_path / "first.log")

    def training() -> bool:
        b = _batch(db, batch_id)
        return b.status == "running" and b.progress_stage == "train" and b.progress_done >= 3

    wait_for(training, 120, "the job never got into training", first)
    first.kill9()

    # nothing half-written: still 'running' (its worker is gone), no reservation, no checkpoint
    dead = _batch(db, batch_id)
    assert dead.status == "running" and dead.attempts == 1 and dead.item_ids is None
    assert not [i for i, (_, b) in item_states(db, pool_id).items() if b == batch_id]
    with session_scope(db) as s:
        assert s.execute(select(func.count()).select_from(Checkpoint)).scalar_one() == 0
        # the retry need not train for long: the test is about recovery
        pool = s.get(Pool, pool_id)
        assert pool is not None
        pool.head = {**pool.head, "max_epochs": 3}

    second, _ = _start(settings, env, tmp_path / "second.log")
    try:
        expected = "succeeded" if max_attempts == 2 else "failed"
        wait_for(lambda: _batch(db, batch_id).status == expected, 120, f"batch never {expected}", second)
    finally:
        second.stop()
    batch = _batch(db, batch_id)
    held = sorted(i for i, (st, b) in item_states(db, pool_id).items() if b == batch_id and st == "reserved")
    if max_attempts == 2:
        assert batch.attempts == 2
        assert batch.item_ids is not None and sorted(batch.item_ids) == held and len(held) == 25
    else:
        assert batch.attempts == 1
        assert batch.error is not None and "stopped responding" in batch.error and "gave up after 1" in batch.error
        assert batch.item_ids is None and held == []

"""Two batch jobs on one pool running at the same time never return the same item, and each runs its
selection once: selections on one pool take turns (a per-pool lock held from reading the reserved set
to committing the reservation), and the reservation is a conditional UPDATE under row locks."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from tests.conftest import PG_ADMIN_URL
from tests.service.test_batches import get_batch, post_batch
from tests.worker.factories import item_states, make_pool


def _run_together(settings: Settings, batch_ids: list[str]) -> None:
    """Run the batch jobs in threads released at the same moment."""
    from worker import batch_job as jobs
    from worker import context

    context.configure(settings)
    barrier = threading.Barrier(len(batch_ids))
    errors: list[BaseException] = []

    def work(batch_id: str) -> None:
        try:
            barrier.wait()
            jobs.run_batch(batch_id)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(b,)) for b in batch_ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors


@pytest.mark.skipif(not PG_ADMIN_URL, reason="needs PostgreSQL (BAIT_TEST_DATABASE_URL): concurrent writers, row locks")
def test_concurrent_batches_on_one_pool_never_share_an_item(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], settings: Settings
) -> None:
    # Both jobs see the same 220 candidates when they load and would pick overlapping sets; the one
    # that selects second waits for the first's reservation and selects around it.
    pool = make_pool(db, n=240, n_labeled=20, d=6)
    a = post_batch(client, auth, pool.pool_id, size=100, strategy="bait").json()["id"]
    b = post_batch(client, auth, pool.pool_id, size=100, strategy="bait").json()["id"]
    _run_together(settings, [a, b])
    ba, bb = get_batch(client, auth, pool.pool_id, a), get_batch(client, auth, pool.pool_id, b)
    assert ba["status"] == bb["status"] == "succeeded", (ba["error"], bb["error"])
    assert len(set(ba["item_ids"])) == len(set(bb["item_ids"])) == 100
    assert not set(ba["item_ids"]) & set(bb["item_ids"])
    # they really ran at the same time, yet each selected once, the later one around the first's items
    assert ba["started_at"] < bb["finished_at"] and bb["started_at"] < ba["finished_at"]
    assert ba["diagnostics"]["selection_runs"] == bb["diagnostics"]["selection_runs"] == 1
    later = max((ba, bb), key=lambda x: x["finished_at"])
    assert later["diagnostics"]["n_reserved_by_others"] == 100
    states = item_states(db, pool.pool_id)
    assert sum(b_ == a for _, b_ in states.values()) == 100
    assert sum(b_ == b for _, b_ in states.values()) == 100


@pytest.mark.skipif(
    not PG_ADMIN_URL,
    reason="needs PostgreSQL (BAIT_TEST_DATABASE_URL): the concurrency guarantee is PostgreSQL's row locks; "
    "SQLite (the embedded single-process default) has no FOR UPDATE",
)
def test_concurrent_batches_that_cannot_both_fit_one_fails_cleanly(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], settings: Settings, run_jobs: Any
) -> None:
    pool = make_pool(db, n=160, n_labeled=10, d=6)
    ids = [post_batch(client, auth, pool.pool_id, size=100, strategy="random").json()["id"] for _ in range(2)]
    _run_together(settings, ids)
    run_jobs()
    batches = [get_batch(client, auth, pool.pool_id, i) for i in ids]
    winners = [x for x in batches if x["status"] == "succeeded"]
    losers = [x for x in batches if x["status"] == "failed"]
    assert len(winners) == 1 and len(losers) == 1, [(x["status"], x["error"], x["attempts"]) for x in batches]
    assert losers[0]["error"] == (
        "batch_size=100 but only 50 candidate rows are available (pool of 160 rows, 10 labeled, 100 reserved)"
    )
    states = item_states(db, pool.pool_id)
    assert sorted(i for i, (st, b) in states.items() if b == winners[0]["id"]) == sorted(winners[0]["item_ids"])
    assert not [i for i, (_, b) in states.items() if b == losers[0]["id"]]

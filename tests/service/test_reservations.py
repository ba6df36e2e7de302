"""Reservations: a batch never returns a labeled or live-reserved item; expired reservations count as
unlabeled everywhere (availability check, selection, re-reservation)."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from tests.service.test_batches import get_batch, post_batch
from tests.worker.factories import item_states, make_pool, reserve


def test_batch_excludes_labeled_and_reserved_items(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any
) -> None:
    pool = make_pool(db, n=50, n_labeled=20)
    held = pool.external_ids[20:35]
    reserve(db, pool.pool_id, held, seconds=3600)
    # 15 items are left: asking for 16 is refused, asking for all 15 gets exactly them
    r = post_batch(client, auth, pool.pool_id, size=16, strategy="random")
    assert r.status_code == 400 and "the 15 item(s) available" in r.json()["error"]["message"]
    created = post_batch(client, auth, pool.pool_id, size=15, strategy="bait").json()
    run_jobs()
    batch = get_batch(client, auth, pool.pool_id, created["id"])
    assert batch["status"] == "succeeded", batch["error"]
    assert sorted(batch["item_ids"]) == pool.external_ids[35:]
    assert batch["diagnostics"]["n_reserved_by_others"] == 15
    assert batch["diagnostics"]["n_labeled"] == 20


def test_expired_reservation_makes_items_selectable_again(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any
) -> None:
    pool = make_pool(db, n=30, n_labeled=10)
    old = reserve(db, pool.pool_id, pool.external_ids[10:30], seconds=-1)  # expired a second ago
    created = post_batch(client, auth, pool.pool_id, size=20, strategy="random")
    assert created.status_code == 202, created.text
    run_jobs()
    batch = get_batch(client, auth, pool.pool_id, created.json()["id"])
    assert batch["status"] == "succeeded", batch["error"]
    assert sorted(batch["item_ids"]) == pool.external_ids[10:30]
    states = item_states(db, pool.pool_id)
    assert all(states[i] == ("reserved", batch["id"]) for i in batch["item_ids"])
    assert not [i for i, (_, b) in states.items() if b == old]


def test_live_reservation_is_not_taken_over(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any
) -> None:
    pool = make_pool(db, n=30, n_labeled=10)
    live = reserve(db, pool.pool_id, pool.external_ids[10:20], seconds=3600)
    created = post_batch(client, auth, pool.pool_id, size=10, strategy="random").json()
    run_jobs()
    batch = get_batch(client, auth, pool.pool_id, created["id"])
    assert sorted(batch["item_ids"]) == pool.external_ids[20:30]
    states = item_states(db, pool.pool_id)
    assert all(states[i] == ("reserved", live) for i in pool.external_ids[10:20])


def test_reservation_uses_configured_ttl(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any
) -> None:
    from sqlalchemy import select

    from service.db import session_scope
    from service.store.models import Batch, Item

    pool = make_pool(db, n=20, n_labeled=5)
    created = post_batch(client, auth, pool.pool_id, size=3, strategy="random").json()
    run_jobs()
    with session_scope(db) as s:
        batch = s.get(Batch, created["id"])
        assert batch is not None and batch.finished_at is not None
        untils = s.execute(select(Item.reserved_until).where(Item.batch_id == created["id"])).scalars().all()
        finished = batch.finished_at
    assert len(untils) == 3
    ttl = client.app.state.settings.reservation_ttl_seconds  # type: ignore[attr-defined]
    assert all(abs((u - finished).total_seconds() - ttl) < 1 for u in untils)

"""Pool item counts kept by the database (pool_item_counts, migration 0007) agree with a count of the rows,
after every kind of write (ORM, set-based, raw SQL, upserts, deletes, cascades), with expired reservations,
under concurrent writers (PostgreSQL), and across the migration (up with existing items, down, up)."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from alembic import command
from fastapi.testclient import TestClient
from sqlalchemy import Engine, create_engine, event, func, select, text
from sqlalchemy.orm import Session, sessionmaker

from service.db import session_scope
from service.migrate import alembic_config, upgrade
from service.store import batches as batches_repo
from service.store import counts as counts_repo
from service.store import items as items_repo
from service.store.models import Item, Pool, PoolItemCount, Tenant
from tests.conftest import PG_ADMIN_URL, scratch_postgres_database
from tests.service.conftest import embeddings, make_pool

Auth = dict[str, str]
NOW = datetime(2030, 1, 1, tzinfo=UTC)


def scanned(session: Session, pool_id: str) -> dict[tuple[str, str, str], int]:
    """What the counts must be: a GROUP BY over the pool's rows."""
    rows = session.execute(
        select(Item.split, Item.status, Item.embedding_status, func.count())
        .where(Item.pool_id == pool_id)
        .group_by(Item.split, Item.status, Item.embedding_status)
    ).all()
    return {(a, b, c): int(n) for a, b, c, n in rows}


def kept(session: Session, pool_id: str) -> dict[tuple[str, str, str], int]:
    return counts_repo.tallies(session, [pool_id])[pool_id]


def assert_counts_match(db: sessionmaker[Session], *pool_ids: str) -> None:
    with db() as s:
        for pid in pool_ids:
            assert kept(s, pid) == scanned(s, pid), pid


@pytest.fixture
def pools(db: sessionmaker[Session]) -> list[str]:
    with session_scope(db) as s:
        s.add(Tenant(id="t1", name="t1"))
        s.flush()
        ids = []
        for name in ("a", "b"):
            pool = Pool(tenant_id="t1", name=name, task="classification", classes=["x", "y"], n_outputs=2,
                        embedding_dim=4, head={"kind": "linear"})  # fmt: skip
            s.add(pool)
            s.flush()
            ids.append(pool.id)
    return ids


def _insert_raw(s: Session, pool_id: str, names: list[str], **cols: Any) -> None:
    values = {"status": "unlabeled", "embedding_status": "ready", "split": "train", **cols}
    for name in names:
        s.execute(
            text(
                "INSERT INTO items (pool_id, external_id, embedding, status, embedding_status, split, created_at, "
                "updated_at) VALUES (:p, :x, :e, :status, :embedding_status, :split, :now, :now)"
            ),
            {"p": pool_id, "x": name, "e": b"\0" * 16, "now": NOW, **values},
        )


def test_counts_follow_inserts_upserts_updates_and_deletes(db: sessionmaker[Session], pools: list[str]) -> None:
    a, b = pools
    with session_scope(db) as s:
        items_repo.upsert_embeddings(s, a, [f"i{k}" for k in range(50)], embeddings(50), NOW)
        _insert_raw(s, b, ["r1", "r2", "r3"], embedding_status="pending")
    assert_counts_match(db, a, b)
    with db() as s:
        assert kept(s, a) == {("train", "unlabeled", "ready"): 50}
        assert kept(s, b) == {("train", "unlabeled", "pending"): 3}
    with session_scope(db) as s:  # an upsert of existing and new ids: only the new ones are added
        items_repo.upsert_embeddings(s, a, [f"i{k}" for k in range(40, 60)], embeddings(20, seed=2), NOW)
        ids = items_repo.internal_ids(s, a, [f"i{k}" for k in range(10)])
        items_repo.set_labels(s, [(iid, "x") for iid in ids.values()], NOW)
        s.execute(text("UPDATE items SET split = 'validation' WHERE pool_id = :p AND external_id IN ('i0', 'i11')"),
                  {"p": a})  # fmt: skip
        s.execute(
            text("UPDATE items SET embedding_status = 'error' WHERE pool_id = :p AND external_id = 'r1'"), {"p": b}
        )
        s.execute(text("UPDATE items SET updated_at = :t WHERE pool_id = :p"), {"p": a, "t": NOW})  # no key changes
    assert_counts_match(db, a, b)
    with db() as s:
        assert kept(s, a) == {
            ("train", "labeled", "ready"): 9,
            ("validation", "labeled", "ready"): 1,
            ("validation", "unlabeled", "ready"): 1,
            ("train", "unlabeled", "ready"): 49,
        }
    with session_scope(db) as s:
        s.execute(text("DELETE FROM items WHERE pool_id = :p AND external_id LIKE 'i1%'"), {"p": a})
        items_repo.clear_label(s, items_repo.internal_ids(s, a, ["i2"])["i2"], NOW)
    assert_counts_match(db, a, b)


def test_a_rolled_back_write_leaves_the_counts_as_they_were(db: sessionmaker[Session], pools: list[str]) -> None:
    a, _ = pools
    with session_scope(db) as s:
        items_repo.upsert_embeddings(s, a, ["k0", "k1"], embeddings(2), NOW)
    with pytest.raises(RuntimeError), session_scope(db) as s:
        items_repo.upsert_embeddings(s, a, [f"z{k}" for k in range(30)], embeddings(30), NOW)
        s.execute(text("UPDATE items SET status = 'labeled' WHERE pool_id = :p"), {"p": a})
        raise RuntimeError("the request failed after writing")
    with db() as s:
        assert kept(s, a) == {("train", "unlabeled", "ready"): 2}


def test_deleting_a_pool_takes_its_counts_and_leaves_the_others(db: sessionmaker[Session], pools: list[str]) -> None:
    a, b = pools
    with session_scope(db) as s:
        items_repo.upsert_embeddings(s, a, ["x", "y"], embeddings(2), NOW)
        items_repo.upsert_embeddings(s, b, ["x"], embeddings(1), NOW)
    with session_scope(db) as s:
        s.execute(text("DELETE FROM pools WHERE id = :p"), {"p": a})
    with db() as s:
        assert (
            s.execute(select(func.count()).select_from(PoolItemCount).where(PoolItemCount.pool_id == a)).scalar() == 0
        )
        assert kept(s, b) == {("train", "unlabeled", "ready"): 1}


def test_effective_status_and_available_count_expired_reservations(db: sessionmaker[Session], pools: list[str]) -> None:
    a, _ = pools
    with session_scope(db) as s:
        _insert_raw(s, a, ["u1", "u2"])
        _insert_raw(s, a, ["live"], status="reserved")
        _insert_raw(s, a, ["ended", "ended-v"], status="reserved")
        _insert_raw(s, a, ["forever"], status="reserved")
        _insert_raw(s, a, ["lab"], status="labeled")
        _insert_raw(s, a, ["pend"], embedding_status="pending")
        s.execute(text("UPDATE items SET reserved_until = :t WHERE external_id = 'live'"), {"t": NOW + timedelta(1)})
        s.execute(
            text("UPDATE items SET reserved_until = :t WHERE external_id LIKE 'ended%'"), {"t": NOW - timedelta(1)}
        )
        s.execute(text("UPDATE items SET split = 'validation' WHERE external_id = 'ended-v'"))
    with db() as s:
        by_status = items_repo.count_by_status(s, [a], NOW)[a]
        assert by_status == {"items": 8, "unlabeled": 5, "reserved": 2, "labeled": 1}
        # available: train, ready, unlabeled or reservation ended (the validation item and the pending one not)
        expected = s.execute(
            select(func.count()).select_from(Item).where(Item.pool_id == a, batches_repo.available_clause(NOW))
        ).scalar_one()
        assert batches_repo.count_available(s, a, NOW) == expected == 3
        assert batches_repo.count_items(s, a) == 8


def test_pool_view_counts_match_a_scan_through_the_api(
    client: TestClient, auth: Auth, db: sessionmaker[Session]
) -> None:
    pool = make_pool(client, auth)
    ids = [f"e{k}" for k in range(30)]
    resp = client.post(
        f"/v1/pools/{pool['id']}/items",
        json={"items": [{"id": i, "embedding": row.tolist()} for i, row in zip(ids, embeddings(30), strict=True)]},
        headers=auth,
    )
    assert resp.status_code == 200, resp.text
    labels = [{"item_id": i, "label": "cat"} for i in ids[:7]]
    assert client.put(f"/v1/pools/{pool['id']}/labels", json={"labels": labels}, headers=auth).status_code == 200
    assert client.delete(f"/v1/pools/{pool['id']}/labels/e3", headers=auth).status_code in (200, 204)
    view = client.get(f"/v1/pools/{pool['id']}", headers=auth).json()
    assert view["counts"] == {"items": 30, "unlabeled": 24, "reserved": 0, "labeled": 6}
    assert_counts_match(db, pool["id"])


# ------------------------------------------------------------------------------ PostgreSQL: concurrency

pg_only = pytest.mark.skipif(not PG_ADMIN_URL, reason="concurrent writers: PostgreSQL only (SQLite has one writer)")


@pg_only
def test_reads_fold_the_delta_rows_and_keep_the_totals(db: sessionmaker[Session], pools: list[str]) -> None:
    a, _ = pools
    for k in range(counts_repo.FOLD_ABOVE + 10):  # one statement each: one delta row each
        with session_scope(db) as s:
            _insert_raw(s, a, [f"f{k}"], status="labeled" if k % 3 == 0 else "unlabeled")
    with db() as s:
        rows_before = s.execute(select(func.count()).select_from(PoolItemCount).where(PoolItemCount.pool_id == a))
        assert rows_before.scalar_one() > counts_repo.FOLD_ABOVE
    with session_scope(db) as s:
        assert kept(s, a) == scanned(s, a)  # the read folds
    with db() as s:
        rows_after = s.execute(select(func.count()).select_from(PoolItemCount).where(PoolItemCount.pool_id == a))
        assert rows_after.scalar_one() == 2
        assert kept(s, a) == scanned(s, a)


@pg_only
def test_concurrent_writers_deletes_rollbacks_and_folds_keep_counts_exact(
    db: sessionmaker[Session], pools: list[str]
) -> None:
    a, b = pools
    errors: list[BaseException] = []
    stop = threading.Event()

    def writer(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for step in range(40):
                pool = a if rng.random() < 0.7 else b
                try:
                    with session_scope(db) as s:
                        op = rng.choice(["insert", "upsert", "label", "unlabel", "split", "delete", "reserve"])
                        if op == "insert":
                            _insert_raw(s, pool, [f"w{seed}-{step}-{k}" for k in range(rng.randint(1, 5))])
                        elif op == "upsert":
                            names = [f"u{rng.randint(0, 30)}" for _ in range(3)]
                            names = sorted(set(names))
                            items_repo.upsert_embeddings(s, pool, names, embeddings(len(names), seed=step), NOW)
                        elif op == "label":
                            s.execute(text("UPDATE items SET status = 'labeled' WHERE id IN (SELECT id FROM items "
                                           "WHERE pool_id = :p AND status <> 'labeled' ORDER BY random() LIMIT 3)"),
                                      {"p": pool})  # fmt: skip
                        elif op == "unlabel":
                            s.execute(text("UPDATE items SET status = 'unlabeled' WHERE id IN (SELECT id FROM items "
                                           "WHERE pool_id = :p AND status = 'labeled' ORDER BY random() LIMIT 2)"),
                                      {"p": pool})  # fmt: skip
                        elif op == "split":
                            s.execute(text("UPDATE items SET split = 'validation' WHERE id IN (SELECT id FROM items "
                                           "WHERE pool_id = :p ORDER BY random() LIMIT 1)"), {"p": pool})  # fmt: skip
                        elif op == "delete":
                            s.execute(text("DELETE FROM items WHERE id IN (SELECT id FROM items WHERE pool_id = :p "
                                           "ORDER BY random() LIMIT 2)"), {"p": pool})  # fmt: skip
                        else:
                            s.execute(text("UPDATE items SET status = 'reserved', reserved_until = :t WHERE id IN "
                                           "(SELECT id FROM items WHERE pool_id = :p AND status = 'unlabeled' "
                                           "ORDER BY random() LIMIT 2)"), {"p": pool, "t": NOW})  # fmt: skip
                        if rng.random() < 0.2:
                            raise _Rollback()
                except _Rollback:
                    pass
                except Exception as exc:  # a deadlock or serialization retry is not what is tested here
                    if "deadlock" not in str(exc) and "could not serialize" not in str(exc):
                        raise
        except BaseException as exc:
            errors.append(exc)

    def reader() -> None:
        try:
            while not stop.is_set():
                with session_scope(db) as s:
                    counts_repo.tallies(s, [a, b])  # folds when the deltas pile up
                    counts_repo.fold(s, a)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(seed,)) for seed in range(6)]
    readers = [threading.Thread(target=reader) for _ in range(2)]
    for t in threads + readers:
        t.start()
    for t in threads:
        t.join(timeout=300)
    stop.set()
    for t in readers:
        t.join(timeout=60)
    assert not errors, errors
    assert_counts_match(db, a, b)
    with session_scope(db) as s:
        counts_repo.fold(s, a)
        counts_repo.fold(s, b)
    assert_counts_match(db, a, b)


class _Rollback(Exception):
    pass


# ------------------------------------------------------------------------------------------ migration


@pytest.fixture
def scratch_url(tmp_path: Any) -> Iterator[str]:
    if not PG_ADMIN_URL:
        yield f"sqlite:///{tmp_path / 'old.db'}"
        return
    with scratch_postgres_database("bait_counts") as url:
        yield url


def _engine(url: str) -> Engine:
    eng = create_engine(url)
    if url.startswith("sqlite"):
        event.listen(eng, "connect", lambda conn, _rec: conn.execute("PRAGMA foreign_keys=ON"))
    return eng


def test_migration_0007_counts_existing_items_then_goes_down_and_up(scratch_url: str) -> None:
    upgrade(scratch_url, "0005")
    eng = _engine(scratch_url)
    with eng.begin() as conn:
        conn.execute(text("INSERT INTO tenants (id, name, created_at) VALUES ('t', 't', CURRENT_TIMESTAMP)"))
        conn.execute(
            text(
                "INSERT INTO pools (id, tenant_id, name, task, n_outputs, embedding_dim, head, created_at, updated_at) "
                "VALUES ('p', 't', 'p', 'classification', 2, 2, '{}', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
            )
        )
        for k in range(7):
            conn.execute(
                text(
                    "INSERT INTO items (pool_id, external_id, embedding, status, embedding_status, split, "
                    "created_at, updated_at) VALUES ('p', :x, :e, :s, 'ready', 'train', CURRENT_TIMESTAMP, "
                    "CURRENT_TIMESTAMP)"
                ),
                {"x": f"m{k}", "e": b"\0" * 8, "s": "labeled" if k < 2 else "unlabeled"},
            )
    upgrade(scratch_url, "0007")

    def tally() -> dict[tuple[str, str], int]:
        with eng.connect() as conn:
            rows = conn.execute(
                text("SELECT status, embedding_status, sum(n) FROM pool_item_counts GROUP BY status, embedding_status")
            ).all()
        return {(a, b): int(n) for a, b, n in rows if int(n)}

    assert tally() == {("labeled", "ready"): 2, ("unlabeled", "ready"): 5}
    with eng.begin() as conn:
        conn.execute(text("UPDATE items SET status = 'labeled' WHERE external_id = 'm5'"))
        conn.execute(text("DELETE FROM items WHERE external_id = 'm6'"))
    assert tally() == {("labeled", "ready"): 3, ("unlabeled", "ready"): 3}
    command.downgrade(alembic_config(scratch_url), "0005")
    with eng.begin() as conn:  # no trigger is left behind writing to a table that is gone
        conn.execute(text("UPDATE items SET status = 'unlabeled'"))
        conn.execute(text("DELETE FROM items WHERE external_id = 'm0'"))
        names = set(conn.execute(text("SELECT external_id FROM items")).scalars())
    assert names == {"m1", "m2", "m3", "m4", "m5"}
    upgrade(scratch_url, "0007")
    assert tally() == {("unlabeled", "ready"): 5}
    eng.dispose()


def test_items_listing_uses_ranges_for_every_filter(client: TestClient, auth: Auth, db: sessionmaker[Session]) -> None:
    """The pages' content is the same as before the indexes (the effective status filter, upload order)."""
    pool = make_pool(client, auth)
    ids = [f"q{k:02d}" for k in range(40)]
    resp = client.post(
        f"/v1/pools/{pool['id']}/items",
        json={"items": [{"id": i, "embedding": row.tolist()} for i, row in zip(ids, embeddings(40), strict=True)]},
        headers=auth,
    )
    assert resp.status_code == 200
    labels = [{"item_id": i, "label": "dog"} for i in ids[::4]]
    client.put(f"/v1/pools/{pool['id']}/labels", json={"labels": labels}, headers=auth)
    past, future = datetime.now(UTC) - timedelta(hours=1), datetime.now(UTC) + timedelta(hours=1)
    with session_scope(db) as s:
        for ext, until in (("q01", past), ("q02", future), ("q05", past)):
            s.execute(
                text(
                    "UPDATE items SET status = 'reserved', reserved_until = :t WHERE pool_id = :p AND external_id = :x"
                ),
                {"t": until, "p": pool["id"], "x": ext},
            )

    def walk(**params: Any) -> list[str]:
        out: list[str] = []
        cursor = None
        while True:
            q = {"limit": 3, **params, **({"cursor": cursor} if cursor else {})}
            page = client.get(f"/v1/pools/{pool['id']}/items", params=q, headers=auth).json()
            out += [it["id"] for it in page["items"]]
            cursor = page["next_cursor"]
            if cursor is None:
                return out

    labeled = set(ids[::4])
    assert walk() == ids
    assert walk(status="labeled") == [i for i in ids if i in labeled]
    assert walk(status="reserved") == ["q02"]
    assert walk(status="unlabeled") == [i for i in ids if i not in labeled and i != "q02"]
    assert walk(embedding_status="pending") == []
    assert walk(embedding_status="ready") == ids

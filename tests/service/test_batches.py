"""Batches over HTTP: lifecycle, validation (nothing written), idempotency, tenants, cancel, failure."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from service.db import session_scope
from service.store.models import Batch, Checkpoint, Item
from tests.worker.factories import item_states, make_pool, reserve


def post_batch(client: TestClient, auth: dict[str, str], pool_id: str, **body: Any) -> Any:
    body.setdefault("params", {})
    return client.post(f"/v1/pools/{pool_id}/batches", json=body, headers=auth)


def get_batch(client: TestClient, auth: dict[str, str], pool_id: str, batch_id: str) -> dict[str, Any]:
    r = client.get(f"/v1/pools/{pool_id}/batches/{batch_id}", headers=auth)
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def count_rows(db: sessionmaker[Session], model: Any) -> int:
    with session_scope(db) as s:
        return int(s.execute(select(func.count()).select_from(model)).scalar_one())


@pytest.mark.parametrize("strategy", ["bait", "confidence", "random"])
def test_batch_lifecycle_selects_distinct_unlabeled_items(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any, strategy: str
) -> None:
    pool = make_pool(db, n=150, n_labeled=12)
    r = post_batch(client, auth, pool.pool_id, size=20, strategy=strategy)
    assert r.status_code == 202, r.text
    created = r.json()
    assert created["status"] == "queued"
    assert r.headers["Location"] == f"/v1/pools/{pool.pool_id}/batches/{created['id']}"

    run_jobs()
    batch = get_batch(client, auth, pool.pool_id, created["id"])
    assert batch["status"] == "succeeded", batch["error"]
    ids = batch["item_ids"]
    assert len(ids) == 20 and len(set(ids)) == 20
    labeled = set(pool.external_ids[:12])
    assert not set(ids) & labeled
    assert batch["progress"] == {"stage": "done", "done": 20, "total": 20}
    assert batch["attempts"] == 1 and batch["finished_at"] is not None
    timings = batch["diagnostics"]["timings"]
    assert batch["diagnostics"]["selection"]["strategy"] == strategy
    # the items are now reserved by this batch
    states = item_states(db, pool.pool_id)
    assert all(states[i] == ("reserved", batch["id"]) for i in ids)
    if strategy == "random":  # reads no model output: no head trained, no checkpoint
        assert {"load", "select", "store", "total"} <= set(timings) and "train" not in timings
        assert batch["checkpoint_id"] is None and batch["diagnostics"]["head"] is None
        assert client.get(f"/v1/pools/{pool.pool_id}/checkpoints", headers=auth).json()["checkpoints"] == []
        return
    assert {"load", "train", "embed", "select", "store", "total"} <= set(timings)
    if strategy == "bait":
        assert isinstance(batch["objective"], float)
    else:
        assert batch["objective"] is None
    # the checkpoint is stored and listed
    cps = client.get(f"/v1/pools/{pool.pool_id}/checkpoints", headers=auth).json()["checkpoints"]
    assert [c["id"] for c in cps] == [batch["checkpoint_id"]]
    assert cps[0]["round"] == 1 and cps[0]["n_labels"] == 12 and "weights" not in cps[0]
    assert cps[0]["metrics"]["n_train"] == 12
    listed = client.get(f"/v1/pools/{pool.pool_id}/batches", headers=auth).json()["batches"]
    assert [b["id"] for b in listed] == [batch["id"]]


def test_second_batch_counts_round_and_avoids_first_batch(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any
) -> None:
    pool = make_pool(db, n=100, n_labeled=10)
    first = post_batch(client, auth, pool.pool_id, size=30, strategy="coreset").json()
    run_jobs()
    second = post_batch(client, auth, pool.pool_id, size=30, strategy="coreset").json()
    run_jobs()
    a = get_batch(client, auth, pool.pool_id, first["id"])
    b = get_batch(client, auth, pool.pool_id, second["id"])
    assert a["status"] == b["status"] == "succeeded"
    assert not set(a["item_ids"]) & set(b["item_ids"])
    assert b["diagnostics"]["n_reserved_by_others"] == 30
    rounds = [
        c["round"] for c in client.get(f"/v1/pools/{pool.pool_id}/checkpoints", headers=auth).json()["checkpoints"]
    ]
    assert rounds == [2, 1]


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"size": 0, "strategy": "random"}, 400, "size must be at least 1"),
        ({"size": -3, "strategy": "random"}, 400, "size must be at least 1"),
        ({"size": 91, "strategy": "random"}, 400, "size 91 is more than the 90 item(s) available"),
        ({"size": 5, "strategy": "fancy"}, 400, "unknown strategy 'fancy'; valid strategies: auto, badge, bait,"),
        ({"size": 5, "strategy": "bait", "params": {"oversampel": 2}}, 400, "unknown parameter(s) 'oversampel'"),
        ({"size": 5, "strategy": "bait", "params": {"lam": "big"}}, 400, "'lam' of strategy 'bait' must be float"),
        (
            {"size": 5, "strategy": "random", "params": {"seed": -1}},
            400,
            "'seed' of strategy 'random' must be an integer in [0, 9223372036854775807]",
        ),
        ({"size": "five", "strategy": "random"}, 422, "size"),
    ],
)
def test_batch_request_validation_writes_nothing(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], body: dict[str, Any], status: int, message: str
) -> None:
    pool = make_pool(db, n=100, n_labeled=10)
    r = client.post(f"/v1/pools/{pool.pool_id}/batches", json=body, headers=auth)
    assert r.status_code == status, r.text
    assert message in r.json()["error"]["message"]
    if "available" in message:
        assert r.json()["error"]["details"] == {"available": 90}
    assert count_rows(db, Batch) == 0


def test_batch_rejects_strategy_not_for_pool_task(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session]
) -> None:
    pool = make_pool(db, n=60, n_labeled=5, task="regression")
    r = post_batch(client, auth, pool.pool_id, size=5, strategy="margin")
    assert r.status_code == 400
    assert r.json()["error"]["message"] == (
        "strategy 'margin' supports classification, not regression; "
        "strategies for regression: auto, bait, bait_nofisher, coreset, kmeanspp, random, typiclust"
    )
    assert count_rows(db, Batch) == 0


def test_regression_pool_batch_with_bait(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any
) -> None:
    pool = make_pool(db, n=80, n_labeled=8, task="regression")
    created = post_batch(client, auth, pool.pool_id, size=6, strategy="bait").json()
    run_jobs()
    batch = get_batch(client, auth, pool.pool_id, created["id"])
    assert batch["status"] == "succeeded", batch["error"]
    assert len(set(batch["item_ids"])) == 6 and not set(batch["item_ids"]) & set(pool.external_ids[:8])
    assert batch["diagnostics"]["selection"]["task"] == "regression"


def test_idempotency_key_returns_the_same_batch(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any
) -> None:
    pool = make_pool(db, n=60, n_labeled=5)
    headers = {**auth, "Idempotency-Key": "req-1"}
    body = {"size": 5, "strategy": "random", "params": {"seed": 3}}
    first = client.post(f"/v1/pools/{pool.pool_id}/batches", json=body, headers=headers)
    again = client.post(f"/v1/pools/{pool.pool_id}/batches", json=body, headers=headers)
    assert first.status_code == 202 and again.status_code == 200
    assert first.json()["id"] == again.json()["id"]
    assert again.headers["Location"] == first.headers["Location"]
    run_jobs()
    third = client.post(f"/v1/pools/{pool.pool_id}/batches", json=body, headers=headers)
    assert third.json()["id"] == first.json()["id"] and third.json()["status"] == "succeeded"
    assert count_rows(db, Batch) == 1
    other = client.post(f"/v1/pools/{pool.pool_id}/batches", json={**body, "size": 6}, headers=headers)
    assert other.status_code == 409
    assert "different batch request" in other.json()["error"]["message"]
    # a new key is a new batch
    fresh = client.post(f"/v1/pools/{pool.pool_id}/batches", json=body, headers={**auth, "Idempotency-Key": "req-2"})
    assert fresh.status_code == 202 and fresh.json()["id"] != first.json()["id"]


def test_concurrent_requests_with_one_idempotency_key_create_one_batch(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any
) -> None:
    pool = make_pool(db, n=60, n_labeled=5)
    headers = {**auth, "Idempotency-Key": "same"}
    results: list[Any] = []

    def post() -> None:
        results.append(
            client.post(f"/v1/pools/{pool.pool_id}/batches", json={"size": 4, "strategy": "random"}, headers=headers)
        )

    threads = [threading.Thread(target=post) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r.status_code in (200, 202) for r in results), [r.text for r in results]
    assert len({r.json()["id"] for r in results}) == 1
    run_jobs()
    assert count_rows(db, Batch) == 1


def test_other_tenant_gets_404(
    client: TestClient, auth: dict[str, str], other_auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any
) -> None:
    pool = make_pool(db, n=60, n_labeled=5)
    created = post_batch(client, auth, pool.pool_id, size=5, strategy="random").json()
    run_jobs()
    base = f"/v1/pools/{pool.pool_id}"
    assert client.get(f"{base}/batches/{created['id']}", headers=other_auth).status_code == 404
    assert client.get(f"{base}/batches", headers=other_auth).status_code == 404
    assert client.post(f"{base}/batches", json={"size": 1, "strategy": "random"}, headers=other_auth).status_code == 404
    assert client.post(f"{base}/batches/{created['id']}/cancel", headers=other_auth).status_code == 404
    assert client.get(f"{base}/checkpoints", headers=other_auth).status_code == 404
    r = client.post(f"{base}/predictions", json={"item_ids": ["item-00001"]}, headers=other_auth)
    assert r.status_code == 404
    assert get_batch(client, auth, pool.pool_id, created["id"])["status"] == "succeeded"
    assert count_rows(db, Batch) == 1


def test_unknown_batch_is_404(client: TestClient, auth: dict[str, str], db: sessionmaker[Session]) -> None:
    pool = make_pool(db, n=20, n_labeled=2)
    r = client.get(f"/v1/pools/{pool.pool_id}/batches/nope", headers=auth)
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


def test_failed_job_records_selection_error_verbatim_and_reserves_nothing(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any
) -> None:
    pool = make_pool(db, n=60, n_labeled=5)
    keep = reserve(db, pool.pool_id, pool.external_ids[10:15], seconds=3600)
    # A memory budget the web process accepts but the library's memory model refuses: only the job can tell
    # (5 labels are a cold start: opt out, so that BAIT itself runs).
    params = {"max_memory_gb": 1e-9, "cold_start": False}
    created = post_batch(client, auth, pool.pool_id, size=5, strategy="bait", params=params).json()
    run_jobs()
    batch = get_batch(client, auth, pool.pool_id, created["id"])
    assert batch["status"] == "failed"
    assert batch["error"].startswith("no BAIT plan fits max_memory_gb=1e-09") and "approx" in batch["error"]
    assert batch["item_ids"] is None and batch["checkpoint_id"] is None and batch["finished_at"] is not None
    states = item_states(db, pool.pool_id)
    assert not [i for i, (_, b) in states.items() if b == created["id"]]
    assert sorted(i for i, (st, b) in states.items() if b == keep) == pool.external_ids[10:15]  # untouched
    assert count_rows(db, Checkpoint) == 0
    # a failed batch cannot be cancelled
    r = client.post(f"/v1/pools/{pool.pool_id}/batches/{created['id']}/cancel", headers=auth)
    assert r.status_code == 409


def test_cancel_succeeded_batch_releases_its_items(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any
) -> None:
    pool = make_pool(db, n=30, n_labeled=10)
    created = post_batch(client, auth, pool.pool_id, size=20, strategy="random").json()
    run_jobs()
    # every unlabeled item is reserved now: nothing left to ask for
    r = post_batch(client, auth, pool.pool_id, size=1, strategy="random")
    assert r.status_code == 400 and "the 0 item(s) available" in r.json()["error"]["message"]
    r = client.post(f"/v1/pools/{pool.pool_id}/batches/{created['id']}/cancel", headers=auth)
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    assert r.json()["diagnostics"]["cancelled"] == {"from_status": "succeeded", "released_items": 20}
    states = item_states(db, pool.pool_id)
    assert sum(st == "unlabeled" and b is None for st, b in states.values()) == 20
    again = post_batch(client, auth, pool.pool_id, size=20, strategy="random")
    assert again.status_code == 202
    run_jobs()
    assert get_batch(client, auth, pool.pool_id, again.json()["id"])["status"] == "succeeded"


def test_cancel_running_batch_stops_it_and_reserves_nothing(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any
) -> None:
    # random labels and an epoch cap far away: training runs long enough to be cancelled mid-way
    pool = make_pool(db, n=400, d=16, n_labeled=300, head={"kind": "mlp", "max_epochs": 5000, "batch_size": 8})
    with session_scope(db) as s:
        for i, item in enumerate(s.execute(select(Item).where(Item.status == "labeled")).scalars()):
            item.label = ["ant", "bee", "cat"][(i * 7919) % 3]
    created = post_batch(client, auth, pool.pool_id, size=10, strategy="confidence").json()
    seen: list[dict[str, Any]] = []

    def cancel_when_training() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            b = get_batch(client, auth, pool.pool_id, created["id"])
            if b["status"] == "running" and b["progress"]["stage"] == "train" and b["progress"]["done"] > 0:
                seen.append(b)
                r = client.post(f"/v1/pools/{pool.pool_id}/batches/{created['id']}/cancel", headers=auth)
                seen.append(r.json())
                return
            time.sleep(0.05)

    canceller = threading.Thread(target=cancel_when_training)
    canceller.start()
    run_jobs()  # returns once the job has stopped
    canceller.join()
    assert seen, "the job never reported training progress"
    assert seen[1]["status"] == "cancelled"
    batch = get_batch(client, auth, pool.pool_id, created["id"])
    assert batch["status"] == "cancelled" and batch["item_ids"] is None and batch["checkpoint_id"] is None
    assert batch["progress"]["done"] < 5000  # it stopped during training
    assert not [i for i, (_, b) in item_states(db, pool.pool_id).items() if b == created["id"]]
    assert count_rows(db, Checkpoint) == 0


def _pool_through_the_api(client: TestClient, auth: dict[str, str], name: str) -> str:
    """A pool made, filled and labeled over HTTP; the same content whatever its name."""
    import numpy as np

    rng = np.random.default_rng(7)
    centers = rng.normal(size=(3, 6)) * 3
    y = np.arange(90) % 3
    X = centers[y] + rng.normal(size=(90, 6))
    body = {"name": name, "task": "classification", "classes": ["a", "b", "c"], "embedding_dim": 6}
    body["head"] = {"kind": "mlp", "hidden": 16, "max_epochs": 30}
    r = client.post("/v1/pools", json=body, headers=auth)
    assert r.status_code == 201, r.text
    pool_id: str = r.json()["id"]
    items = [{"id": f"x{i:03d}", "embedding": X[i].tolist()} for i in range(90)]
    assert client.post(f"/v1/pools/{pool_id}/items", json={"items": items}, headers=auth).status_code == 200
    # every 7th item: 13 labels, at least 4 per class (not a cold start, so BAIT runs on a trained head)
    labels = [{"item_id": f"x{i:03d}", "label": "abc"[y[i]]} for i in range(0, 90, 7)]
    assert client.put(f"/v1/pools/{pool_id}/labels", json={"labels": labels}, headers=auth).status_code == 200
    return pool_id


def test_same_pool_state_params_and_seed_give_the_same_picks(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any
) -> None:
    first, second = (_pool_through_the_api(client, auth, name) for name in ("twin-1", "twin-2"))
    # No seed in the request: the service draws one and stores it with the batch.
    drawn = post_batch(client, auth, first, size=8, strategy="bait", params={"oversample": 2})
    assert drawn.status_code == 202, drawn.text
    seed = drawn.json()["params"]["seed"]
    assert isinstance(seed, int) and seed >= 0
    # The twin pool, the same parameters and that seed given explicitly: the same picks.
    again = post_batch(client, auth, second, size=8, strategy="bait", params={"oversample": 2, "seed": seed})
    run_jobs()
    a = get_batch(client, auth, first, drawn.json()["id"])
    b = get_batch(client, auth, second, again.json()["id"])
    assert a["status"] == b["status"] == "succeeded", (a["error"], b["error"])
    assert a["params"] == b["params"] == {"oversample": 2, "seed": seed}
    assert a["item_ids"] == b["item_ids"]
    assert a["objective"] == pytest.approx(b["objective"], rel=1e-9)
    # Every seed the batch used is in its record: the head's training and the strategy's.
    assert a["diagnostics"]["seeds"] == b["diagnostics"]["seeds"] == {"train": seed, "select": seed}
    assert a["diagnostics"]["head"]["seed"] == seed


def test_drawn_seeds_differ_between_batches_and_an_idempotent_retry_keeps_its_seed(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any
) -> None:
    pool = make_pool(db, n=80, n_labeled=8)
    headers = {**auth, "Idempotency-Key": "seedless"}
    body = {"size": 4, "strategy": "random"}
    first = client.post(f"/v1/pools/{pool.pool_id}/batches", json=body, headers=headers)
    retry = client.post(f"/v1/pools/{pool.pool_id}/batches", json=body, headers=headers)
    assert first.status_code == 202 and retry.status_code == 200, retry.text
    assert retry.json()["id"] == first.json()["id"]
    assert retry.json()["params"]["seed"] == first.json()["params"]["seed"]
    seeds = {post_batch(client, auth, pool.pool_id, size=4, strategy="random").json()["params"]["seed"]}
    seeds |= {post_batch(client, auth, pool.pool_id, size=4, strategy="random").json()["params"]["seed"]}
    assert len(seeds | {first.json()["params"]["seed"]}) == 3
    run_jobs()
    done = get_batch(client, auth, pool.pool_id, first.json()["id"])
    assert done["diagnostics"]["seeds"] == {"train": None, "select": first.json()["params"]["seed"]}

"""Checkpoints listing and predictions from the latest checkpoint (a job, waited on synchronously)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from tests.service.test_batches import get_batch, post_batch
from tests.worker.factories import CLASSES, make_pool


def _while_jobs_run(run_jobs: Any, fn: Any) -> Any:
    """Call ``fn`` (an HTTP request that waits for a job) while the jobs run (RQ runs them in this thread)."""
    with ThreadPoolExecutor(1) as ex:
        fut = ex.submit(fn)
        run_jobs(until=fut.done)
        return fut.result()


def test_checkpoints_empty_then_one_per_batch(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any
) -> None:
    pool = make_pool(db, n=60, n_labeled=9, head={"kind": "mlp", "hidden": 16, "max_epochs": 30})
    r = client.get(f"/v1/pools/{pool.pool_id}/checkpoints", headers=auth)
    assert r.status_code == 200 and r.json() == {"checkpoints": []}
    ids = []
    for _ in range(2):
        ids.append(post_batch(client, auth, pool.pool_id, size=4, strategy="confidence").json()["id"])
        run_jobs()
    cps = client.get(f"/v1/pools/{pool.pool_id}/checkpoints", headers=auth).json()["checkpoints"]
    assert [c["round"] for c in cps] == [2, 1]
    assert [c["batch_id"] for c in cps] == ids[::-1]
    assert cps[0]["head"]["kind"] == "mlp" and cps[0]["head"]["hidden"] == 16 and cps[0]["head"]["input_dim"] == 8
    assert set(cps[0]) == {"id", "round", "n_labels", "metrics", "head", "batch_id", "created_at"}


def test_predictions_need_a_checkpoint(client: TestClient, auth: dict[str, str], db: sessionmaker[Session]) -> None:
    pool = make_pool(db, n=20, n_labeled=5)
    r = client.post(f"/v1/pools/{pool.pool_id}/predictions", json={"item_ids": ["item-00001"]}, headers=auth)
    assert r.status_code == 409 and "request a batch first" in r.json()["error"]["message"]


def test_predictions_reject_unknown_items(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any
) -> None:
    pool = make_pool(db, n=20, n_labeled=5)
    post_batch(client, auth, pool.pool_id, size=2, strategy="confidence")
    run_jobs()
    r = client.post(f"/v1/pools/{pool.pool_id}/predictions", json={"item_ids": ["item-00001", "nope"]}, headers=auth)
    assert r.status_code == 400 and "1 item id(s) not in pool" in r.json()["error"]["message"]
    assert r.json()["error"]["details"] == {"missing": ["nope"]}


def test_predictions_give_class_probabilities_of_latest_checkpoint(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any
) -> None:
    pool = make_pool(db, n=120, n_labeled=60, head={"kind": "linear", "max_epochs": 300})
    created = post_batch(client, auth, pool.pool_id, size=5, strategy="confidence").json()
    run_jobs()
    batch = get_batch(client, auth, pool.pool_id, created["id"])
    asked = pool.external_ids[60:120]
    r = _while_jobs_run(
        run_jobs, lambda: client.post(f"/v1/pools/{pool.pool_id}/predictions", json={"item_ids": asked}, headers=auth)
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["checkpoint_id"] == batch["checkpoint_id"] and body["round"] == 1
    preds = body["predictions"]
    assert [p["item_id"] for p in preds] == asked
    for p in preds:
        assert set(p["probs"]) == set(CLASSES)
        assert abs(sum(p["probs"].values()) - 1.0) < 1e-5
        assert p["label"] == max(p["probs"], key=p["probs"].get)
    # well-separated blobs: the head trained on 60 labels gets held-out items right
    truth = [CLASSES[int(c)] for c in pool.y[60:120]]
    accuracy = np.mean([p["label"] == t for p, t in zip(preds, truth, strict=True)])
    assert accuracy >= 0.9


def test_predictions_of_regression_pool_give_targets(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any
) -> None:
    pool = make_pool(db, n=40, n_labeled=20, task="regression")
    post_batch(client, auth, pool.pool_id, size=3, strategy="coreset")
    run_jobs()
    r = _while_jobs_run(
        run_jobs,
        lambda: client.post(f"/v1/pools/{pool.pool_id}/predictions", json={"item_ids": ["item-00030"]}, headers=auth),
    )
    assert r.status_code == 200, r.text
    (pred,) = r.json()["predictions"]
    assert pred["item_id"] == "item-00030" and len(pred["target"]) == 1 and np.isfinite(pred["target"][0])

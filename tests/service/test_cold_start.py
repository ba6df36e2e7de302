"""Cold start through the service: a model-based batch on a pool with too few labels runs typiclust on the
embeddings, trains no head and says so in the batch; the rule's boundary, the opt-out, regression, the 400s
and the strategies endpoint. Runs on SQLite and PostgreSQL, and through a real RQ worker with Redis."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from service.db import session_scope
from service.domain.keys import create_key
from service.store.models import Batch, Checkpoint
from tests.service.test_batches import count_rows, get_batch, post_batch
from tests.service.test_web import _sign_in
from tests.worker.factories import CLASSES, label_items, make_pool

WARM = {"bait", "badge", "margin", "random"}


def run_batch(client: TestClient, auth: dict[str, str], run_jobs: Any, pool_id: str, **body: Any) -> dict[str, Any]:
    r = post_batch(client, auth, pool_id, **body)
    assert r.status_code == 202, r.text
    run_jobs()
    batch = get_batch(client, auth, pool_id, r.json()["id"])
    assert batch["status"] == "succeeded", batch["error"]
    return batch


def labeled_pool(db: sessionmaker[Session], per_class: list[int], n: int = 120) -> Any:
    """A 3-class pool whose first items are labeled ``per_class[c]`` times with class ``c``."""
    pool = make_pool(db, n=n, n_labeled=0)
    y: dict[str, int] = {}
    row = 0
    for c, count in enumerate(per_class):
        for _ in range(count):
            y[pool.external_ids[row]] = c
            row += 1
    if y:
        label_items(db, pool.pool_id, list(y), y)
    return pool


@pytest.mark.parametrize("strategy", ["bait", "badge", "margin"])
def test_no_labels_model_based_strategy_runs_cold_start_and_says_so(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any, strategy: str
) -> None:
    pool = make_pool(db, n=120, n_labeled=0)
    batch = run_batch(client, auth, run_jobs, pool.pool_id, size=6, strategy=strategy)
    diag = batch["diagnostics"]
    assert batch["strategy"] == strategy  # what was asked for stays on record
    assert diag["strategy_requested"] == strategy
    assert diag["strategy_used"] == "typiclust"
    assert diag["selection"]["strategy"] == "typiclust"
    assert diag["cold_start"] == {
        "rule": "fewer than 2 labels per class (n_labels < 2 * k) or a class with no label",
        "n_labels": 0,
        "threshold": 6,
        "classes_without_label": CLASSES,
    }
    assert diag["note"].startswith("cold start: the pool has 0 label(s) and none for class(es) ant, bee, cat")
    assert "chosen by 'typiclust'" in diag["note"] and f"later batches use {strategy!r}" in diag["note"]
    # no head was trained on nothing: no checkpoint, no head metrics, no training seed
    assert batch["checkpoint_id"] is None and diag["head"] is None and "train" not in diag["timings"]
    assert diag["seeds"]["train"] is None
    assert count_rows(db, Checkpoint) == 0
    assert len(set(batch["item_ids"])) == 6


def test_annotation_tool_key_reads_which_strategy_ran(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any
) -> None:
    pool = make_pool(db, n=60, n_labeled=0)
    created = run_batch(client, auth, run_jobs, pool.pool_id, size=4, strategy="bait")
    with session_scope(db) as s:
        tool_key, _ = create_key(s, "acme", name="labeling-tool", scopes=("read", "label"))
    batch = get_batch(client, {"Authorization": f"Bearer {tool_key}"}, pool.pool_id, created["id"])
    assert batch["diagnostics"]["strategy_used"] == "typiclust"
    assert "this batch was chosen by 'typiclust'" in batch["diagnostics"]["note"]
    # and on the dashboard: the batch list shows what ran, the batch page says why
    _sign_in(client, tool_key)
    table = client.get(f"/ui/pools/{pool.pool_id}/batches-fragment").text
    assert "bait → typiclust" in table and "(cold start)" in table
    page = client.get(f"/ui/pools/{pool.pool_id}/batches/{created['id']}").text
    assert 'id="strategy-note"' in page and "this batch was chosen by &#39;typiclust&#39;" in page


def test_opt_out_runs_the_requested_strategy_on_an_untrained_head(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any
) -> None:
    pool = make_pool(db, n=120, n_labeled=0)
    batch = run_batch(client, auth, run_jobs, pool.pool_id, size=6, strategy="bait", params={"cold_start": False})
    diag = batch["diagnostics"]
    assert diag["strategy_requested"] == diag["strategy_used"] == "bait"
    assert diag["cold_start"] is None and "note" not in diag
    assert diag["selection"]["strategy"] == "bait"
    assert batch["params"]["cold_start"] is False
    assert batch["checkpoint_id"] is not None and diag["head"]["stop_reason"] == "no_data"


def test_explicit_true_is_the_default(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any
) -> None:
    pool = make_pool(db, n=60, n_labeled=0)
    batch = run_batch(client, auth, run_jobs, pool.pool_id, size=3, strategy="bait", params={"cold_start": True})
    assert batch["diagnostics"]["strategy_used"] == "typiclust"


@pytest.mark.parametrize(
    ("per_class", "cold", "missing"),
    [
        ([2, 2, 2], False, None),  # exactly 2 per class = 2k: a model
        ([2, 2, 1], True, []),  # 5 < 6
        ([4, 3, 0], True, ["cat"]),  # 7 >= 6 but a class without a label
        ([1, 1, 1], True, []),
        ([10, 10, 10], False, None),
    ],
)
def test_threshold_boundary(
    client: TestClient,
    auth: dict[str, str],
    db: sessionmaker[Session],
    run_jobs: Any,
    per_class: list[int],
    cold: bool,
    missing: list[str] | None,
) -> None:
    pool = labeled_pool(db, per_class)
    batch = run_batch(client, auth, run_jobs, pool.pool_id, size=5, strategy="bait")
    diag = batch["diagnostics"]
    assert diag["strategy_used"] == ("typiclust" if cold else "bait")
    if cold:
        assert diag["cold_start"]["n_labels"] == sum(per_class)
        assert diag["cold_start"]["threshold"] == 6
        assert diag["cold_start"]["classes_without_label"] == missing
        assert batch["checkpoint_id"] is None
    else:
        assert diag["cold_start"] is None
        assert batch["checkpoint_id"] is not None
    assert not set(batch["item_ids"]) & set(pool.external_ids[: sum(per_class)])


@pytest.mark.parametrize(
    ("per_class", "cold"), [([2, 2, 2], False), ([2, 2, 1], True), ([4, 3, 0], True), ([10, 10, 10], False)]
)
def test_auto_is_cold_exactly_where_a_fixed_bait_is_cold_started(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any, per_class: list[int], cold: bool
) -> None:
    """auto (the library's rule would call every one of these pools warm: it has the head's probs) gets the service's
    cold-start rule, the one its fixed bait obeys: model-free arms exactly where bait is replaced by typiclust."""
    pool = labeled_pool(db, per_class)
    fixed = run_batch(client, auth, run_jobs, pool.pool_id, size=5, strategy="bait")
    client.post(f"/v1/pools/{pool.pool_id}/batches/{fixed['id']}/cancel", headers=auth)
    auto = run_batch(client, auth, run_jobs, pool.pool_id, size=5, strategy="auto", params={"seed": 1})
    assert (fixed["diagnostics"]["strategy_used"] == "typiclust") is cold
    assert auto["diagnostics"]["auto"]["cold"] is cold
    assert auto["diagnostics"]["auto"]["arm"] in ({"typiclust", "kmeanspp", "random"} if cold else WARM)
    assert (auto["checkpoint_id"] is None) is cold  # no head trained while cold, as for the fixed strategy
    assert auto["diagnostics"]["cold_start"] == fixed["diagnostics"]["cold_start"]


def test_regression_cold_only_without_labels(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any
) -> None:
    cold = make_pool(db, n=80, n_labeled=0, task="regression", name="cold")
    batch = run_batch(client, auth, run_jobs, cold.pool_id, size=5, strategy="bait")
    assert batch["diagnostics"]["strategy_used"] == "kmeanspp"  # spread-out items for a regression fit
    assert batch["diagnostics"]["selection"]["strategy"] == "kmeanspp" and batch["checkpoint_id"] is None
    assert batch["diagnostics"]["cold_start"] == {"rule": "no label (n_labels < 1)", "n_labels": 0, "threshold": 1}
    assert "the pool has 0 label(s), fewer than 1" in batch["diagnostics"]["note"]
    warm = make_pool(db, n=80, n_labeled=1, task="regression", name="warm")
    batch = run_batch(client, auth, run_jobs, warm.pool_id, size=5, strategy="bait")
    assert batch["diagnostics"]["strategy_used"] == "bait" and batch["diagnostics"]["cold_start"] is None


@pytest.mark.parametrize("strategy", ["typiclust", "kmeanspp"])
def test_model_free_strategies_requested_directly_train_nothing(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any, strategy: str
) -> None:
    pool = make_pool(db, n=90, n_labeled=12)
    batch = run_batch(client, auth, run_jobs, pool.pool_id, size=4, strategy=strategy, params={"seed": 3})
    diag = batch["diagnostics"]
    assert diag["strategy_requested"] == diag["strategy_used"] == strategy
    assert diag["cold_start"] is None
    assert batch["checkpoint_id"] is None
    assert not set(batch["item_ids"]) & set(pool.external_ids[:12])


def test_warm_pool_records_the_strategy_that_ran(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any
) -> None:
    pool = make_pool(db, n=90, n_labeled=30)
    batch = run_batch(client, auth, run_jobs, pool.pool_id, size=4, strategy="random")
    assert batch["diagnostics"]["strategy_requested"] == batch["diagnostics"]["strategy_used"] == "random"
    assert batch["diagnostics"]["cold_start"] is None


@pytest.mark.parametrize(
    ("strategy", "params", "message"),
    [
        ("random", {"cold_start": False}, "strategy 'random' reads no model and is never replaced"),
        ("coreset", {"cold_start": True}, "strategy 'coreset' reads no model"),
        ("typiclust", {"cold_start": False}, "strategy 'typiclust' reads no model"),
        ("bait", {"cold_start": "no"}, "params.cold_start must be true or false, got 'no'"),
        ("bait", {"cold_start": 0}, "params.cold_start must be true or false, got 0"),
        ("typiclust", {"knn": 0}, "parameter 'knn' of strategy 'typiclust' must be an integer in [1, 1000]"),
        ("typiclust", {"kmeans_sample": 10**9}, "must be an integer in [1, 1000000]"),
    ],
)
def test_cold_start_param_where_it_makes_no_sense_is_a_400(
    client: TestClient,
    auth: dict[str, str],
    db: sessionmaker[Session],
    strategy: str,
    params: dict[str, Any],
    message: str,
) -> None:
    pool = make_pool(db, n=40, n_labeled=0)
    r = post_batch(client, auth, pool.pool_id, size=3, strategy=strategy, params=params)
    assert r.status_code == 400, r.text
    assert message in r.json()["error"]["message"]
    assert count_rows(db, Batch) == 0


def test_select_endpoint_refuses_cold_start_and_runs_typiclust(
    client: TestClient, auth: dict[str, str], run_jobs: Any
) -> None:
    emb = [[float(i % 7), float(i // 7)] for i in range(40)]
    body = {
        "strategy": "bait",
        "batch_size": 2,
        "task": "regression",
        "embeddings": emb,
        "params": {"cold_start": True},
    }
    r = client.post("/v1/select", json=body, headers=auth)
    assert r.status_code == 400
    assert "params.cold_start applies to pool batches only" in r.json()["error"]["message"]
    assert "'kmeanspp' or 'typiclust'" in r.json()["error"]["message"]
    for name in ("typiclust", "kmeanspp"):
        body = {"strategy": name, "batch_size": 3, "task": "classification", "embeddings": emb, "params": {"seed": 1}}
        r = client.post("/v1/select", json=body, headers=auth)
        assert r.status_code in (200, 202), r.text
        if r.status_code == 202:  # answered as a job (with Redis, the RQ worker runs it here)
            run_jobs()
            r = client.get(f"/v1/select/{r.json()['id']}", headers=auth)
        out = r.json()
        assert out["status"] == "succeeded", out
        assert len(set(out["indices"])) == 3 and out["diagnostics"]["strategy"] == name


def test_strategies_endpoint_documents_the_rule(client: TestClient, auth: dict[str, str]) -> None:
    r = client.get("/v1/strategies", headers=auth)
    assert r.status_code == 200
    body = r.json()
    names = {s["name"]: s for s in body["strategies"]}
    assert {"typiclust", "kmeanspp"} <= set(names)
    assert names["typiclust"]["params"]["knn"] == {"type": "int", "default": 20}
    assert names["typiclust"]["tasks"] == ["classification", "regression"]
    rule = body["cold_start"]
    assert rule["strategy"] == {"classification": "typiclust", "regression": "kmeanspp"}
    assert rule["applies_to"] == [
        "badge", "bait", "bait_nofisher", "confidence", "entropy", "logdet_fisher", "logdet_rank1", "margin",
    ]  # fmt: skip
    assert rule["rule"]["classification"].startswith("fewer than 2 labels per class")
    assert rule["rule"]["regression"] == "no label (n_labels < 1)"
    assert "params.cold_start = false" in rule["opt_out"]
    assert rule["evidence"] == "docs/results/cold_start"


def test_learning_curve_names_the_strategy_that_picked_the_labels(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any
) -> None:
    pool = make_pool(db, n=120, n_labeled=0)
    first = run_batch(client, auth, run_jobs, pool.pool_id, size=9, strategy="bait", params={"seed": 1})
    assert first["diagnostics"]["strategy_used"] == "typiclust"
    # label the cold-start batch with labels that cover every class twice (the blob of each item decides)
    y = {i: c for i, c in zip(first["item_ids"], [0, 1, 2] * 3, strict=True)}
    label_items(db, pool.pool_id, list(y), y)
    second = run_batch(client, auth, run_jobs, pool.pool_id, size=5, strategy="bait", params={"seed": 2})
    assert second["diagnostics"]["strategy_used"] == "bait" and second["checkpoint_id"] is not None
    points = client.get(f"/v1/pools/{pool.pool_id}/curve", headers=auth).json()["points"]
    assert len(points) == 1  # the cold-start batch trained no head
    assert points[0]["n_labels"] == 9
    assert points[0]["strategy"] == "typiclust"  # what chose the 9 labels, not what was asked for
    assert points[0]["trained_for"] == {"batch_id": second["id"], "strategy": "bait"}

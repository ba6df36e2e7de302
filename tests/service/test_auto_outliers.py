"""strategy "auto" and the outlier check through the REST API: the choice and its evidence in the batch and on
the dashboard, the history read from the pool's earlier auto batches, the cold arms, outliers flagged and
excluded, the 400s a newcomer meets, and nothing given away across tenants. SQLite and PostgreSQL."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from selection.auto import GAMMA, bandit
from service.db import session_scope
from service.store.models import Batch, Item
from tests.service.test_batches import count_rows, get_batch, post_batch
from tests.service.test_select_endpoint import _post as post_select
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


def label_batch(db: sessionmaker[Session], pool: Any, batch: dict[str, Any]) -> None:
    ids = batch["item_ids"]
    label_items(db, pool.pool_id, ids, {e: int(pool.y[pool.external_ids.index(e)]) for e in ids})


def test_auto_rounds_record_choice_evidence_and_history(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any
) -> None:
    pool = make_pool(db, n=200, n_labeled=12)
    first = run_batch(client, auth, run_jobs, pool.pool_id, size=10, strategy="auto", params={"seed": 3})
    auto = first["diagnostics"]["auto"]
    assert first["strategy"] == "auto" and auto["cold"] is False
    assert auto["arm"] in WARM and first["diagnostics"]["strategy_used"] == auto["arm"]
    # no evidence yet: the prior's start (selection.auto: bait PRIOR_BAIT, the rest shared), what the library gives
    start, _ = bandit([], tuple(sorted(WARM)), GAMMA, "classification")
    assert auto["probabilities"] == pytest.approx(start) and start["bait"] > 0.8
    assert auto["evidence"]["rounds"] == 0 and auto["summary"].startswith(f"{auto['arm']} chosen:")
    rnd = auto["round"]
    assert len(rnd["arms"]) == 10 and rnd["n_labels"] == 12
    assert all(isinstance(p, int) for p in rnd["predictions"])  # the model's classes at selection time
    assert first["checkpoint_id"] is not None  # a warm auto batch trains the head like any model-based one
    assert first["outliers"] == []  # checked, none flagged on Gaussian blobs

    label_batch(db, pool, first)
    second = run_batch(client, auth, run_jobs, pool.pool_id, size=10, strategy="auto", params={"seed": 4})
    assert second["diagnostics"]["auto"]["evidence"]["rounds"] == 1
    assert second["diagnostics"]["auto"]["evidence"]["rounds_scored"] == 0  # rewards arrive one round late
    label_batch(db, pool, second)
    # a batch of another strategy in between is not a round of the bandit
    run_batch(client, auth, run_jobs, pool.pool_id, size=5, strategy="random")
    third = run_batch(client, auth, run_jobs, pool.pool_id, size=10, strategy="auto", params={"seed": 5})
    ev = third["diagnostics"]["auto"]["evidence"]
    assert ev["rounds"] == 2 and ev["rounds_scored"] == 1
    assert ev["mode"] == "importance_weighted_accuracy"  # the pool has no validation items
    scored_arm = first["diagnostics"]["auto"]["arm"]
    assert 0.0 <= ev["per_arm"][scored_arm]["reward"] <= 1.0


def test_auto_on_a_cold_pool_plays_model_free_arms(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any
) -> None:
    pool = make_pool(db, n=120, n_labeled=0)
    batch = run_batch(client, auth, run_jobs, pool.pool_id, size=6, strategy="auto")
    auto = batch["diagnostics"]["auto"]
    assert auto["cold"] is True and auto["arm"] in {"typiclust", "kmeanspp", "random"}
    assert batch["diagnostics"]["cold_start"]["n_labels"] == 0
    assert batch["checkpoint_id"] is None  # no head trained on nothing


def corrupt(db: sessionmaker[Session], pool: Any, row: int, factor: float = 1e3) -> str:
    ext = pool.external_ids[row]
    blob = (pool.X[row] * factor).astype("<f4").tobytes()
    with session_scope(db) as s:
        s.execute(update(Item).where(Item.pool_id == pool.pool_id, Item.external_id == ext).values(embedding=blob))
    return ext


def test_corrupt_row_bait_picks_is_flagged_and_excluded_on_request(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any
) -> None:
    # regression, as on diamonds: BAIT's Fisher x x^T is largest at the corrupt row (a classifier saturates there)
    pool = make_pool(db, n=150, n_labeled=12, task="regression")
    bad = corrupt(db, pool, 100)
    flagged = run_batch(client, auth, run_jobs, pool.pool_id, size=8, strategy="bait", params={"seed": 1})
    assert bad in flagged["item_ids"]  # BAIT's pull towards extreme inputs
    assert flagged["outliers"] == [bad]
    info = flagged["diagnostics"]["outliers"]
    assert info["checked"] is True and info["excluded"] is False and info["c"] == 5.0
    assert [i["item_id"] for i in info["items"]] == [bad] and info["items"][0]["distance"] > info["threshold"]
    client.post(f"/v1/pools/{pool.pool_id}/batches/{flagged['id']}/cancel", headers=auth)

    kept = run_batch(
        client, auth, run_jobs, pool.pool_id, size=8, strategy="bait", params={"seed": 1, "exclude_outliers": True}
    )
    assert bad not in kept["item_ids"] and len(set(kept["item_ids"])) == 8  # the batch keeps its size
    assert kept["outliers"] == [] and kept["params"]["exclude_outliers"] is True
    info = kept["diagnostics"]["outliers"]
    assert info["excluded"] is True and info["n_excluded"] >= 1 and bad in info["excluded_items"]


def test_auto_leaves_the_corrupt_row_out_when_asked(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any
) -> None:
    """A newcomer asks for auto on the pool where bait picks a corrupt row: by default auto plays bait on the whole
    pool and the row is picked and flagged, as for a fixed bait; with exclude_outliers true auto plays bait on the
    pool without it (the batch's one outlier check), and both diagnostics say what was left out."""
    pool = make_pool(db, n=150, n_labeled=12, task="regression")
    bad = corrupt(db, pool, 100)
    kept = run_batch(client, auth, run_jobs, pool.pool_id, size=8, strategy="auto", params={"seed": 1})
    assert kept["diagnostics"]["auto"]["arm"] == "bait" and "exclude_outliers" not in kept["params"]
    assert bad in kept["item_ids"] and kept["outliers"] == [bad]
    assert kept["diagnostics"]["outliers"]["excluded"] is False
    assert kept["diagnostics"]["auto"]["outliers"]["excluded"] is False
    client.post(f"/v1/pools/{pool.pool_id}/batches/{kept['id']}/cancel", headers=auth)

    batch = run_batch(
        client, auth, run_jobs, pool.pool_id, size=8, strategy="auto", params={"seed": 1, "exclude_outliers": True}
    )
    auto = batch["diagnostics"]["auto"]
    assert auto["arm"] == "bait" and batch["diagnostics"]["strategy_used"] == "bait"
    assert bad not in batch["item_ids"] and len(set(batch["item_ids"])) == 8
    assert batch["outliers"] == [] and batch["params"]["exclude_outliers"] is True
    info = batch["diagnostics"]["outliers"]
    assert info["excluded"] is True and info["n_excluded"] >= 1 and bad in info["excluded_items"]
    assert auto["outliers"]["excluded"] is True and auto["outliers"]["n_excluded"] == info["n_excluded"]
    assert auto["round"]["picks"] == [pool.external_ids.index(e) for e in batch["item_ids"]]  # rows of the pool


def test_select_endpoint_auto_checks_the_embeddings_sent(
    client: TestClient, auth: dict[str, str], run_jobs: Any
) -> None:
    """POST /v1/select runs the library's auto, whose check reads the embeddings sent (off by default, true turns it
    on); exclude_outliers stays a pool-batch parameter for the other strategies."""
    X = np.random.default_rng(0).normal(size=(40, 3))
    X[5] *= 1e3
    body: dict[str, Any] = {"strategy": "auto", "batch_size": 4, "embeddings": X.tolist(), "labeled": [0]}
    body.update(task="regression", params={"seed": 3, "exclude_outliers": True})
    r = post_select(client, run_jobs, json=body, headers=auth)
    assert r.status_code == 200, r.text
    out = r.json()["diagnostics"]["auto"]["outliers"]
    assert out["excluded_rows"] == [5] and 5 not in r.json()["indices"]
    body["params"] = {"seed": 3}
    r = post_select(client, run_jobs, json=body, headers=auth)
    assert r.status_code == 200, r.text
    assert r.json()["diagnostics"]["auto"]["outliers"] == {"checked": False}
    body.update(strategy="bait", params={"exclude_outliers": True})
    r = client.post("/v1/select", json=body, headers=auth)
    assert r.status_code == 400 and "pool batches only" in r.json()["error"]["message"]


def test_dashboard_names_outliers_and_the_auto_choice(
    client: TestClient, auth: dict[str, str], api_key: str, db: sessionmaker[Session], run_jobs: Any
) -> None:
    # regression, as on diamonds: BAIT's Fisher x x^T is largest at the corrupt row (a classifier saturates there)
    pool = make_pool(db, n=150, n_labeled=12, task="regression")
    bad = corrupt(db, pool, 100)
    flagged = run_batch(client, auth, run_jobs, pool.pool_id, size=8, strategy="bait", params={"seed": 1})
    chosen = run_batch(client, auth, run_jobs, pool.pool_id, size=5, strategy="auto", params={"seed": 2})
    _sign_in(client, api_key)
    page = client.get(f"/ui/pools/{pool.pool_id}/batches/{flagged['id']}").text
    assert 'id="outliers-note"' in page and f"<code>{bad}</code>" in page
    assert f'data-item="{bad}" data-status="reserved" data-outlier="true"' in page
    page = client.get(f"/ui/pools/{pool.pool_id}/batches/{chosen['id']}").text
    assert 'id="auto-choice"' in page and chosen["diagnostics"]["auto"]["summary"] in page


@pytest.mark.parametrize(
    ("strategy", "params", "match"),
    [
        ("bait", {"exclude_outliers": "yes"}, "params.exclude_outliers must be true or false"),
        ("auto", {"exclude_outliers": "yes"}, "params.exclude_outliers must be true or false"),
        ("auto", {"exclude_outliers": None}, "params.exclude_outliers must be true or false"),
        ("auto", {"outlier_embeddings": [[0.0] * 8] * 60}, "takes per-row arrays"),
        ("auto", {"history": []}, "built by the service on a pool batch"),
        ("auto", {"cold": True}, "built by the service on a pool batch"),
        ("auto", {"cold_start": False}, "does not apply to strategy 'auto'"),
        ("auto", {"explore": 2}, "must be a number in \\[0, 1\\]"),
        ("auto", {"gamma": 0}, "must be a number in \\(0, 1\\]"),
        ("auto", {"explore": "lots"}, "must be float"),
        ("auto", {"explore_validated": 1.5}, "must be a number in \\[0, 1\\]"),
        ("auto", {"explore_validated": "none"}, "must be float"),
    ],
)
def test_newcomer_gets_a_clear_400_and_nothing_is_written(
    client: TestClient,
    auth: dict[str, str],
    db: sessionmaker[Session],
    strategy: str,
    params: dict[str, Any],
    match: str,
) -> None:
    pool = make_pool(db, n=60)
    r = post_batch(client, auth, pool.pool_id, size=4, strategy=strategy, params=params)
    assert r.status_code == 400, r.text
    assert re.search(match, r.json()["error"]["message"]), r.json()
    assert count_rows(db, Batch) == 0


@pytest.mark.parametrize(
    ("params", "match"),
    [
        ({"history": "bait"}, "must be a list of rounds"),
        ({"history": [{"arm": "bait"}]}, "entry 0 lacks arms, picks, labels, probabilities"),
        ({"history": [{"arm": "x", "arms": [], "picks": [], "labels": [], "probabilities": {}}]}, "unknown arm 'x'"),
        (
            {"history": [{"arm": "bait", "arms": ["bait"], "picks": [0, 1], "labels": [1], "probabilities": {}}]},
            "one entry per pick",
        ),
        ({"exclude_outliers": "yes"}, "parameter 'exclude_outliers' of strategy 'auto' must be bool"),
        ({"outlier_embeddings": [[0.0]] * 30}, "takes per-row arrays"),
    ],
)
def test_select_endpoint_refuses_malformed_history(
    client: TestClient, auth: dict[str, str], params: dict[str, Any], match: str
) -> None:
    X = np.random.default_rng(0).normal(size=(30, 3)).tolist()
    body = {"strategy": "auto", "batch_size": 3, "embeddings": X, "labeled": [], "params": params}
    r = client.post("/v1/select", json=body, headers=auth)
    assert r.status_code == 400, r.text
    assert match in r.json()["error"]["message"]


def test_auto_on_another_tenants_pool_gives_nothing_away(
    client: TestClient, auth: dict[str, str], other_auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any
) -> None:
    pool = make_pool(db, n=80)
    mine = run_batch(client, auth, run_jobs, pool.pool_id, size=4, strategy="auto")
    missing = client.post(
        "/v1/pools/nope/batches", json={"size": 4, "strategy": "auto", "params": {}}, headers=other_auth
    )
    for body in ({"size": 4, "strategy": "auto", "params": {}}, {"size": 4, "strategy": "auto", "params": {"x": 1}}):
        r = client.post(f"/v1/pools/{pool.pool_id}/batches", json=body, headers=other_auth)
        assert r.status_code == 404 and r.json()["error"]["message"] == missing.json()["error"]["message"].replace(
            "'nope'", repr(pool.pool_id)
        )
    r = client.get(f"/v1/pools/{pool.pool_id}/batches/{mine['id']}", headers=other_auth)
    assert r.status_code == 404 and "auto" not in r.text and mine["item_ids"][0] not in r.text
    assert count_rows(db, Batch) == 1
    assert CLASSES  # the pool's classes are not in any answer to the other tenant


def test_validation_items_make_auto_report_gains_per_100_labels(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any
) -> None:
    pool = make_pool(db, n=200, n_labeled=12)
    held = pool.external_ids[150:]
    with session_scope(db) as s:
        for ext in held:
            label = CLASSES[int(pool.y[pool.external_ids.index(ext)])]
            s.execute(
                update(Item)
                .where(Item.pool_id == pool.pool_id, Item.external_id == ext)
                .values(split="validation", status="labeled", label=label)
            )
    batches = []
    for seed in (1, 2, 3):
        batch = run_batch(client, auth, run_jobs, pool.pool_id, size=10, strategy="auto", params={"seed": seed})
        assert not set(batch["item_ids"]) & set(held)  # validation items are never picked
        assert batch["diagnostics"]["auto"]["round"]["validation"] is not None  # the checkpoint's accuracy
        label_batch(db, pool, batch)
        batches.append(batch)
    auto = batches[-1]["diagnostics"]["auto"]
    ev = auto["evidence"]
    assert ev["mode"] == "validation" and ev["rounds_scored"] == 1
    first = batches[0]["diagnostics"]["auto"]["round"]
    second = batches[1]["diagnostics"]["auto"]["round"]
    gain = 100 * (second["validation"] - first["validation"]) * 100 / (second["n_labels"] - first["n_labels"])
    assert ev["per_arm"][first["arm"]]["gain_per_100_labels"] == pytest.approx(gain)
    assert "points of validation accuracy per 100 labels" in auto["summary"] or "no evidence" in auto["summary"]
    # uniform picks feed the importance-weighted reward only: one of ten before validation gains steer, none after
    # (params.explore_validated, default 0), unless the caller asks for some
    for b, want in zip(batches, (1, 1, 0), strict=True):
        d = b["diagnostics"]["auto"]
        assert d["explore"] == (0 if d["arm"] == "random" else want), d
    asked = run_batch(
        client, auth, run_jobs, pool.pool_id, size=10, strategy="auto", params={"seed": 3, "explore_validated": 0.3}
    )["diagnostics"]["auto"]
    assert asked["evidence"]["mode"] == "validation"
    assert asked["explore"] == (0 if asked["arm"] == "random" else 3)
    assert asked["round"]["arms"].count("random") >= 3


def test_select_endpoint_runs_auto_with_the_callers_history(
    client: TestClient, auth: dict[str, str], run_jobs: Any
) -> None:
    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 3))
    P = np.full((40, 2), 0.5)
    P[:, 0] = 1 / (1 + np.exp(-X[:, 0]))
    P[:, 1] = 1 - P[:, 0]
    q = {"bait": 0.25, "badge": 0.25, "margin": 0.25, "random": 0.25}
    rnd = {"arm": "bait", "arms": ["bait", "random"], "picks": [0, 1], "labels": [1, 0], "probabilities": q}
    body = {
        "strategy": "auto",
        "batch_size": 4,
        "embeddings": X.tolist(),
        "probs": P.tolist(),
        "labeled": list(range(6)),
        "params": {"seed": 3, "history": [rnd, {**rnd, "predictions": [1, 1]}]},
    }
    r = post_select(client, run_jobs, json=body, headers=auth)
    assert r.status_code == 200, r.text
    auto = r.json()["diagnostics"]["auto"]
    assert auto["evidence"]["rounds"] == 2 and auto["evidence"]["rounds_scored"] == 1
    assert auto["evidence"]["per_arm"]["bait"]["reward"] == 0.0  # the uniform pick after bait was mispredicted
    body["params"]["history"][1] = {**rnd, "probabilities": {"bait": 2.0}}  # shape fine, values not: the library
    r = post_select(client, run_jobs, json=body, headers=auth)
    assert r.status_code == 400, r.text
    assert "history[1].probabilities['bait'] must be in (0, 1], got 2.0" in r.json()["error"]["message"]

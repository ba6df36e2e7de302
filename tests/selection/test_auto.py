"""The ``auto`` strategy: reproducible rounds, exploration picks, the bandit moving towards the arm whose
rounds pay, the validation-gains evidence line, cold arms (the library's rule: cold only when the model arms
cannot run), the outliers left out before the arm selects, and the history's and parameters' validation."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from selection import STRATEGIES, InputDataError, ParameterError, select
from selection.auto import ALL_ARMS, COLD_ARMS, READS_EVERY_ROW, WARM_ARMS, bandit, check_history, without_rows
from selection.outliers import robust_outliers
from selection.problem import REGISTRY
from selection.validation import build_problem


def pool(n: int = 300, d: int = 5, k: int = 3, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    W = rng.normal(size=(d, k))
    logits = X @ W
    P = np.exp(logits - logits.max(1, keepdims=True))
    return X, P / P.sum(1, keepdims=True), logits.argmax(1)


def a_round(
    arm: str, q: dict[str, float], hits: list[bool], *, val: float | None = None, n: int | None = None
) -> dict[str, Any]:
    """A labeled round: two exploration picks (arm random) whose predictions are right where ``hits`` says."""
    m = len(hits)
    return {
        "arm": arm,
        "arms": [arm] * (m - 2) + ["random"] * 2,
        "picks": list(range(m)),
        "labels": [1] * m,
        "predictions": [1 if h else 0 for h in hits],
        "probabilities": q,
        "validation": val,
        "n_labels": n,
    }


def test_registered_for_both_tasks_model_optional() -> None:
    info = STRATEGIES["auto"]
    assert info.tasks == ("classification", "regression")
    assert info.inputs == ("embeddings",)
    assert set(info.params) == {
        "history",
        "explore",
        "explore_validated",
        "gamma",
        "prior_bait",
        "cold",
        "exclude_outliers",
        "outlier_embeddings",
    }
    assert info.params["exclude_outliers"] is False and info.params["outlier_embeddings"] is None
    assert info.params["explore"] == 0.1 and info.params["explore_validated"] == 0.0


def test_same_seed_same_round_and_explore_share() -> None:
    from selection.auto import GAMMA, PRIOR_BAIT

    X, P, _ = pool()
    a = select("auto", embeddings=X, probs=P, labeled=np.arange(20), batch_size=10, seed=4)
    b = select("auto", embeddings=X, probs=P, labeled=np.arange(20), batch_size=10, seed=4)
    np.testing.assert_array_equal(a.indices, b.indices)
    d = a.diagnostics["auto"]
    assert d == b.diagnostics["auto"]
    assert d["cold"] is False and d["arms_in_play"] == list(WARM_ARMS["classification"])
    rest = (1 - GAMMA) * (1 - PRIOR_BAIT) / 3 + GAMMA / 4  # no history yet: the prior
    assert d["probabilities"] == pytest.approx(
        {"bait": (1 - GAMMA) * PRIOR_BAIT + GAMMA / 4, "badge": rest, "margin": rest, "random": rest}
    )
    arms = d["round"]["arms"]
    assert len(arms) == 10 and d["round"]["picks"] == a.indices.tolist()
    if d["arm"] != "random":
        assert d["explore"] == 1 and arms == [d["arm"]] * 9 + ["random"]
    # predictions at selection time are the model's argmax on the picks
    assert d["round"]["predictions"] == P[a.indices].argmax(1).tolist()
    assert not set(a.indices) & set(range(20))


def test_every_warm_arm_is_drawn_over_seeds() -> None:
    X, P, _ = pool()
    seen = {
        select("auto", embeddings=X, probs=P, labeled=np.arange(20), batch_size=5, seed=s).diagnostics["auto"]["arm"]
        for s in range(40)
    }
    assert seen == set(WARM_ARMS["classification"])


def test_cold_pool_uses_model_free_arms() -> None:
    X, _, _ = pool()
    for task in ("classification", "regression"):
        r = select("auto", embeddings=X, batch_size=8, seed=2, task=task)
        d = r.diagnostics["auto"]
        assert d["cold"] is True and d["arms_in_play"] == list(COLD_ARMS) and d["arm"] in COLD_ARMS
        assert d["round"]["predictions"] == [None] * 8


def test_library_cold_rule_is_the_fixed_strategies_one() -> None:
    """Without ``cold`` a pool is cold only where the model arms cannot run: a classification pool with probs is
    warm even below 2 labels per class (the library's fixed bait runs there too, on the head that gave the probs),
    a regression pool with one label is warm; no probs, or no regression label, is cold. ``cold`` overrides."""
    X, P, _ = pool(k=3)
    for labeled in (np.arange(0), np.arange(4)):  # 0 and 4 labels for 3 classes: fewer than 2 per class
        d = select("auto", embeddings=X, probs=P, labeled=labeled, batch_size=6, seed=1).diagnostics["auto"]
        assert d["cold"] is False and d["arms_in_play"] == list(WARM_ARMS["classification"])
        assert d["round"]["predictions"] == P[d["round"]["picks"]].argmax(1).tolist()
        fixed = select("bait", embeddings=X, probs=P, labeled=labeled, batch_size=6, seed=1)
        assert fixed.indices.shape == (6,)  # what auto is compared with runs on the same pool
    one = select("auto", embeddings=X, labeled=[0], batch_size=6, seed=1, task="regression").diagnostics["auto"]
    assert one["cold"] is False and one["arms_in_play"] == list(WARM_ARMS["regression"])
    none = select("auto", embeddings=X, batch_size=6, seed=1, task="regression").diagnostics["auto"]
    assert none["cold"] is True
    forced = select("auto", embeddings=X, probs=P, labeled=np.arange(4), batch_size=6, seed=1, cold=True)
    assert forced.diagnostics["auto"]["cold"] is True and forced.diagnostics["auto"]["arm"] in COLD_ARMS


def test_warm_classification_without_probs_is_refused() -> None:
    X, _, _ = pool()
    with pytest.raises(ParameterError, match="needs probs"):
        select("auto", embeddings=X, labeled=np.arange(30), batch_size=5, cold=False)


def test_bandit_moves_towards_the_arm_whose_model_is_accurate() -> None:
    q = dict.fromkeys(WARM_ARMS["classification"], 0.25)
    rounds: list[dict[str, Any]] = []
    for t in range(12):
        arm = ("bait", "margin")[t % 2]
        # the model trained after a bait round is right on the next round's uniform picks; after margin, wrong
        after_bait = t > 0 and rounds[-1]["arm"] == "bait"
        rounds.append(a_round(arm, q, [True] * 8 + [after_bait] * 2))
    dist, ev = bandit(check_history(rounds), WARM_ARMS["classification"], 0.2, "classification", prior_bait=0.25)
    assert ev.mode == "importance_weighted_accuracy" and len(ev.rewards) == 11 and ev.biased == 0
    # margin earned reward 0, like the arms never played: only their exploration bonus
    assert dist["bait"] > dist["badge"] == pytest.approx(dist["margin"]) == pytest.approx(dist["random"])
    assert sum(dist.values()) == pytest.approx(1.0)
    assert min(dist.values()) >= 0.2 / 4 - 1e-12  # gamma / K floor


def test_the_prior_starts_on_bait_and_evidence_moves_it() -> None:
    """Without evidence the warm arms start from the prior (bait PRIOR_BAIT, the rest shared); rounds where
    bait's model is wrong and margin's right move weight from bait to margin; cold arms start uniform."""
    from selection.auto import GAMMA, PRIOR_BAIT, prior_weights

    arms = WARM_ARMS["classification"]
    start, _ = bandit([], arms, GAMMA, "classification")
    assert start["bait"] == pytest.approx((1 - GAMMA) * PRIOR_BAIT + GAMMA / 4)
    assert start["badge"] == pytest.approx(start["margin"]) == pytest.approx(start["random"])
    assert start["bait"] > 0.8
    assert prior_weights(("typiclust", "kmeanspp", "random"), 0.9) == pytest.approx(
        dict.fromkeys(("typiclust", "kmeanspp", "random"), 1 / 3)
    )
    uniform, _ = bandit([], arms, GAMMA, "classification", prior_bait=0.25)
    assert uniform == pytest.approx(dict.fromkeys(arms, 0.25))
    rounds: list[dict[str, Any]] = []
    for t in range(30):
        arm = ("bait", "margin")[t % 2]
        after_margin = t > 0 and rounds[-1]["arm"] == "margin"
        rounds.append(a_round(arm, start, [True] * 8 + [after_margin] * 2))
    moved, _ = bandit(check_history(rounds), arms, GAMMA, "classification")
    assert moved["margin"] > start["margin"] and moved["bait"] < start["bait"]


def test_validation_gains_give_the_dashboard_line() -> None:
    q = dict.fromkeys(WARM_ARMS["classification"], 0.25)
    # bait rounds add 4 points per 100 labels (20 labels -> +0.8 points), random rounds 1 point
    rounds, v, n = [], 0.50, 40
    for arm in ["bait", "random", "bait", "random", "bait", "bait", "random"]:
        rounds.append(a_round(arm, q, [True] * 10, val=v, n=n))
        v += 0.008 if arm == "bait" else 0.002
        n += 20
    X, P, _ = pool()
    r = select("auto", embeddings=X, probs=P, labeled=np.arange(40), batch_size=10, seed=0, history=rounds)
    d = r.diagnostics["auto"]
    ev = d["evidence"]
    assert ev["mode"] == "validation" and ev["rounds"] == 7 and ev["rounds_scored"] == 6
    assert ev["per_arm"]["bait"]["gain_per_100_labels"] == pytest.approx(4.0)
    assert ev["per_arm"]["random"]["gain_per_100_labels"] == pytest.approx(1.0)
    if d["arm"] == "bait":
        assert d["summary"] == "bait chosen: +3.0 points of validation accuracy per 100 labels over random, 4 round(s)"
    else:
        assert d["summary"].startswith(f"{d['arm']} chosen:")
    assert d["probabilities"]["bait"] > d["probabilities"]["random"]


def test_explore_validated_replaces_the_uniform_share_only_in_validation_mode() -> None:
    """The uniform picks feed the importance-weighted reward; once the history carries validation scores the
    reward is the validation gain, and ``explore_validated`` sets the share instead of ``explore``."""
    X, P, _ = pool()
    q = {"bait": 1.0 - 3e-9, "badge": 1e-9, "margin": 1e-9, "random": 1e-9}
    scored = [a_round("bait", q, [True] * 10, val=0.5 + 0.01 * t, n=40 + 10 * t) for t in range(3)]
    unscored = [a_round("bait", q, [True] * 10) for _ in range(3)]
    kw: dict[str, Any] = {"embeddings": X, "probs": P, "labeled": np.arange(40), "batch_size": 10, "seed": 3}
    kw["prior_bait"], kw["gamma"] = 1.0, 1e-6  # bait is drawn: the share is what is measured
    for hist, ev, want in ((scored, 0.0, 0), (scored, 0.3, 3), (scored, None, 1), (unscored, 0.0, 1), ([], 0.0, 1)):
        d = select("auto", history=hist, explore=0.1, explore_validated=ev, **kw).diagnostics["auto"]
        assert d["arm"] == "bait"
        assert d["evidence"]["mode"] == ("validation" if hist is scored else "importance_weighted_accuracy")
        assert d["explore"] == want, (ev, d["evidence"]["mode"])
        assert d["round"]["arms"] == ["bait"] * (10 - want) + ["random"] * want
    # the defaults: explore's 0.1 (one pick of ten) until validation scores arrive, none after
    assert select("auto", history=unscored, **kw).diagnostics["auto"]["explore"] == 1
    assert select("auto", history=scored, **kw).diagnostics["auto"]["explore"] == 0


def test_history_from_diagnostics_round_trips() -> None:
    X, P, y = pool()
    labeled = np.arange(20)
    hist: list[dict[str, Any]] = []
    for t in range(4):
        r = select("auto", embeddings=X, probs=P, labeled=labeled, batch_size=10, seed=t, history=hist)
        rd = r.diagnostics["auto"]["round"]
        rd["labels"] = [int(y[i]) for i in rd["picks"]]
        hist.append(rd)
        labeled = np.concatenate([labeled, r.indices])
    assert r.diagnostics["auto"]["evidence"]["rounds_scored"] == 2  # rewards arrive one round late


@pytest.mark.parametrize(
    ("history", "match"),
    [
        ("bait", "must be a list of rounds"),
        ([1], r"history\[0\] must be an object"),
        ([{"arm": "bait"}], r"history\[0\] lacks arms, picks, labels, probabilities"),
        ([{**a_round("bait", {"bait": 1.0}, [True] * 4), "colour": 1}], "unknown key"),
        ([a_round("nonsense", {"bait": 1.0}, [True] * 4)], "not an arm of auto"),
        ([{**a_round("bait", {"bait": 1.0}, [True] * 4), "labels": [1, 2]}], "has 2 entries but the round has 4 picks"),
        ([{**a_round("bait", {"bait": 1.0}, [True] * 4), "arms": ["bait", "x", "bait", "bait"]}], "unknown arm"),
        ([a_round("bait", {"bait": 0.5}, [True] * 4)], "must sum to 1"),
        ([a_round("bait", {"margin": 1.0}, [True] * 4)], "lacks the round's arm"),
        ([a_round("bait", {"bait": 1.5}, [True] * 4)], r"must be in \(0, 1\]"),
        ([{**a_round("bait", {"bait": 1.0}, [True] * 4), "picks": [-1, 0, 1, 2]}], "non-negative row indices"),
        ([{**a_round("bait", {"bait": 1.0}, [True] * 4), "labels": [{}, 1, 1, 1]}], r"labels\[0\]"),
        ([{**a_round("bait", {"bait": 1.0}, [True] * 4), "validation": "high"}], "validation must be"),
    ],
)
def test_malformed_history_is_a_parameter_error(history: Any, match: str) -> None:
    X, P, _ = pool()
    with pytest.raises(ParameterError, match=match):
        select("auto", embeddings=X, probs=P, labeled=np.arange(20), batch_size=5, history=history)


@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("explore", 1.5),
        ("gamma", 0),
        ("explore", True),
        ("cold", "yes"),
        ("prior_bait", 1.5),
        ("explore_validated", -0.1),
        ("explore_validated", "none"),
    ],
)
def test_bad_parameters(param: str, value: Any) -> None:
    X, P, _ = pool()
    with pytest.raises(ParameterError, match=param):
        select("auto", embeddings=X, probs=P, labeled=np.arange(20), batch_size=5, **{param: value})


def test_regression_warm_arms() -> None:
    X, _, _ = pool()
    r = select("auto", embeddings=X, labeled=np.arange(10), batch_size=6, seed=1, task="regression")
    d = r.diagnostics["auto"]
    assert d["cold"] is False and d["arms_in_play"] == ["bait", "random"]


def test_cold_rounds_without_validation_do_not_block_validation_evidence() -> None:
    cold_q = dict.fromkeys(COLD_ARMS, 1 / 3)
    warm_q = dict.fromkeys(WARM_ARMS["classification"], 0.25)
    rounds = [a_round("typiclust", cold_q, [True] * 6), a_round("typiclust", cold_q, [True] * 6)]
    rounds[0]["predictions"] = rounds[1]["predictions"] = [None] * 6  # no model while cold
    rounds += [
        a_round("bait", warm_q, [True] * 6, val=0.6, n=20),
        a_round("margin", warm_q, [True] * 6, val=0.7, n=30),
        a_round("bait", warm_q, [True] * 6, val=0.7, n=40),
    ]
    _, ev = bandit(check_history(rounds), WARM_ARMS["classification"], 0.2, "classification", prior_bait=0.25)
    assert ev.mode == "validation"
    assert [(t, a) for t, a, _ in ev.rewards] == [(2, "bait"), (3, "margin")]
    assert ev.gains == [("bait", pytest.approx(100.0)), ("margin", pytest.approx(0.0))]


def corrupt_regression_pool(n: int = 200, d: int = 4, bad: int = 123) -> tuple[np.ndarray, int]:
    X = np.random.default_rng(7).normal(size=(n, d))
    X[bad] *= 1e3  # one corrupt row: BAIT's Fisher x x^T is largest there
    return X, bad


def test_outliers_are_left_out_before_the_arm_selects() -> None:
    """A newcomer's pool with one corrupt row: the fixed bait picks it, and so does auto playing bait by default
    (the check is off unless asked); with ``exclude_outliers=True`` auto does not pick it, and its diagnostics say
    what was left out."""
    X, bad = corrupt_regression_pool()
    labeled = np.arange(10)
    assert bad in select("bait", embeddings=X, labeled=labeled, batch_size=8, task="regression", seed=0).indices
    common: dict[str, Any] = {"embeddings": X, "labeled": labeled, "batch_size": 8, "task": "regression"}
    arms = set()
    for seed in range(12):  # bait and random rounds, exploration picks included
        r = select("auto", seed=seed, exclude_outliers=True, **common)
        d = r.diagnostics["auto"]
        arms.add(d["arm"])
        assert bad not in r.indices and len(set(r.indices.tolist())) == 8 and not set(r.indices) & set(labeled)
        assert d["round"]["picks"] == r.indices.tolist()
        out = d["outliers"]
        assert out["checked"] is True and out["on"] == "embeddings"
        assert out["n_excluded"] == out["n_flagged"] == 1 and out["excluded_rows"] == [bad]
        assert out["n_checked"] == 190 and out["kept_back"] == [] and out["c"] == 5.0
    assert arms == {"bait", "random"}
    seed = next(s for s in range(12) if select("auto", seed=s, **common).diagnostics["auto"]["arm"] == "bait")
    default = select("auto", seed=seed, **common)
    assert bad in default.indices and default.diagnostics["auto"]["outliers"] == {"checked": False}
    assert select("auto", seed=seed, exclude_outliers=False, **common).indices.tolist() == default.indices.tolist()


def test_a_clean_pool_gets_the_same_round_with_or_without_the_check() -> None:
    X, P, _ = pool()
    assert not robust_outliers(X).flagged.any()
    for seed in range(6):
        on = select(
            "auto", embeddings=X, probs=P, labeled=np.arange(20), batch_size=10, seed=seed, exclude_outliers=True
        )
        off = select("auto", embeddings=X, probs=P, labeled=np.arange(20), batch_size=10, seed=seed)
        np.testing.assert_array_equal(on.indices, off.indices)
        assert on.diagnostics["auto"]["outliers"]["n_excluded"] == 0


def test_outlier_embeddings_are_what_the_rule_reads() -> None:
    """The rule reads the pool's own embeddings when given (a model's features may hide the corrupt row)."""
    X, bad = corrupt_regression_pool()
    features = np.random.default_rng(8).normal(size=X.shape)  # a head's features, in which row 123 is ordinary
    common: dict[str, Any] = {
        "labeled": np.arange(10), "batch_size": 8, "task": "regression", "seed": 0, "exclude_outliers": True,
    }  # fmt: skip
    plain = select("auto", embeddings=features, **common).diagnostics["auto"]["outliers"]
    assert plain["on"] == "embeddings" and bad not in plain["excluded_rows"]
    r = select("auto", embeddings=features, outlier_embeddings=X, **common)
    out = r.diagnostics["auto"]["outliers"]
    assert out["on"] == "outlier_embeddings" and out["excluded_rows"] == [bad] and bad not in r.indices


def test_too_few_candidates_without_the_outliers_keeps_the_least_extreme_back() -> None:
    X, bad = corrupt_regression_pool(n=40, bad=30)
    X[31] *= 1e4
    labeled = np.arange(30)  # 10 candidates, 2 of them flagged; a batch of 9 needs one of them back
    r = select("auto", embeddings=X, labeled=labeled, batch_size=9, task="regression", seed=0, exclude_outliers=True)
    out = r.diagnostics["auto"]["outliers"]
    assert out["n_flagged"] == 2 and out["n_excluded"] == 1 and out["kept_back"] == [bad]
    assert out["excluded_rows"] == [31] and sorted(r.indices.tolist()) == [bad, *range(32, 40)]


@pytest.mark.parametrize(
    ("kwargs", "err", "match"),
    [
        ({"exclude_outliers": "yes"}, ParameterError, "exclude_outliers must be true or false"),
        ({"exclude_outliers": 1}, ParameterError, "exclude_outliers must be true or false"),
        ({"outlier_embeddings": [[1.0]] * 200, "exclude_outliers": True}, ParameterError, "must be an n x d array"),
        ({"outlier_embeddings": np.ones((199, 4)), "exclude_outliers": True}, ParameterError, r"shape \(200, d\)"),
        ({"outlier_embeddings": np.ones((200, 4)), "exclude_outliers": False}, ParameterError, "read only with"),
        ({"outlier_embeddings": np.full((200, 4), np.nan), "exclude_outliers": True}, InputDataError, "NaN or inf"),
        ({"outlier_embeddings": np.ones((200, 4))}, ParameterError, "read only with"),  # the default: off
    ],
)
def test_bad_outlier_parameters_are_refused(kwargs: dict[str, Any], err: type, match: str) -> None:
    X, _ = corrupt_regression_pool()
    with pytest.raises(err, match=match):
        select("auto", embeddings=X, labeled=np.arange(10), batch_size=4, task="regression", **kwargs)


@pytest.mark.parametrize("arm", sorted(ALL_ARMS - READS_EVERY_ROW))
def test_arms_that_read_only_candidates_select_the_same_without_the_copy(arm: str) -> None:
    """Leaving the outliers out of the candidates only (no copy of the pool) is, for an arm that reads nothing but
    the candidates and the design, the selection it makes on the pool without them (what bait and typiclust get)."""
    X, P, _ = pool(n=120)
    X[[30, 77]] *= 1e3
    problem = build_problem(
        embeddings=X,
        probs=P,
        labeled=np.arange(10),
        reserved=[50, 51],
        batch_size=6,
        task="classification",
        seed=5,
        device="cpu",
        dtype=None,
        chunk_size=64,
        progress=None,
    )
    rows = np.array([30, 77])
    light, same = without_rows(problem, rows, every_row=False)
    full, keep = without_rows(problem, rows, every_row=True)
    assert same is None and keep is not None and full.n == 118 and light.n == 120
    assert full.reserved.tolist() == [49, 50] and light.candidates.numel() == full.candidates.numel() == 106
    a = np.asarray(REGISTRY[arm].fn(light).indices)
    b = keep[np.asarray(REGISTRY[arm].fn(full).indices)]
    np.testing.assert_array_equal(a, b)
    assert not {30, 77, 50, 51} & set(a.tolist())

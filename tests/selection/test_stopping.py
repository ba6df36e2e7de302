"""The stopping rule (selection/stopping.py): stabilising predictions and a flat validation curve."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from selection.errors import InputDataError, ParameterError
from selection.stopping import (
    cohen_kappa,
    gain_per_labels,
    prediction_agreement,
    stop_from_agreements,
    stop_recommendation,
    t_quantile_95,
)


def _naive_kappa(a: list[int], b: list[int]) -> float:
    n = len(a)
    classes = sorted(set(a) | set(b))
    po = sum(1 for x, y in zip(a, b, strict=True) if x == y) / n
    pe = sum((a.count(c) / n) * (b.count(c) / n) for c in classes)
    return (po - pe) / (1 - pe)


def test_kappa_matches_a_loop_and_edge_cases() -> None:
    rng = np.random.default_rng(0)
    for _ in range(20):
        a = rng.integers(0, 4, 50)
        b = np.where(rng.random(50) < 0.8, a, rng.integers(0, 4, 50))
        assert cohen_kappa(a, b) == pytest.approx(_naive_kappa(a.tolist(), b.tolist()), abs=1e-12)
    assert cohen_kappa(np.zeros(5, int), np.zeros(5, int)) == 1.0  # one class everywhere
    assert cohen_kappa(np.array([0, 1, 0, 1]), np.array([1, 0, 1, 0])) == pytest.approx(-1.0)
    with pytest.raises(InputDataError):
        cohen_kappa(np.array([0, 1]), np.array([0, 1, 1]))
    with pytest.raises(InputDataError, match="integer"):
        cohen_kappa(np.array([0.0, 1.0]), np.array([0.0, 1.0]))


def test_regression_agreement_is_r2_of_new_against_old() -> None:
    rng = np.random.default_rng(1)
    old = rng.standard_normal((100, 2))
    new = old + 0.1 * rng.standard_normal((100, 2))
    expected = 1 - np.sum((new - old) ** 2) / np.sum((old - old.mean(axis=0)) ** 2)
    assert prediction_agreement(old, new, "regression") == pytest.approx(expected)
    assert prediction_agreement(old, old, "regression") == 1.0
    assert prediction_agreement(np.ones(4), np.ones(4), "regression") == 1.0
    assert prediction_agreement(np.ones(4), np.arange(4.0), "regression") == 0.0
    with pytest.raises(InputDataError, match="NaN"):
        prediction_agreement(old, np.full_like(old, np.nan), "regression")
    with pytest.raises(ParameterError):
        prediction_agreement(old, new, "ranking")


def test_t_table_matches_scipy() -> None:
    for df in range(1, 31):
        assert t_quantile_95(df) == pytest.approx(stats.t.ppf(0.95, df), abs=1e-4)
    assert t_quantile_95(500) == pytest.approx(stats.norm.ppf(0.95), abs=1e-4)


def test_gain_interval_is_the_ols_slope_with_a_t_interval() -> None:
    x = [100, 200, 300, 400, 500]
    y = [0.70, 0.74, 0.77, 0.79, 0.815]
    g = gain_per_labels(x, y)
    fit = stats.linregress(x, y)
    assert g["gain"] == pytest.approx(fit.slope * 100)
    assert g["se"] == pytest.approx(fit.stderr * 100)
    assert g["high"] - g["gain"] == pytest.approx(stats.t.ppf(0.95, 3) * fit.stderr * 100, rel=1e-4)
    down = gain_per_labels(x, [0.5, 0.4, 0.3, 0.2, 0.1], higher_is_better=False)  # rmse falling: a gain
    assert down["gain"] == pytest.approx(0.1)


def _stable_predictions(n_rounds: int, changing: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(2)
    base = rng.integers(0, 3, 2000)
    out = []
    for r in range(n_rounds):
        p = base.copy()
        if r >= n_rounds - changing:
            flip = rng.random(2000) < 0.2
            p[flip] = (p[flip] + 1) % 3
        out.append(p)
    return out


def test_stable_predictions_and_a_flat_curve_recommend_stopping() -> None:
    preds = _stable_predictions(6)
    curve = [(100, 0.80), (200, 0.851), (300, 0.852), (400, 0.853), (500, 0.852), (600, 0.853)]
    rec = stop_recommendation(preds, curve, task="classification", metric="accuracy")
    assert rec.recommended, rec.reason
    assert rec.reason.startswith("Stop labeling: predictions stable (kappa 1.000 or more over the last 3 rounds)")
    assert "validation accuracy gains" in rec.reason and "points per 100 labels" in rec.reason
    ev = rec.evidence
    assert ev["agreement"]["stable"] is True and ev["agreement"]["recent"] == [1.0, 1.0, 1.0]
    assert ev["validation"]["flat"] is True and ev["validation"]["n_labels"] == [200, 300, 400, 500, 600]
    gain = ev["expected_gain_next"]
    assert gain["low"] <= gain["value"] <= gain["high"] <= 0.01
    assert ev["missing"] == []


def test_a_rising_curve_keeps_labeling_even_with_stable_predictions() -> None:
    preds = _stable_predictions(6)
    curve = [(100, 0.60), (200, 0.65), (300, 0.70), (400, 0.74), (500, 0.79), (600, 0.83)]
    rec = stop_recommendation(preds, curve, task="classification", metric="accuracy")
    assert not rec.recommended
    assert rec.reason.startswith("Keep labeling: predictions stable")
    assert "still rising" in rec.reason
    assert rec.evidence["expected_gain_next"]["value"] == pytest.approx(0.045, abs=0.002)  # per 100 labels, in accuracy
    assert rec.evidence["validation"]["flat"] is False


def test_changing_predictions_keep_labeling() -> None:
    preds = _stable_predictions(6, changing=1)
    curve = [(100 * (i + 1), 0.85) for i in range(6)]
    rec = stop_recommendation(preds, curve, task="classification")
    assert not rec.recommended
    assert "predictions still change (kappa" in rec.reason
    assert rec.evidence["agreement"]["stable"] is False and rec.evidence["agreement"]["lowest"] < 0.99


def test_too_few_checkpoints_say_what_is_missing() -> None:
    rec = stop_recommendation(_stable_predictions(2), [(100, 0.8), (200, 0.8)], task="classification")
    assert not rec.recommended
    assert "needs 3 consecutive rounds compared on the stop set, has 1" in rec.reason
    assert "needs validation scores of 3 rounds, has 2" in rec.reason
    assert len(rec.evidence["missing"]) == 2 and rec.evidence["expected_gain_next"] is None
    empty = stop_recommendation([], [], task="classification")
    assert not empty.recommended and "has 0" in empty.reason


def test_no_validation_scores_never_recommend_stopping() -> None:
    preds = _stable_predictions(6)
    rec = stop_recommendation(preds, [(100 * (i + 1), None) for i in range(6)], task="classification")
    assert not rec.recommended and rec.evidence["agreement"]["stable"] is True
    assert "label items in the validation split" in rec.reason


def test_heads_trained_on_the_same_labels_are_one_round() -> None:
    """Four checkpoints on the same 100 labels are one round: no stable pair among them."""
    preds = _stable_predictions(4)
    curve = [(100, 0.8)] * 4
    rec = stop_recommendation(preds, curve, task="classification")
    assert rec.evidence["rounds"] == 1 and rec.evidence["agreement"]["rounds_compared"] == 0
    assert not rec.recommended


def test_regression_uses_r2_agreement_and_a_relative_bound_on_rmse() -> None:
    rng = np.random.default_rng(3)
    base = rng.standard_normal(500)
    preds = [base + 1e-3 * rng.standard_normal(500) for _ in range(6)]
    flat = [(50, 1.0), (100, 0.5), (150, 0.5), (200, 0.499), (250, 0.5), (300, 0.5)]
    rec = stop_recommendation(preds, flat, task="regression", metric="rmse")
    assert rec.recommended, rec.reason
    assert "(r2 0.999 or more" in rec.reason and "validation rmse improves by" in rec.reason
    assert rec.evidence["validation"]["min_gain"] == pytest.approx(0.005)  # 1% of the latest rmse
    falling = [(50, 1.0), (100, 0.9), (150, 0.8), (200, 0.7), (250, 0.6), (300, 0.5)]
    assert not stop_recommendation(preds, falling, task="regression", metric="rmse").recommended


def test_stored_agreements_give_the_same_answer_as_predictions() -> None:
    preds = _stable_predictions(5, changing=1)
    curve = [(100, 0.8), (200, 0.82), (300, 0.83), (400, 0.83), (500, 0.83)]
    direct = stop_recommendation(preds, curve)
    agreements = [None] + [cohen_kappa(preds[i - 1], preds[i]) for i in range(1, 5)]
    assert stop_from_agreements(agreements, curve).as_dict() == direct.as_dict()


def test_bad_inputs_raise_specific_errors() -> None:
    with pytest.raises(InputDataError, match="one prediction array per checkpoint"):
        stop_recommendation([np.zeros(3, int)], [])
    with pytest.raises(ParameterError, match="metric must be one of"):
        stop_from_agreements([], [], metric="precision")
    with pytest.raises(ParameterError, match="window"):
        stop_from_agreements([], [], window=0)
    with pytest.raises(InputDataError, match="finite"):
        stop_from_agreements([None], [(10, float("nan"))])
    with pytest.raises(InputDataError, match="n_labels"):
        stop_from_agreements([None], [(-1, 0.5)])

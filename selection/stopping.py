"""When to stop labeling: stabilising predictions together with the validation curve's slope.

Two signals, both needed before the rule recommends stopping:

1. **Stabilising predictions** (Bloodgood & Vijay-Shanker 2009, "A method for stopping active learning
   based on stabilizing predictions and the need for user-adjustable stopping"): every round's model
   predicts a fixed *stop set* of items (unlabeled when it was chosen; it need not stay unlabeled). When
   the agreement between consecutive rounds' predictions stays at or above ``threshold`` (0.99) for
   ``window`` (3) rounds in a row, the model has stopped changing on the pool. Classification measures
   agreement with Cohen's kappa between the predicted classes; regression with the R² of the new
   predictions against the previous ones, ``1 - Σ (new - old)² / Σ (old - mean old)²`` over every
   output (1: identical, 0: as far apart as predicting the old mean), with the same threshold.
2. **A flat validation curve**: the slope of the validation metric against the number of training labels,
   fitted by least squares over the last ``slope_points`` (5) rounds that were scored (at least 3), gives
   the expected gain of the next ``per`` (100) labels; its standard error gives a 90% t-interval. The curve
   is flat when the interval's upper end is at most ``min_gain``: 0.01 (one point) per 100 labels for
   metrics on a 0-1 scale (accuracy, macro-F1, ECE, R²), and 1% of the latest value per 100 labels for
   rmse, mae and log loss. Gains are oriented: positive is better (a fall in rmse is a gain).

A *round* is a checkpoint trained on a different number of labels than the one before it: consecutive
checkpoints with the same ``n_labels`` (batches requested without labeling in between) collapse to the
last of them, so two heads trained on the same labels never count as a stable pair.

    from selection.stopping import stop_recommendation
    rec = stop_recommendation(preds, [(n_labels, accuracy), ...], task="classification", metric="accuracy")
    rec.recommended, rec.reason, rec.evidence

Only numpy: the service reads the recommendation the worker stored with each checkpoint.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from selection.errors import InputDataError, ParameterError

THRESHOLD = 0.99
WINDOW = 3
SLOPE_POINTS = 5
MIN_SLOPE_POINTS = 3
MIN_GAIN = 0.01
PER = 100
LEVEL = 0.90

# Student t quantiles at 0.95 (two-sided 90% intervals) for 1..30 degrees of freedom; the normal's beyond.
_T95 = (
    6.3138, 2.9200, 2.3534, 2.1318, 2.0150, 1.9432, 1.8946, 1.8595, 1.8331, 1.8125,
    1.7959, 1.7823, 1.7709, 1.7613, 1.7531, 1.7459, 1.7396, 1.7341, 1.7291, 1.7247,
    1.7207, 1.7171, 1.7139, 1.7109, 1.7081, 1.7056, 1.7033, 1.7011, 1.6991, 1.6973,
)  # fmt: skip
_Z95 = 1.6449


@dataclass(frozen=True)
class MetricSpec:
    """How a validation metric reads: ``higher_is_better``; ``points``: on a 0-1 scale, shown x100 as points
    and held to an absolute ``min_gain``; otherwise ``min_gain`` is relative to the latest value."""

    higher_is_better: bool
    points: bool


METRICS: dict[str, MetricSpec] = {
    "accuracy": MetricSpec(True, True),
    "macro_f1": MetricSpec(True, True),
    "ece": MetricSpec(False, True),
    "log_loss": MetricSpec(False, False),
    "rmse": MetricSpec(False, False),
    "mae": MetricSpec(False, False),
    "r2": MetricSpec(True, True),
}


@dataclass(frozen=True)
class StopRecommendation:
    """``recommended``: stop labeling; ``reason``: one sentence for a person; ``evidence``: the numbers."""

    recommended: bool
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"recommended": self.recommended, "reason": self.reason, "evidence": self.evidence}


def t_quantile_95(df: int) -> float:
    """The 0.95 quantile of Student's t with ``df`` >= 1 degrees of freedom (the normal's beyond 30)."""
    if df < 1:
        raise ParameterError(f"degrees of freedom must be at least 1, got {df}")
    return _T95[df - 1] if df <= len(_T95) else _Z95


def cohen_kappa(a: np.ndarray, b: np.ndarray) -> float:
    """Cohen's kappa between two labelings of the same items.

    Args:
        a, b: ``(n,)`` integer class indices, n >= 1.

    Returns:
        ``(p_o - p_e) / (1 - p_e)`` with ``p_o`` the observed agreement and ``p_e`` the agreement expected
        from each labeling's class frequencies; 1.0 when both give every item the same single class.
    """
    a = np.asarray(a).reshape(-1)
    b = np.asarray(b).reshape(-1)
    if a.shape != b.shape or a.shape[0] == 0:
        raise InputDataError(f"kappa needs two labelings of the same n >= 1 items, got {a.shape} and {b.shape}")
    if not (np.issubdtype(a.dtype, np.integer) and np.issubdtype(b.dtype, np.integer)):
        raise InputDataError("kappa compares class indices: pass integer arrays")
    k = int(max(a.max(), b.max())) + 1
    if min(int(a.min()), int(b.min())) < 0:
        raise InputDataError("class indices must be >= 0")
    observed = float(np.mean(a == b))
    pa = np.bincount(a, minlength=k) / a.shape[0]
    pb = np.bincount(b, minlength=k) / b.shape[0]
    expected = float(pa @ pb)
    if expected >= 1.0:  # both labelings put every item in one and the same class
        return 1.0
    return (observed - expected) / (1.0 - expected)


def prediction_agreement(previous: np.ndarray, current: np.ndarray, task: str = "classification") -> float:
    """Agreement of two rounds' predictions on the same stop set.

    Args:
        previous, current: classification: ``(n,)`` predicted class indices; regression: ``(n,)`` or
            ``n x m`` predicted targets (finite).
        task: ``classification`` (Cohen's kappa) or ``regression`` (R² of ``current`` against ``previous``,
            1.0 when both are identical, 0.0 when ``previous`` is constant and ``current`` differs from it).
    """
    if task == "classification":
        return cohen_kappa(previous, current)
    if task != "regression":
        raise ParameterError(f"task must be classification or regression, got {task!r}")
    old = np.asarray(previous, dtype=np.float64)
    new = np.asarray(current, dtype=np.float64)
    if old.shape != new.shape or old.size == 0:
        raise InputDataError(f"predictions of the same items needed, got shapes {old.shape} and {new.shape}")
    if not (np.isfinite(old).all() and np.isfinite(new).all()):
        raise InputDataError("predictions contain NaN or inf")
    old = old.reshape(old.shape[0], -1)
    new = new.reshape(new.shape[0], -1)
    sse = float(np.sum((new - old) ** 2))
    sst = float(np.sum((old - old.mean(axis=0)) ** 2))
    if sst == 0.0:
        return 1.0 if sse == 0.0 else 0.0
    return 1.0 - sse / sst


def gain_per_labels(
    n_labels: Sequence[float], values: Sequence[float], *, higher_is_better: bool = True, per: int = PER
) -> dict[str, float]:
    """Least-squares slope of ``values`` against ``n_labels``, as the expected gain of ``per`` more labels
    with a 90% t-interval (positive: better).

    Args:
        n_labels: ``(r,)`` label counts, r >= 3, not all equal.
        values: ``(r,)`` the metric at each count (finite).

    Returns:
        ``{"gain", "se", "low", "high", "points"}`` in the metric's units per ``per`` labels.
    """
    x = np.asarray(n_labels, dtype=np.float64)
    y = np.asarray(values, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1 or x.shape[0] < MIN_SLOPE_POINTS:
        raise InputDataError(f"the slope needs at least {MIN_SLOPE_POINTS} (n_labels, value) pairs")
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise InputDataError("n_labels and values must be finite")
    xc = x - x.mean()  # r
    sxx = float(xc @ xc)
    if sxx == 0.0:
        raise InputDataError("the slope needs rounds with different numbers of labels")
    slope = float(xc @ (y - y.mean())) / sxx
    residual = y - y.mean() - slope * xc
    df = x.shape[0] - 2
    se = math.sqrt(float(residual @ residual) / df / sxx)
    sign = 1.0 if higher_is_better else -1.0
    gain = sign * slope * per
    half = t_quantile_95(df) * se * per
    return {"gain": gain, "se": se * per, "low": gain - half, "high": gain + half, "points": float(x.shape[0])}


def _rounds(n_labels: Sequence[int]) -> list[int]:
    """Indices of the checkpoints that are rounds: the last of each run of equal ``n_labels``."""
    return [i for i in range(len(n_labels)) if i + 1 == len(n_labels) or n_labels[i + 1] != n_labels[i]]


def _curve(validation_curve: Sequence[tuple[int, float | None]]) -> tuple[list[int], list[float | None]]:
    ns: list[int] = []
    vs: list[float | None] = []
    for entry in validation_curve:
        if len(entry) != 2:
            raise InputDataError("validation_curve holds (n_labels, value or None) pairs")
        n, v = entry
        if int(n) < 0:
            raise InputDataError(f"n_labels must be >= 0, got {n}")
        if v is not None and not math.isfinite(float(v)):
            raise InputDataError(f"validation values must be finite, got {v}")
        ns.append(int(n))
        vs.append(None if v is None else float(v))
    return ns, vs


def _check_options(metric: str, threshold: float, window: int, slope_points: int, min_gain: float) -> MetricSpec:
    if metric not in METRICS:
        raise ParameterError(f"metric must be one of {sorted(METRICS)}, got {metric!r}")
    if not 0.0 < threshold <= 1.0:
        raise ParameterError(f"threshold must be in (0, 1], got {threshold}")
    if window < 1:
        raise ParameterError(f"window must be at least 1, got {window}")
    if slope_points < MIN_SLOPE_POINTS:
        raise ParameterError(f"slope_points must be at least {MIN_SLOPE_POINTS}, got {slope_points}")
    if not min_gain >= 0.0:
        raise ParameterError(f"min_gain must be >= 0, got {min_gain}")
    return METRICS[metric]


def stop_recommendation(
    predictions_per_checkpoint: Sequence[np.ndarray | None],
    validation_curve: Sequence[tuple[int, float | None]],
    *,
    task: str = "classification",
    metric: str = "accuracy",
    threshold: float = THRESHOLD,
    window: int = WINDOW,
    slope_points: int = SLOPE_POINTS,
    min_gain: float = MIN_GAIN,
    per: int = PER,
) -> StopRecommendation:
    """Whether to stop labeling, from every checkpoint's predictions on one fixed stop set and its
    validation score (see the module for the rule).

    Args:
        predictions_per_checkpoint: per checkpoint, oldest first, its predictions on the stop set (the same
            items in the same order for all): ``(s,)`` class indices, or ``(s,)`` / ``s x m`` targets for
            regression; ``None`` where a checkpoint has none.
        validation_curve: per checkpoint, ``(n_labels, value)`` of ``metric`` on the validation items
            (``value`` None where it was not scored).
        task: ``classification`` (kappa) or ``regression`` (R² between consecutive predictions).
        metric: a name of :data:`METRICS`.
        threshold, window: agreement needed, and for how many consecutive rounds.
        slope_points: rounds the slope is fitted on (the last scored ones, at least 3).
        min_gain: the flat curve's bound on the gain per ``per`` labels (see the module).

    Raises:
        InputDataError: lists of different lengths, NaN/inf, negative label counts.
        ParameterError: an unknown metric or task, or an option out of range.
    """
    if len(predictions_per_checkpoint) != len(validation_curve):
        raise InputDataError(
            f"one prediction array per checkpoint: {len(predictions_per_checkpoint)} arrays for "
            f"{len(validation_curve)} curve points"
        )
    if task not in ("classification", "regression"):
        raise ParameterError(f"task must be classification or regression, got {task!r}")
    ns, _ = _curve(validation_curve)
    rounds = _rounds(ns)
    agreements: list[float | None] = [None] * len(ns)
    for j in range(1, len(rounds)):
        prev, cur = predictions_per_checkpoint[rounds[j - 1]], predictions_per_checkpoint[rounds[j]]
        if prev is not None and cur is not None:
            agreements[rounds[j]] = prediction_agreement(prev, cur, task)
    return stop_from_agreements(
        agreements,
        validation_curve,
        agreement="kappa" if task == "classification" else "r2",
        metric=metric,
        threshold=threshold,
        window=window,
        slope_points=slope_points,
        min_gain=min_gain,
        per=per,
    )


def stop_from_agreements(
    agreements: Sequence[float | None],
    validation_curve: Sequence[tuple[int, float | None]],
    *,
    agreement: str = "kappa",
    metric: str = "accuracy",
    threshold: float = THRESHOLD,
    window: int = WINDOW,
    slope_points: int = SLOPE_POINTS,
    min_gain: float = MIN_GAIN,
    per: int = PER,
) -> StopRecommendation:
    """:func:`stop_recommendation` from agreements already computed, one per checkpoint: ``agreements[i]``
    compares checkpoint ``i``'s stop-set predictions with those of the latest earlier checkpoint trained on
    a different number of labels (``None``: not compared). A service stores one number per checkpoint
    instead of every checkpoint's predictions. ``agreement`` names the measure (``kappa`` | ``r2``)."""
    spec = _check_options(metric, threshold, window, slope_points, min_gain)
    if len(agreements) != len(validation_curve):
        raise InputDataError(f"{len(agreements)} agreements for {len(validation_curve)} curve points")
    for a in agreements:
        if a is not None and not math.isfinite(float(a)):
            raise InputDataError(f"agreements must be finite, got {a}")
    ns, vs = _curve(validation_curve)
    rounds = _rounds(ns)
    round_agreements = [agreements[i] for i in rounds[1:]]  # the first round has nothing before it
    compared = 0
    for a in reversed(round_agreements):
        if a is None:
            break
        compared += 1
    recent = [float(a) for a in round_agreements[len(round_agreements) - min(compared, window) :] if a is not None]
    stable: bool | None = None
    if compared >= window:
        stable = all(a >= threshold for a in recent)
    elif recent and min(recent) < threshold:
        stable = False  # already known not to be stable

    scored: list[tuple[int, float]] = [(ns[i], v) for i in rounds if (v := vs[i]) is not None][-slope_points:]
    slope: dict[str, float] | None = None
    if len(scored) >= MIN_SLOPE_POINTS and len({n for n, _ in scored}) > 1:
        slope = gain_per_labels(
            [n for n, _ in scored], [v for _, v in scored], higher_is_better=spec.higher_is_better, per=per
        )
    latest = None if not scored else scored[-1][1]
    bound = min_gain if spec.points else min_gain * abs(latest or 0.0)
    flat = None if slope is None else slope["high"] <= bound

    missing: list[str] = []
    if compared < window and stable is not False:
        missing.append(
            f"needs {window} consecutive rounds compared on the stop set, has {compared}"
            " (each round: a new head trained on more labels)"
        )
    if slope is None:
        missing.append(
            f"needs validation scores of {MIN_SLOPE_POINTS} rounds, has {len(scored)}"
            " (label items in the validation split)"
        )
    recommended = bool(stable) and bool(flat)
    evidence: dict[str, Any] = {
        "rounds": len(rounds),
        "checkpoints": len(ns),
        "n_labels": ns[-1] if ns else 0,
        "agreement": {
            "measure": agreement,
            "threshold": threshold,
            "window": window,
            "rounds_compared": compared,
            "recent": [round(a, 6) for a in recent],
            "lowest": None if not recent else round(min(recent), 6),
            "stable": stable,
        },
        "validation": {
            "metric": metric,
            "higher_is_better": spec.higher_is_better,
            "rounds_scored": len(scored),
            "n_labels": [n for n, _ in scored],
            "values": [round(v, 6) for _, v in scored],
            "latest": latest,
            "min_gain": bound,
            "flat": flat,
        },
        "expected_gain_next": None
        if slope is None
        else {
            "labels": per,
            "value": slope["gain"],
            "low": slope["low"],
            "high": slope["high"],
            "se": slope["se"],
            "level": LEVEL,
        },
        "missing": missing,
    }
    reason = _reason(recommended, stable, flat, recent, compared, slope, metric, spec, bound, evidence, per)
    return StopRecommendation(recommended, reason, evidence)


def _gain_text(metric: str, spec: MetricSpec, slope: dict[str, float], per: int) -> str:
    half = (slope["high"] - slope["low"]) / 2
    if spec.points:
        return f"validation {metric} gains {100 * slope['gain']:+.1f} ± {100 * half:.1f} points per {per} labels"
    return f"validation {metric} improves by {slope['gain']:+.3g} ± {half:.2g} per {per} labels (lower is better)"


def _reason(
    recommended: bool,
    stable: bool | None,
    flat: bool | None,
    recent: list[float],
    compared: int,
    slope: dict[str, float] | None,
    metric: str,
    spec: MetricSpec,
    bound: float,
    evidence: dict[str, Any],
    per: int,
) -> str:
    a = evidence["agreement"]
    name, window, threshold = a["measure"], a["window"], a["threshold"]
    parts: list[str] = []
    if stable:
        floor = math.floor(min(recent) * 1000) / 1000  # a lower bound, never rounded up to the threshold
        parts.append(f"predictions stable ({name} {floor:.3f} or more over the last {window} rounds)")
    elif stable is False:
        parts.append(
            f"predictions still change ({name} {min(recent):.3f} at the lowest over the last {len(recent)} "
            f"round(s), {recent[-1]:.3f} between the last two; stopping needs {threshold} or more for {window} rounds)"
        )
    limit = f"{100 * bound:.1f} points" if spec.points else f"{bound:.3g}"
    if slope is not None:
        text = _gain_text(metric, spec, slope, per)
        if flat:
            parts.append(f"{text}, at most {limit} expected")
        elif slope["gain"] <= bound:
            parts.append(f"{text}: too uncertain to call flat (more validation labels narrow it)")
        else:
            parts.append(f"{text}: still rising")
    if recommended:
        return "Stop labeling: " + " and ".join(parts) + "."
    return "Keep labeling: " + "; ".join(parts + list(evidence["missing"])) + "."

"""The cold-start rule: when a pool has too few labels for a model, its batch comes from a model-free strategy.

A model-based strategy (one that reads class probabilities or a head's features: ``bait``, ``badge``,
``margin``, ``confidence``, ``entropy``, the log-det variants) scores items with a head trained on the
pool's labels. With no label, or too few to see every class, that head is its random initialisation or
close to it, and its scores say nothing about the items. Then the batch job trains no head, runs
:data:`COLD_START_STRATEGY` of the task on the pool's embeddings and records the substitution in the batch's
diagnostics (``strategy_requested``, ``strategy_used``, ``cold_start: {rule, n_labels, threshold}``).
``params.cold_start = false`` opts out (the requested strategy runs as before).

The rule (evidence: docs/results/cold_start, first batch scored by an independent learner):

* classification with ``k`` classes: fewer than ``2 k`` labels, or a class with no label;
* regression: no label at all.

The substitute: ``typiclust`` for classification (typical items of distinct clusters; its first batch beat
random and BAIT-on-an-untrained-head on MNIST, digits and breast_cancer), ``kmeanspp`` for regression
(spread-out items: a linear fit needs leverage, and typiclust's central picks were significantly worse
than random on diabetes at B=10, while k-means++ tied or beat random).

This module is torch-free: the web process validates and documents with it, the worker applies it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from service.errors import BadRequest

#: The strategy a cold-start batch runs, per task.
COLD_START_STRATEGY = {"classification": "typiclust", "regression": "kmeanspp"}
#: Strategies that read no model at all and run on the pool's embeddings (no head is trained for them).
MODEL_FREE = ("kmeanspp", "typiclust")
#: Labels per class below which a classification pool is cold.
LABELS_PER_CLASS = 2
#: Labels below which a regression pool is cold.
REGRESSION_MIN_LABELS = 1
PARAM = "cold_start"
WHAT = {"typiclust": "typical items of distinct clusters", "kmeanspp": "spread-out items (k-means++ seeding)"}

RULES = {
    "classification": f"fewer than {LABELS_PER_CLASS} labels per class (n_labels < {LABELS_PER_CLASS} * k) "
    "or a class with no label",
    "regression": "no label (n_labels < 1)",
}


@dataclass(frozen=True)
class ColdStart:
    """A decision to substitute: which rule fired, on how many labels, against which threshold."""

    rule: str
    n_labels: int
    threshold: int
    classes_without_label: list[str] | None = None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rule": self.rule, "n_labels": self.n_labels, "threshold": self.threshold}
        if self.classes_without_label is not None:
            out["classes_without_label"] = self.classes_without_label
        return out


def is_model_based(inputs: Sequence[str]) -> bool:
    """Whether a strategy with these catalog ``inputs`` needs a trained model (it reads probabilities)."""
    return "probs" in inputs


def decide(
    task: str, n_labels: int, class_counts: Sequence[int] | None, classes: Sequence[str] | None
) -> ColdStart | None:
    """The cold-start decision for a pool's labels (``None``: the requested strategy runs).

    Args:
        task: ``"classification"`` or ``"regression"``.
        n_labels: labeled items the head would be trained on.
        class_counts: labels per class, in the pool's class order (classification).
        classes: the class names (classification), to name those without a label.
    """
    if task == "classification":
        counts = list(class_counts or [])
        k = len(counts)
        threshold = LABELS_PER_CLASS * k
        missing = [str(c) for c, n in zip(classes or [], counts, strict=False) if n == 0]
        if n_labels < threshold or missing:
            return ColdStart(RULES["classification"], int(n_labels), threshold, missing)
        return None
    if n_labels < REGRESSION_MIN_LABELS:
        return ColdStart(RULES["regression"], int(n_labels), REGRESSION_MIN_LABELS)
    return None


def note(requested: str, used: str, decision: ColdStart) -> str:
    """One sentence for the batch's diagnostics that says plainly which strategy ran, and why."""
    missing = decision.classes_without_label
    why = f"the pool has {decision.n_labels} label(s), fewer than {decision.threshold}"
    if missing:
        listed = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        why = f"the pool has {decision.n_labels} label(s) and none for class(es) {listed}"
    return (
        f"cold start: {why}, too few to train a model for {requested!r}; this batch was chosen by {used!r} "
        f"({WHAT[used]} of the embeddings, no model). Label it and later batches use {requested!r}; "
        f"send params.cold_start=false to run {requested!r} anyway."
    )


def check_param(value: Any, strategy: str, inputs: Sequence[str], *, batch: bool) -> None:
    """Validate ``params.cold_start``: a boolean, on a pool batch, for a model-based strategy.

    Raises:
        BadRequest: with what to send instead.
    """
    if not batch:
        raise BadRequest(
            "params.cold_start applies to pool batches only: /v1/select runs exactly the strategy asked for; "
            f"ask for {' or '.join(map(repr, MODEL_FREE))} directly to get a model-free selection",
            details={"param": PARAM},
        )
    if not isinstance(value, bool):
        raise BadRequest(
            f"params.cold_start must be true or false, got {value!r}",
            details={"param": PARAM, "expected": "bool"},
        )
    if not is_model_based(inputs):
        raise BadRequest(
            "params.cold_start only applies to model-based strategies (they are replaced by typiclust or "
            f"kmeanspp on a pool with too few labels); strategy {strategy!r} reads no model and is never replaced: "
            "remove params.cold_start",
            details={"param": PARAM},
        )


def describe(model_based: Sequence[str]) -> dict[str, Any]:
    """The rule as ``GET /v1/strategies`` documents it."""
    return {
        "strategy": dict(COLD_START_STRATEGY),
        "applies_to": sorted(model_based),
        "rule": dict(RULES),
        "labels_per_class": LABELS_PER_CLASS,
        "regression_min_labels": REGRESSION_MIN_LABELS,
        "counted": "labeled items the head is trained on (reserved and validation items do not count)",
        "opt_out": "params.cold_start = false runs the requested strategy on the head trained on the labels there are",
        "recorded_in": "batch diagnostics: strategy_requested, strategy_used, cold_start {rule, n_labels, threshold}",
        "evidence": "docs/results/cold_start",
    }

"""The strategy catalog the web process validates requests against, without importing the numerics.

It mirrors :data:`selection.STRATEGIES` (names, tasks, keyword-only parameters with their annotations
and defaults); ``tests/worker/test_strategy_catalog.py`` fails when the two drift apart. Besides the
strategy's own parameters every request may carry ``seed`` (a non-negative integer), which the service
passes to ``selection.select(seed=...)``.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from service.domain import coldstart
from service.errors import BadRequest

CLASSIFICATION = ("classification",)
BOTH = ("classification", "regression")

# Parameters the service itself understands for every strategy.
COMMON_PARAMS: dict[str, tuple[str, Any]] = {"seed": ("int", None)}

# Strategy parameters that take per-row arrays: listed (the catalog mirrors the signatures) but not
# settable through the service, whose clients do not know the pool's row order.
ARRAY_PARAMS = frozenset({"fisher_weights", "outlier_embeddings"})

# auto's parameters that a pool batch builds itself (the worker reads the pool's earlier batches and its
# cold-start rule); a request may set them on POST /v1/select only.
POOL_BUILT_PARAMS = frozenset({"history", "cold"})
#: The arms auto may play (selection.auto.ALL_ARMS; tests/worker/test_strategy_catalog.py checks they agree).
AUTO_ARMS = ("bait", "badge", "kmeanspp", "margin", "random", "typiclust")
AUTO_ROUND_KEYS = ("arm", "arms", "picks", "labels", "predictions", "probabilities", "validation", "n_labels")
AUTO_MAX_ROUNDS = 10_000
#: ``params.exclude_outliers`` (pool batches): drop the picks the robust outlier rule flags (selection.outliers).
EXCLUDE_OUTLIERS = "exclude_outliers"
#: Strategies whose library function takes ``exclude_outliers`` itself, so ``POST /v1/select`` accepts it for them
#: (``auto``: selection.auto). Off unless asked, for pool batches too: on the tune half the check cost ``auto``
#: a dataset (concrete) and gained none, and it added 20-30 % to a cheap round (docs/results/auto/README.md).
OUTLIER_PARAM_ON_SELECT = frozenset({"auto"})


def excludes_outliers(strategy: str, params: Mapping[str, Any]) -> bool:
    """Whether a pool batch leaves the candidates the outlier rule flags out of the pool its strategy sees:
    ``params.exclude_outliers`` is true (off by default, for every strategy). The worker, the pool-size check and
    the cluster path all ask this."""
    return params.get(EXCLUDE_OUTLIERS) is True


@dataclass(frozen=True)
class Param:
    """A strategy parameter: its annotation as written in the strategy's signature, and its default."""

    annotation: str
    default: Any


@dataclass(frozen=True)
class StrategySpec:
    name: str
    tasks: tuple[str, ...]
    summary: str
    params: dict[str, Param] = field(default_factory=dict)
    # What the strategy reads besides the design: "embeddings" and/or "probs" (none: no model needed).
    inputs: tuple[str, ...] = ("embeddings", "probs")


def _spec(
    name: str,
    tasks: tuple[str, ...],
    summary: str,
    inputs: tuple[str, ...] = ("embeddings", "probs"),
    **params: tuple[str, Any],
) -> StrategySpec:
    return StrategySpec(name, tasks, summary, {k: Param(a, d) for k, (a, d) in params.items()}, inputs)


CATALOG: dict[str, StrategySpec] = {
    s.name: s
    for s in (
        _spec(
            "badge",
            CLASSIFICATION,
            "BADGE: k-means++ seeding on gradient embeddings (e_yhat - p) ⊗ x (uncertainty + diversity)",
        ),
        _spec(
            "bait",
            BOTH,
            "BAIT: greedy forward-backward minimisation of tr(M^-1 F) (Fisher trace), exact and structured",
            lam=("float", 0.01),
            oversample=("float", 2),
            convention=("str", "reference"),
            approx=("str | None", None),
            approx_dim=("int | None", None),
            approx_classes=("int | None", None),
            approx_samples=("int | None", None),
            prefilter=("Any", None),
            time_budget_s=("float", 60.0),
            fisher_weights=("Any", None),
            max_memory_gb=("float", 8.0),
        ),
        _spec(
            "bait_nofisher",
            BOTH,
            "BAIT ablation with the pool Fisher replaced by the identity: minimises tr(M^-1)",
            lam=("float", 0.01),
            oversample=("float", 2),
            convention=("str", "reference"),
            approx=("str | None", None),
            approx_dim=("int | None", None),
            max_memory_gb=("float", 8.0),
        ),
        _spec("confidence", CLASSIFICATION, "Least confidence: smallest max probability", ("probs",)),
        _spec(
            "coreset",
            BOTH,
            "Core-set: greedy k-center on embeddings, distances to labeled, reserved and chosen rows",
            ("embeddings",),
        ),
        _spec("entropy", CLASSIFICATION, "Entropy: largest predictive entropy", ("probs",)),
        _spec(
            "logdet_fisher",
            CLASSIFICATION,
            "Greedy maximisation of log det(M) with the full pointwise Fisher (paper appendix, Alg. 3)",
            lam=("float", 1.0),
            convention=("str", "sum"),
            approx=("str | None", None),
            approx_dim=("int | None", None),
            max_memory_gb=("float", 8.0),
        ),
        _spec(
            "logdet_rank1",
            CLASSIFICATION,
            "Greedy log-det maximisation on BADGE gradient embeddings (paper appendix, rank-1 Fisher)",
            lam=("float", 1.0),
        ),
        _spec("margin", CLASSIFICATION, "Margin: smallest gap between the top two probabilities", ("probs",)),
        _spec("random", BOTH, "Uniform sampling without replacement", ()),
        # Cold start (service.domain.coldstart): model-free, on the pool's embeddings.
        _spec(
            "typiclust",
            BOTH,
            "TypiClust: the most typical candidate of each of B (+ labeled) k-means clusters, uncovered "
            "clusters first (model-free cold start)",
            ("embeddings",),
            max_clusters=("int", 500),
            knn=("int", 20),
            min_cluster_size=("int", 5),
            kmeans_iters=("int", 50),
            kmeans_sample=("int", 20000),
            max_typicality_points=("int", 2000),
        ),
        # auto (selection.auto): a bandit over strategies; on a pool batch the worker builds history and cold.
        _spec(
            "auto",
            BOTH,
            "Auto: a bandit (EXP3.P, as in active learning by learning) chooses bait, badge, margin or random "
            "per round from this pool's evidence (the cold-start strategies while the pool is cold)",
            ("embeddings",),
            history=("Any", None),
            explore=("float", 0.1),
            explore_validated=("float | None", 0.0),
            gamma=("float", 0.1),
            prior_bait=("float", 0.9),
            cold=("bool | None", None),
            exclude_outliers=("bool", False),
            outlier_embeddings=("Any", None),
        ),
        _spec(
            "kmeanspp",
            BOTH,
            "k-means++ seeding on the embeddings, distances to labeled, reserved and chosen rows "
            "(model-free cold start)",
            ("embeddings",),
        ),
    )
}


def names() -> list[str]:
    return sorted(CATALOG)


def names_for(task: str) -> list[str]:
    return sorted(n for n, s in CATALOG.items() if task in s.tasks)


def cold_start_doc() -> dict[str, Any]:
    """The cold-start rule for ``GET /v1/strategies`` (which strategies it replaces, when, by what)."""
    return coldstart.describe([n for n, s in CATALOG.items() if coldstart.is_model_based(s.inputs)])


#: Where the defaults of :func:`defaults_doc` were chosen (tune half) and checked (held-out half).
DEFAULTS_EVIDENCE = "docs/results/heldout"


def defaults_doc() -> dict[str, Any]:
    """BAIT's defaults and the rule that chose them, for ``GET /v1/strategies``.

    The values are the catalog's own (so they cannot drift from what a request gets); the rule is the one
    ``python -m bench.experiments.heldout`` applied on the suite's tune half (``choice.json`` there;
    ``tests/bench/test_heldout_defaults.py`` fails when the catalog and that choice disagree).
    """
    bait = CATALOG["bait"].params
    return {
        "bait": {
            "lam": bait["lam"].default,
            "convention": bait["convention"].default,
            "oversample": bait["oversample"].default,
            "head": "mlp (the pool's default head; BAIT reads its penultimate features and probabilities)",
            "rule": (
                "one default for every task type (binary, multiclass, regression), pool size and class count: "
                "on the tune half of the offline suite lam = 0.01 had the best mean normalised area over random "
                "for each task type; a variant of the pipeline (convention 'paper', a linear head, a shorter "
                "training budget, raw embeddings as BAIT's features) replaces a default only when it is "
                "significantly better on a tune dataset and worse on none, and none was, so nothing depends on "
                "what the service knows about the pool"
            ),
            "chosen_on": "tune half: breast-cancer, pima, wine, digits, diabetes, concrete",
            "checked_on": "held-out half: sonar, ionosphere, fine-foods, fashion-mnist, boston, diamonds",
            "not_better_than_random_on": (
                "sonar and diamonds (never reach random's final score by 80 labels); small binary text tasks "
                "(ties random): see docs/concepts/strategies.md, 'Where BAIT does not help'"
            ),
            "evidence": DEFAULTS_EVIDENCE,
        },
    }


def get(name: Any) -> StrategySpec:
    """The strategy, or a 400 listing the valid names."""
    if not isinstance(name, str) or name not in CATALOG:
        raise BadRequest(
            f"unknown strategy {name!r}; valid strategies: {', '.join(names())}",
            details={"valid": names()},
        )
    return CATALOG[name]


def _type_ok(annotation: str, value: Any) -> bool:
    """Whether a JSON value fits an annotation like ``float``, ``int | None``, ``Literal['a', 'b']``."""
    for part in (p.strip() for p in _split_union(annotation)):
        if part == "None" and value is None:
            return True
        if part == "bool" and isinstance(value, bool):
            return True
        if part == "int" and isinstance(value, int) and not isinstance(value, bool):
            return True
        if part == "float" and isinstance(value, int | float) and not isinstance(value, bool):
            return math.isfinite(float(value))
        if part == "str" and isinstance(value, str):
            return True
        if part.startswith("Literal[") and value in _literal_values(part):
            return True
        if part == "Any":
            return True
    return False


def _split_union(annotation: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in annotation:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "|" and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    parts.append(cur)
    return parts


def _literal_values(part: str) -> tuple[Any, ...]:
    inner = ast.literal_eval("(" + part[len("Literal[") : -1] + ",)")
    return tuple(inner)


def check_request(
    name: Any, task: str, params: Any, dim: int | None = None, *, batch: bool = False
) -> tuple[StrategySpec, dict[str, Any]]:
    """Validate a strategy request for a task; returns the spec and the parameters.

    ``batch``: a pool batch, where ``params.cold_start`` (:mod:`service.domain.coldstart`) is also valid.

    Raises:
        BadRequest: unknown strategy (lists the valid ones), strategy not for ``task`` (lists those that
            are), params not an object, unknown parameter (lists the valid ones), parameter of the wrong type
            or out of its range (``lam <= 0``, a seed outside [0, 2^63), ``approx_dim`` above ``dim``...).
    """
    spec = get(name)
    if task not in spec.tasks:
        raise BadRequest(
            f"strategy {spec.name!r} supports {', '.join(spec.tasks)}, not {task}; "
            f"strategies for {task}: {', '.join(names_for(task))}",
            details={"valid": names_for(task)},
        )
    if params is None:
        params = {}
    if not isinstance(params, Mapping):
        raise BadRequest(f"params must be an object, got {type(params).__name__}")
    params_in = params
    extra: dict[str, Any] = {}
    if EXCLUDE_OUTLIERS in params and (batch or spec.name not in OUTLIER_PARAM_ON_SELECT):
        # a pool batch's own parameter (the worker applies it); on /v1/select only auto's, checked below
        value = params[EXCLUDE_OUTLIERS]
        if not batch:
            raise BadRequest(
                "params.exclude_outliers applies to pool batches only (the pool's distribution is known there), "
                "and on POST /v1/select to strategy 'auto' (the library's auto checks the embeddings you send); "
                "remove it from POST /v1/select",
                details={"param": EXCLUDE_OUTLIERS},
            )
        if not isinstance(value, bool):
            raise BadRequest(
                f"params.exclude_outliers must be true or false, got {value!r}",
                details={"param": EXCLUDE_OUTLIERS, "expected": "bool"},
            )
        extra[EXCLUDE_OUTLIERS] = value
        params = {k: v for k, v in params.items() if k != EXCLUDE_OUTLIERS}
    if batch and spec.name == "auto":
        built = sorted(set(params) & POOL_BUILT_PARAMS)
        if built:
            raise BadRequest(
                f"parameter(s) {', '.join(map(repr, built))} of strategy 'auto' are built by the service on a pool "
                "batch (from the pool's earlier batches and its labels); remove them",
                details={"param": built[0]},
            )
    if coldstart.PARAM in params and spec.name == "auto":
        raise BadRequest(
            "params.cold_start does not apply to strategy 'auto': it plays the model-free cold-start strategies "
            "itself while the pool is cold; remove params.cold_start",
            details={"param": coldstart.PARAM},
        )
    if coldstart.PARAM in params:
        coldstart.check_param(params[coldstart.PARAM], spec.name, spec.inputs, batch=batch)
        params = {k: v for k, v in params.items() if k != coldstart.PARAM}
        cold: dict[str, Any] = {coldstart.PARAM: params_in[coldstart.PARAM]}
    else:
        cold = {}
    allowed = {**{k: p.annotation for k, p in spec.params.items()}, **{k: a for k, (a, _) in COMMON_PARAMS.items()}}
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise BadRequest(
            f"unknown parameter(s) {', '.join(map(repr, unknown))} for strategy {spec.name!r}; "
            f"valid parameters: {', '.join(sorted(allowed))}",
            details={"valid": sorted(allowed)},
        )
    for key, value in params.items():
        if key in ARRAY_PARAMS:
            raise BadRequest(f"parameter {key!r} of strategy {spec.name!r} takes per-row arrays and cannot be set here")
        annotation = allowed[key]
        if not _type_ok(annotation, value):
            raise BadRequest(
                f"parameter {key!r} of strategy {spec.name!r} must be {annotation}, got {value!r}",
                details={"param": key, "expected": annotation},
            )
    for key, value in params.items():
        problem = _value_problem(key, value, params)
        if problem is not None:
            raise BadRequest(
                f"parameter {key!r} of strategy {spec.name!r} {problem}, got {value!r}",
                details={"param": key},
            )
    if task == "regression":
        class_approx = ("topc", "pca+topc", "sampled", "pca+sampled")
        if (
            params.get("approx") in class_approx
            or params.get("approx_classes") is not None
            or params.get("approx_samples") is not None
        ):
            raise BadRequest(
                f"strategy {spec.name!r}: class truncation (approx 'topc', approx_classes) needs a classification "
                "pool; regression is rank one already",
                details={"param": "approx" if params.get("approx_classes") is None else "approx_classes"},
            )
        prefilter = params.get("prefilter")
        if isinstance(prefilter, Mapping) and prefilter.get("score") == "margin":
            raise BadRequest("prefilter score 'margin' needs class probabilities; use 'gradnorm' for regression")
    approx_dim = params.get("approx_dim")
    if dim is not None and approx_dim is not None and approx_dim > dim:
        raise BadRequest(
            f"parameter 'approx_dim' of strategy {spec.name!r} must be at most the embedding dimension {dim}, "
            f"got {approx_dim}",
            details={"param": "approx_dim"},
        )
    return spec, {**params, **cold, **extra}


SEED_MAX = 2**63 - 1  # seeds are stored as signed 64-bit integers and fed to torch/numpy generators
CONVENTIONS = ("reference", "paper", "sum")
# selection.bait.APPROX_CHOICES: None/"auto" = exact when it fits the budgets, else the first plan that does.
APPROX_CHOICES = (None, "auto", "exact", "none", "pca", "topc", "pca+topc", "sampled", "pca+sampled")
PREFILTER_SCORES = ("gradnorm", "margin")


def _value_problem(key: str, value: Any, params: Mapping[str, Any]) -> str | None:
    """What the library would reject later about one (well-typed) parameter value, checked before the
    job is queued so a bad request is a 400, never a failed job. ``None`` when the value is fine."""
    approx = params.get("approx")
    if value is None:
        return None
    if key == "seed" and not 0 <= value <= SEED_MAX:
        return f"must be an integer in [0, {SEED_MAX}]"
    if key in ("lam", "max_memory_gb", "time_budget_s") and not value > 0:
        return "must be a finite number > 0"
    if key == "max_memory_gb" and value > 1024:
        return "must be at most 1024 (GB)"
    if key == "time_budget_s" and value > 7 * 86400:
        return "must be at most a week (604800 s)"
    if key == "oversample" and not 1 <= value <= 100:
        return "must be a number in [1, 100]"
    if key == "convention" and value not in CONVENTIONS:
        return f"must be one of {', '.join(CONVENTIONS)}"
    if key == "approx" and value not in APPROX_CHOICES:
        return "must be null/'auto', 'exact', 'pca', 'topc', 'pca+topc', 'sampled' or 'pca+sampled'"
    if key == "approx_dim":
        if approx not in (None, "auto", "pca", "pca+topc", "pca+sampled"):
            return "is only used with approx='pca', 'pca+topc' or 'pca+sampled' (or auto)"
        if not 1 <= value <= 65536:
            return "must be an integer in [1, 65536] (and at most the embedding dimension)"
    if key == "approx_classes":
        if approx not in (None, "auto", "topc", "pca+topc", "sampled", "pca+sampled"):
            return "is only used with approx='topc' or 'pca+topc' (or auto)"
        if value < (0 if approx in ("sampled", "pca+sampled") else 1):
            return "must be an integer >= 1 (>= 0 with 'sampled'; and below the number of classes)"
    if key == "approx_samples":
        if approx not in ("sampled", "pca+sampled"):
            return "is only used with approx='sampled' or 'pca+sampled'"
        if value < 1:
            return "must be an integer >= 1 (and below the number of classes)"
    if key == "prefilter":
        return _prefilter_problem(value)
    if key in ("explore", "explore_validated") and value is not None and not 0 <= value <= 1:
        return "must be a number in [0, 1]"
    if key == "gamma" and not 0 < value <= 1:
        return "must be a number in (0, 1]"
    if key == "prior_bait" and not 0 <= value <= 1:
        return "must be a number in [0, 1]"
    if key == "history":
        return _history_problem(value)
    if key in COLD_START_LIMITS:
        lo, hi = COLD_START_LIMITS[key]
        if not lo <= value <= hi:
            return f"must be an integer in [{lo}, {hi}]"
    return None


# typiclust's integer parameters: the library's minimum, and a ceiling that keeps one job's time bounded.
COLD_START_LIMITS: dict[str, tuple[int, int]] = {
    "max_clusters": (1, 10_000),
    "knn": (1, 1_000),
    "min_cluster_size": (1, 1_000_000),
    "kmeans_iters": (1, 1_000),
    "kmeans_sample": (1, 1_000_000),
    "max_typicality_points": (2, 20_000),
}


def _prefilter_problem(value: Any) -> str | None:
    if value in ("auto", "none") or value is False:
        return None
    if not isinstance(value, Mapping):
        return 'must be null/\'auto\', \'none\' or an object like {"top": 5000, "random": 1000, "score": "gradnorm"}'
    unknown = sorted(set(value) - {"top", "random", "score", "seed"})
    if unknown:
        return f"has unknown keys {unknown} (valid: top, random, score, seed)"
    for k in ("top", "random"):
        v = value.get(k, 0)
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 10**9:
            return f"needs {k!r} as an integer in [0, 10^9]"
    if value.get("top", 0) + value.get("random", 0) == 0:
        return "keeps no candidate: set 'top' and/or 'random' > 0"
    if value.get("score", "gradnorm") not in PREFILTER_SCORES:
        return f"needs 'score' to be one of {', '.join(PREFILTER_SCORES)}"
    seed = value.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= SEED_MAX):
        return f"needs 'seed' as an integer in [0, {SEED_MAX}]"
    return None


def _history_problem(value: Any) -> str | None:
    """The shape of auto's ``history`` (the library checks the values again): a list of rounds with the
    required keys, per-pick lists of one length, known arms."""
    if not isinstance(value, list):
        return "must be a list of rounds (objects with arm, arms, picks, labels, probabilities)"
    if len(value) > AUTO_MAX_ROUNDS:
        return f"has more than {AUTO_MAX_ROUNDS} rounds"
    for i, r in enumerate(value):
        if not isinstance(r, Mapping):
            return f"must be a list of objects; entry {i} is {type(r).__name__}"
        unknown = sorted(set(r) - set(AUTO_ROUND_KEYS))
        if unknown:
            return f"entry {i} has unknown key(s) {unknown} (valid: {', '.join(AUTO_ROUND_KEYS)})"
        missing = [k for k in ("arm", "arms", "picks", "labels", "probabilities") if k not in r]
        if missing:
            return f"entry {i} lacks {', '.join(missing)}"
        if r["arm"] not in AUTO_ARMS:
            return f"entry {i} has unknown arm {r['arm']!r} (arms: {', '.join(AUTO_ARMS)})"
        lists = {k: r[k] for k in ("arms", "picks", "labels", "predictions") if k in r}
        if not all(isinstance(v, list) for v in lists.values()):
            return f"entry {i}: arms, picks, labels and predictions must be lists (one entry per pick)"
        if len({len(v) for v in lists.values()}) != 1:
            return f"entry {i}: arms, picks, labels and predictions must have one entry per pick (same length)"
        bad = sorted({str(a) for a in r["arms"] if a not in AUTO_ARMS})
        if bad:
            return f"entry {i} has unknown arm(s) {bad} in arms (arms: {', '.join(AUTO_ARMS)})"
        if not isinstance(r["probabilities"], Mapping):
            return f"entry {i}: probabilities must be an object {{arm: probability}}"
    return None

"""``auto``: choose the strategy per round from the evidence gathered on this pool (a bandit over strategies).

Each call is one round. The caller keeps the history of earlier rounds (what ``auto`` returned in
``diagnostics["auto"]`` plus the labels as they came back) and passes it as ``history``. The bandit is
recomputed from that history every round, so a round depends only on the history and the seed.

Arms. A warm pool: ``bait``, ``badge``, ``margin``, ``random`` for classification; ``bait``, ``random`` for
regression. A cold pool: the model-free ``typiclust``, ``kmeanspp`` and ``random``. Which pool is cold is the
caller's rule (``cold``), the same one its fixed model-based strategies obey, so that ``auto`` plays a model
arm exactly when a fixed ``bait`` would run: the service passes its cold-start rule (fewer than 2 labels per
class, a class without a label, a regression pool without a label), under which its fixed ``bait`` is
replaced by a cold-start strategy too. Without ``cold`` the library's own rule applies (:func:`is_cold`): the
pool is cold only when the model arms cannot run (classification without ``probs``, regression without a
label), as the library's fixed ``bait``, which has no cold rule, runs on whatever head gave the ``probs``.

Outliers. With ``exclude_outliers`` (off by default) the candidates that the pool's robust outlier rule flags
(:func:`selection.outliers.robust_outliers`, the rule of the service's ``params.exclude_outliers``, on
``outlier_embeddings``: the pool's own embeddings, or ``embeddings`` when not given) are left out of the pool
before the arm selects and before the exploration draw: BAIT seeks extreme inputs and picks a corrupt row
first (held-out diamonds), and a bandit that plays ``bait`` inherits that. Labeled and reserved rows stay. For
the arms that read every pool row (``bait``'s Fisher of the pool, ``typiclust``'s clusters) the flagged rows
leave the pool (a copy without them); the others read only the candidates and the design, so leaving the rows
out of the candidates selects the same without the copy. The cost: the rule's statistics on a 5,000-row sample
and one pass over the pool's rows (``O(5000 d + n d)``), plus that copy when a candidate is flagged and the arm
reads every row.

A round. The bandit's distribution over the arms is EXP3.P's (Auer et al. 2002; EXP4.P with one expert per
arm, as in "Active learning by learning", Hsu & Lin 2015): ``q_a = (1 - gamma) w_a / sum(w) + gamma / K``.
One arm is drawn from ``q`` with the seed; it fills ``B - E`` slots of the batch; ``E = round(explore * B)``
slots (0 when ``B = 1``) are drawn uniformly at random from the remaining candidates (arm ``random``): the
uniform picks the importance-weighted reward below reads. Once the evidence is validation gains, which do not
read them, ``explore_validated`` replaces ``explore``: 0 by default, chosen on the tune half (the variant with
``explore``'s 0.1 kept was significantly below the best fixed strategy on as many tune datasets and lower on
average), so a caller that reports validation scores pays for uniform picks only until they arrive.

The reward of round ``t`` (known once round ``t + 1``'s picks are labeled; rewards arrive one round late):

* **validation gains** when the two latest rounds have the validation score of the model each selected with
  (``validation``, in [0, 1]: accuracy, or R^2 for regression) and ``n_labels`` (earlier rounds without them,
  e.g. cold rounds that trained no model, are then not scored): the gain of the model
  from round ``t`` to round ``t + 1`` in points per 100 labels, ``g = 100 * (v_{t+1} - v_t) * 100 /
  (n_{t+1} - n_t)``, mapped to ``r = clip(0.5 + g / 20, 0, 1)`` (+-10 points per 100 labels saturate);
* otherwise **importance-weighted accuracy** of the model trained after round ``t``'s labels (the one that
  made round ``t + 1``'s predictions at selection time, before those items were labeled, so they are held
  out): on round ``t + 1``'s uniform picks (arm ``random``), a uniform sample of the unlabeled pool, whose
  plain mean is the Horvitz-Thompson (importance-weighted) estimate of that model's accuracy on the pool;
  when round ``t + 1`` has no labeled uniform pick, on all its labeled picks with weight ``1 / q_{t+1}(arm
  of the pick)`` (self-normalised; marked ``biased``). Regression: ``clip(1 - MSE / variance of the labels)``
  with the same weights.

The prior. With rounds of tens of labels and a horizon of ten rounds, the evidence moves EXP3.P's weights by
a few percent, so from uniform weights ``auto`` plays each arm about equally and ends between them: below the
best fixed strategy wherever one arm clearly leads (held-out fashion-mnist and dna, paired over 10 seeds).
So the warm arms start from a prior, ``prior_bait`` on ``bait`` (the best strategy on average on the tune
half, and the best column of the paper's penalty matrix) and the rest shared equally by the other arms,
as the initial weights ``w_a``; the evidence then moves them as below. ``prior_bait = 1 / K`` is the uniform
start. Cold rounds (no ``bait`` in play) start uniform.

The update of EXP3.P for the played arm ``a_t`` with probability ``q_t(a_t)`` (the arm's selection
probability is the importance weight that makes the per-arm reward estimate unbiased):
``log w_a += gamma / (3 K) * (r_t [a = a_t] / q_t(a) + alpha / (q_t(a) sqrt(K T)))`` with
``alpha = 2 sqrt(ln(K T / delta))``, ``T = 100`` rounds and ``delta = 0.05``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from selection.baselines import _to_numpy
from selection.errors import ParameterError
from selection.outliers import robust_outliers
from selection.problem import REGISTRY, Problem, StrategyOutput, register

WARM_ARMS = {"classification": ("bait", "badge", "margin", "random"), "regression": ("bait", "random")}
COLD_ARMS = ("typiclust", "kmeanspp", "random")
ALL_ARMS = frozenset(WARM_ARMS["classification"]) | frozenset(COLD_ARMS)
HORIZON = 100
DELTA = 0.05
#: Initial weight of ``bait`` among the warm arms (see the module's "The prior"), chosen on the tune half.
PRIOR_BAIT = 0.9
#: The bandit's mixing with the uniform distribution by default, chosen with PRIOR_BAIT.
GAMMA = 0.1
#: The uniform share once the evidence is validation gains (chosen on the tune half; ``explore`` before that).
EXPLORE_VALIDATED = 0.0
#: Points of validation accuracy per 100 labels at which the validation reward saturates (0 or 1).
GAIN_SCALE = 10.0
ROUND_KEYS = frozenset({"arm", "arms", "picks", "labels", "predictions", "probabilities", "validation", "n_labels"})
REQUIRED_KEYS = ("arm", "arms", "picks", "labels", "probabilities")


@dataclass(frozen=True)
class Round:
    """One validated round of the history."""

    arm: str
    arms: list[str]
    picks: list[int]
    labels: list[Any]
    predictions: list[Any]
    probabilities: dict[str, float]
    validation: float | None
    n_labels: int | None


def is_cold(problem: Problem) -> bool:
    """The library's cold rule: cold only when the model arms cannot run, as the library's fixed strategies have
    no cold rule of their own (a fixed ``bait`` runs on any ``probs``): classification without probabilities,
    regression without a label (no model to give the embeddings). A caller with a cold-start rule for its fixed
    strategies (the service's: fewer than 2 labels per class) passes ``cold`` instead."""
    if problem.task == "classification":
        return problem.probs is None
    return int(problem.labeled.numel()) < 1


def _is_label(v: Any) -> bool:
    if v is None or isinstance(v, bool):
        return v is None
    if isinstance(v, int | float | str):
        return not isinstance(v, float) or math.isfinite(v)
    if isinstance(v, list | tuple):
        return all(isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) for x in v)
    return False


def _per_pick(i: int, key: str, value: Any, m: int) -> list[Any]:
    if isinstance(value, str | bytes | Mapping) or not isinstance(value, Sequence | np.ndarray):
        raise ParameterError(f"history[{i}].{key} must be a list with one entry per pick, got {type(value).__name__}")
    out = list(value.tolist() if isinstance(value, np.ndarray) else value)
    if len(out) != m:
        raise ParameterError(f"history[{i}].{key} has {len(out)} entries but the round has {m} picks")
    return out


def check_history(history: Any) -> list[Round]:
    """Validate the caller's history (a list of rounds, oldest first; see :func:`auto`).

    Raises:
        ParameterError: not a list of objects, a missing or unknown key, per-pick lists of different lengths,
            an unknown arm, probabilities outside (0, 1] or not summing to 1, a label or prediction that is
            not a number, a class, a list of numbers or null.
    """
    if history is None:
        return []
    if isinstance(history, str | bytes | Mapping) or not isinstance(history, Sequence):
        raise ParameterError(f"history must be a list of rounds (objects), got {type(history).__name__}")
    rounds: list[Round] = []
    for i, r in enumerate(history):
        if not isinstance(r, Mapping):
            raise ParameterError(f"history[{i}] must be an object with keys {', '.join(REQUIRED_KEYS)}")
        unknown = sorted(set(map(str, r)) - ROUND_KEYS)
        if unknown:
            raise ParameterError(f"history[{i}] has unknown key(s) {unknown}; valid keys: {sorted(ROUND_KEYS)}")
        missing = [k for k in REQUIRED_KEYS if k not in r]
        if missing:
            raise ParameterError(f"history[{i}] lacks {', '.join(missing)}")
        arm = r["arm"]
        if arm not in ALL_ARMS:
            raise ParameterError(f"history[{i}].arm {arm!r} is not an arm of auto; arms: {', '.join(sorted(ALL_ARMS))}")
        picks = _per_pick(i, "picks", r["picks"], len(r["picks"]) if isinstance(r["picks"], Sequence) else -1)
        if not picks or not all(isinstance(p, int | np.integer) and not isinstance(p, bool) and p >= 0 for p in picks):
            raise ParameterError(f"history[{i}].picks must be a non-empty list of non-negative row indices")
        m = len(picks)
        arms = _per_pick(i, "arms", r["arms"], m)
        bad = sorted({str(a) for a in arms if a not in ALL_ARMS})
        if bad:
            raise ParameterError(f"history[{i}].arms has unknown arm(s) {bad}; arms: {', '.join(sorted(ALL_ARMS))}")
        labels = _per_pick(i, "labels", r["labels"], m)
        preds = _per_pick(i, "predictions", r.get("predictions", [None] * m), m)
        for key, values in (("labels", labels), ("predictions", preds)):
            for j, v in enumerate(values):
                if not _is_label(v):
                    raise ParameterError(
                        f"history[{i}].{key}[{j}] must be a class, a number, a list of numbers or null, got {v!r}"
                    )
        probs = r["probabilities"]
        if not isinstance(probs, Mapping) or not probs:
            raise ParameterError(f"history[{i}].probabilities must be an object {{arm: probability}}")
        q: dict[str, float] = {}
        for a, p in probs.items():
            if a not in ALL_ARMS:
                raise ParameterError(f"history[{i}].probabilities has unknown arm {a!r}")
            if isinstance(p, bool) or not isinstance(p, int | float) or not 0 < p <= 1:
                raise ParameterError(f"history[{i}].probabilities[{a!r}] must be in (0, 1], got {p!r}")
            q[str(a)] = float(p)
        if abs(sum(q.values()) - 1.0) > 1e-6:
            raise ParameterError(f"history[{i}].probabilities must sum to 1, got {sum(q.values()):.6g}")
        if arm not in q:
            raise ParameterError(f"history[{i}].probabilities lacks the round's arm {arm!r}")
        val = r.get("validation")
        if val is not None and (isinstance(val, bool) or not isinstance(val, int | float) or not math.isfinite(val)):
            raise ParameterError(f"history[{i}].validation must be a finite number or null, got {val!r}")
        nl = r.get("n_labels")
        if nl is not None and (isinstance(nl, bool) or not isinstance(nl, int) or nl < 0):
            raise ParameterError(f"history[{i}].n_labels must be a non-negative integer or null, got {nl!r}")
        rounds.append(
            Round(
                str(arm),
                [str(a) for a in arms],
                [int(p) for p in picks],
                labels,
                preds,
                q,
                None if val is None else float(val),
                nl,
            )
        )
    return rounds


def _correct(label: Any, pred: Any) -> float:
    return float(str(label) == str(pred))


def _iw_reward(nxt: Round, task: str) -> tuple[float, bool] | None:
    """Importance-weighted accuracy (1 - MSE / variance for regression) of the model that selected ``nxt``
    on ``nxt``'s labeled, predicted picks; ``(reward, biased)`` or None without any such pick."""
    seen = [j for j in range(len(nxt.picks)) if nxt.labels[j] is not None and nxt.predictions[j] is not None]
    if not seen:
        return None
    uniform = [j for j in seen if nxt.arms[j] == "random"]
    use, biased = (uniform, False) if uniform else (seen, True)
    w = np.array([1.0 / nxt.probabilities.get(nxt.arms[j], 1.0) if biased else 1.0 for j in use])
    if task == "classification":
        hits = np.array([_correct(nxt.labels[j], nxt.predictions[j]) for j in use])
        return float((w * hits).sum() / w.sum()), biased
    y = np.array([np.atleast_1d(np.asarray(nxt.labels[j], dtype=np.float64)).mean() for j in use])
    p = np.array([np.atleast_1d(np.asarray(nxt.predictions[j], dtype=np.float64)).mean() for j in use])
    mse = float((w * (y - p) ** 2).sum() / w.sum())
    mean = float((w * y).sum() / w.sum())
    var = float((w * (y - mean) ** 2).sum() / w.sum())
    return float(np.clip(1.0 - mse / var, 0.0, 1.0)) if var > 0 else float(mse == 0.0), biased


@dataclass
class _Evidence:
    mode: str
    rewards: list[tuple[int, str, float]]  # (round index, arm played, reward) per scored round
    gains: list[tuple[str, float]]  # (arm, points per 100 labels) in validation mode
    biased: int


def _evidence(rounds: list[Round], task: str) -> _Evidence:
    pairs = list(itertools.pairwise(rounds))

    def scored(a: Round, b: Round) -> bool:
        return None not in (a.validation, b.validation, a.n_labels, b.n_labels)

    # validation gains when the latest pair of rounds has them (earlier rounds without, e.g. cold ones that
    # trained no model, are then not scored); importance-weighted accuracy otherwise
    validation = bool(pairs) and scored(*pairs[-1])
    rewards: list[tuple[int, str, float]] = []
    gains: list[tuple[str, float]] = []
    biased = 0
    for t, (a, b) in enumerate(pairs):
        if validation and not scored(a, b):
            continue
        if validation:
            assert a.validation is not None and b.validation is not None
            assert a.n_labels is not None and b.n_labels is not None
            g = 100.0 * (b.validation - a.validation) * 100.0 / max(1, b.n_labels - a.n_labels)
            gains.append((a.arm, g))
            rewards.append((t, a.arm, float(np.clip(0.5 + g / (2 * GAIN_SCALE), 0.0, 1.0))))
            continue
        iw = _iw_reward(b, task)
        if iw is not None:
            rewards.append((t, a.arm, iw[0]))
            biased += iw[1]
    return _Evidence("validation" if validation else "importance_weighted_accuracy", rewards, gains, biased)


def prior_weights(arms: Sequence[str], prior_bait: float) -> dict[str, float]:
    """Initial weights: ``prior_bait`` on ``bait`` and the rest shared by the other arms (uniform when ``bait``
    is not in play, or with one arm)."""
    if "bait" not in arms or len(arms) < 2:
        return {a: 1.0 / len(arms) for a in arms}
    rest = (1.0 - prior_bait) / (len(arms) - 1)
    return {a: (prior_bait if a == "bait" else rest) for a in arms}


def bandit(
    rounds: list[Round], arms: Sequence[str], gamma: float, task: str, prior_bait: float | None = None
) -> tuple[dict[str, float], _Evidence]:
    """EXP3.P's distribution over ``arms`` after the history (from :func:`prior_weights`; ``prior_bait=None``:
    :data:`PRIOR_BAIT`), and the evidence it came from."""
    ev = _evidence(rounds, task)
    K = len(arms)
    alpha = 2.0 * math.sqrt(math.log(K * HORIZON / DELTA))
    prior = prior_weights(arms, PRIOR_BAIT if prior_bait is None else prior_bait)
    # a zero prior (prior_bait = 1 leaves the other arms none) keeps the arm at gamma / K, never -inf
    logw = {a: math.log(max(prior[a], 1e-300)) for a in arms}
    for t, arm, reward in ev.rewards:
        for a in arms:
            q = rounds[t].probabilities.get(a)
            if q is None:  # the arm was not in play that round (cold and warm rounds have different arms)
                continue
            x = reward / q if a == arm else 0.0
            logw[a] += gamma / (3 * K) * (x + alpha / (q * math.sqrt(K * HORIZON)))
    top = max(logw.values())
    w = {a: math.exp(v - top) for a, v in logw.items()}
    total = sum(w.values())
    return {a: (1 - gamma) * w[a] / total + gamma / K for a in arms}, ev


def _summary(arm: str, ev: _Evidence) -> tuple[str, dict[str, Any]]:
    """Per-arm evidence and the one line the dashboard shows."""
    per: dict[str, dict[str, Any]] = {}
    for _, a, rew in ev.rewards:
        e = per.setdefault(a, {"rounds": 0, "reward": 0.0})
        e["rounds"] += 1
        e["reward"] += rew
    for e in per.values():
        e["reward"] = e["reward"] / e["rounds"]
    if ev.mode == "validation":
        for a, g in ev.gains:
            per[a].setdefault("gain_sum", 0.0)
            per[a]["gain_sum"] += g
        for e in per.values():
            e["gain_per_100_labels"] = e.pop("gain_sum") / e["rounds"]
    mine = per.get(arm)
    if mine is None:
        return f"{arm} chosen: no evidence on this pool yet ({len(ev.rewards)} round(s) scored)", per
    if ev.mode == "validation":
        g = mine["gain_per_100_labels"]
        base = per.get("random")
        if base is not None and arm != "random":
            diff = g - base["gain_per_100_labels"]
            return (
                f"{arm} chosen: {diff:+.1f} points of validation accuracy per 100 labels over random, "
                f"{mine['rounds']} round(s)",
                per,
            )
        return f"{arm} chosen: {g:+.1f} points of validation accuracy per 100 labels, {mine['rounds']} round(s)", per
    line = f"{arm} chosen: reward {mine['reward']:.3f} (importance-weighted accuracy), {mine['rounds']} round(s)"
    base = per.get("random")
    if base is not None and arm != "random":
        line += f"; random {base['reward']:.3f} over {base['rounds']} round(s)"
    return line, per


#: Rows listed in ``diagnostics["auto"]["outliers"]["excluded_rows"]`` at most.
MAX_LISTED = 100
#: Arms that read every row of the pool, not only the candidates and the design: bait (the pool's Fisher) and
#: typiclust (its clusters). Outliers leave the pool for them; for the others they leave the candidates.
READS_EVERY_ROW = frozenset({"bait", "typiclust"})


def _outlier_source(problem: Problem, outlier_embeddings: Any) -> tuple[Any, str]:
    """What the outlier rule reads: ``outlier_embeddings`` (one row per pool row) or the problem's embeddings."""
    if outlier_embeddings is None:
        return problem.X, "embeddings"
    if not isinstance(outlier_embeddings, torch.Tensor | np.ndarray):
        raise ParameterError(
            f"outlier_embeddings must be an n x d array (numpy or torch), got {type(outlier_embeddings).__name__}"
        )
    shape = tuple(outlier_embeddings.shape)
    if len(shape) != 2 or shape[0] != problem.n or shape[1] < 1:
        raise ParameterError(f"outlier_embeddings must have shape ({problem.n}, d) like the pool, got {shape}")
    return outlier_embeddings, "outlier_embeddings"


def outlier_candidates(problem: Problem, outlier_embeddings: Any = None) -> tuple[np.ndarray, dict[str, Any]]:
    """The candidates that :func:`selection.outliers.robust_outliers` flags (statistics from the pool's sample under
    the problem's seed, as the service's check), sorted, and what was found (``diagnostics["auto"]["outliers"]``).

    Were fewer than ``batch_size`` candidates left without them, the least extreme flagged ones are kept back in
    (``kept_back``) so the batch keeps its size.
    """
    source, on = _outlier_source(problem, outlier_embeddings)
    rep = robust_outliers(source, seed=problem.seed)
    cand = problem.candidates.cpu().numpy()
    hit = rep.flagged[cand]
    flagged = cand[hit]
    short = problem.batch_size - (cand.shape[0] - flagged.shape[0])
    kept_back = np.zeros(0, dtype=np.int64)
    if short > 0:  # not enough candidates without them: keep back in the least extreme ones
        order = np.argsort(rep.distances[flagged], kind="stable")
        kept_back = np.sort(flagged[order[:short]])
        flagged = np.setdiff1d(flagged, kept_back)
    info: dict[str, Any] = {
        **rep.as_dict(),
        "checked": True,
        "on": on,
        "n_checked": int(cand.shape[0]),
        "n_flagged": int(hit.sum()),
        "n_excluded": int(flagged.shape[0]),
        "excluded_rows": flagged[:MAX_LISTED].tolist(),
        "kept_back": kept_back.tolist(),
    }
    return flagged, info


def without_rows(problem: Problem, rows: np.ndarray, *, every_row: bool) -> tuple[Problem, np.ndarray | None]:
    """The problem without the candidate ``rows``, and the map from its rows to the caller's (``None``: the same
    rows). ``every_row`` (an arm in :data:`READS_EVERY_ROW`): the rows leave the pool (a copy of the embeddings
    and probabilities without them). Otherwise they leave only the candidates: an arm that reads nothing but the
    candidates and the design then selects exactly what it would on the pool without them (the row order is kept,
    so ties go the same way), without the copy."""
    cand = problem.candidates.cpu().numpy()
    drop = np.zeros(problem.n, dtype=bool)
    drop[rows] = True
    left = cand[~drop[cand]]
    if not every_row:
        return replace(problem, candidates=torch.as_tensor(left, device=problem.device)), None
    keep = np.flatnonzero(~drop)
    position = np.cumsum(~drop) - 1  # a kept row's position in the pool without the dropped ones

    def moved(r: np.ndarray) -> torch.Tensor:
        return torch.as_tensor(position[r], dtype=torch.int64, device=problem.device)

    rows_t = torch.as_tensor(keep, device=problem.device)
    sub = replace(
        problem,
        X=problem.X[rows_t],
        probs=None if problem.probs is None else problem.probs[rows_t],
        labeled=moved(problem.labeled.cpu().numpy()),
        reserved=moved(problem.reserved.cpu().numpy()),
        candidates=moved(left),
    )
    return sub, keep


def _check_float(name: str, value: Any, lo: float, hi: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise ParameterError(f"{name} must be a number in [{lo}, {hi}], got {value!r}")
    return float(value)


@register(
    "auto",
    tasks=("classification", "regression"),
    summary="Auto: a bandit (EXP3.P, as in active learning by learning) chooses bait, badge, margin or random "
    "per round from this pool's evidence (the cold-start strategies while the pool is cold)",
    inputs=("embeddings",),
)
def auto(
    problem: Problem,
    *,
    history: Any = None,
    explore: float = 0.1,
    explore_validated: float | None = EXPLORE_VALIDATED,
    gamma: float = GAMMA,
    prior_bait: float = PRIOR_BAIT,
    cold: bool | None = None,
    exclude_outliers: bool = False,
    outlier_embeddings: Any = None,
) -> StrategyOutput:
    """One round of the ``auto`` bandit (see the module for the rule).

    Args:
        problem: any task. Classification reads ``probs`` when the pool is warm (then they are required).
        history: earlier rounds, oldest first; each an object with ``arm`` (the arm drawn), ``arms`` (the arm
            of each pick: the drawn one, or ``random`` for exploration picks), ``picks`` (row indices),
            ``labels`` (per pick, null until labeled), ``probabilities`` (the bandit's ``{arm: q}`` that round),
            and optionally ``predictions`` (per pick, the model's prediction at selection time: a class or a
            number), ``validation`` (the validation score, in [0, 1], of the model that selected the round)
            and ``n_labels`` (labels that model was trained on). ``diagnostics["auto"]["round"]`` of the
            previous call is such an object, labels still null.
        explore: share of the batch drawn uniformly at random (rounded; 0 for a batch of one), in [0, 1].
        explore_validated: the share instead of ``explore`` once the evidence is validation gains (the
            history's two latest rounds carry ``validation`` and ``n_labels``): those rewards do not read the
            uniform picks, which then only cost what the arm would have picked. ``None``: ``explore``.
            Default :data:`EXPLORE_VALIDATED` (0).
        gamma: the bandit's exploration over arms, in (0, 1].
        prior_bait: the initial weight of ``bait`` among the warm arms, in [0, 1] (the other arms share the
            rest; ``1 / K`` starts uniform).
        cold: whether the pool is cold (model-free arms): pass the rule your fixed strategies obey (the service
            passes its cold-start rule); ``None`` applies :func:`is_cold` (cold only without ``probs`` for
            classification, without a label for regression).
        exclude_outliers: leave the candidates that the robust outlier rule flags out of the pool before the
            arm selects and before the exploration draw (see the module); ``False`` (the default, chosen on the
            tune half) keeps every candidate.
        outlier_embeddings: ``n x d'`` embeddings the rule reads, one row per pool row: the pool's own
            embeddings when ``embeddings`` are a model's features (what the service checks; the rule on a
            head's ReLU features flags rows the pool's inputs do not); ``None`` reads ``embeddings``.

    Returns:
        Candidate rows in pick order (the drawn arm's picks, then the exploration picks); diagnostics
        ``auto``: ``arm``, ``cold``, ``arms_in_play``, ``probabilities``, ``explore`` (picks), ``evidence``
        (``mode``, ``rounds``, ``per_arm``, ``biased_rounds``), ``summary`` (one line), ``outliers`` (with
        ``exclude_outliers``: the rule's numbers, ``on``, ``n_checked``, ``n_flagged``, ``n_excluded``, up to
        100 ``excluded_rows`` and ``kept_back``; else ``{"checked": false}``) and ``round`` (this round as a
        history entry) plus the arm's own diagnostics under ``arm_diagnostics``.

    Raises:
        ParameterError: a malformed history, a parameter out of range, ``exclude_outliers`` not a boolean,
            ``outlier_embeddings`` not an array of the pool's rows, or a warm classification pool without
            probabilities.
        InputDataError: ``outlier_embeddings`` not finite.
    """
    explore_ = _check_float("explore", explore, 0.0, 1.0)
    explore_val = explore_
    if explore_validated is not None:
        explore_val = _check_float("explore_validated", explore_validated, 0.0, 1.0)
    gamma_ = _check_float("gamma", gamma, 1e-9, 1.0)
    prior_ = _check_float("prior_bait", prior_bait, 0.0, 1.0)
    if cold is not None and not isinstance(cold, bool):
        raise ParameterError(f"cold must be true, false or null, got {cold!r}")
    if not isinstance(exclude_outliers, bool):
        raise ParameterError(f"exclude_outliers must be true or false, got {exclude_outliers!r}")
    if outlier_embeddings is not None and not exclude_outliers:
        raise ParameterError("outlier_embeddings is read only with exclude_outliers=true")
    rounds = check_history(history)
    cold_ = is_cold(problem) if cold is None else cold
    if not cold_ and problem.task == "classification" and problem.probs is None:
        raise ParameterError("auto on a warm classification pool needs probs (the model's class probabilities)")
    arms = COLD_ARMS if cold_ else WARM_ARMS[problem.task]
    if problem.task == "classification" and not cold_ and problem.k < 2:
        arms = ("bait", "random")
    q, ev = bandit(rounds, arms, gamma_, problem.task, prior_)
    rng = np.random.default_rng(problem.seed)
    qs = np.array([q[a] for a in arms])
    arm = arms[int(rng.choice(len(arms), p=qs / qs.sum()))]

    work, keep, outliers = problem, None, {"checked": False}
    if exclude_outliers:
        flagged, outliers = outlier_candidates(problem, outlier_embeddings)
        if flagged.shape[0]:
            work, keep = without_rows(problem, flagged, every_row=arm in READS_EVERY_ROW)
    B = problem.batch_size
    share = explore_val if ev.mode == "validation" else explore_
    n_explore = 0 if B == 1 or arm == "random" else min(B - 1, round(share * B))
    main = B - n_explore
    sub = replace(work, batch_size=main, seed=int(rng.integers(2**31)))
    out = REGISTRY[arm].fn(sub)
    picks = np.asarray(out.indices, dtype=np.int64)
    if n_explore:
        cand = work.candidates.cpu().numpy()
        rest = cand[~np.isin(cand, picks)]
        g = torch.Generator(device="cpu")
        g.manual_seed(int(rng.integers(2**31)))
        extra = rest[torch.randperm(rest.shape[0], generator=g)[:n_explore].numpy()]
        picks = np.concatenate([picks, extra])
    if keep is not None:
        picks = keep[picks]  # rows of the pool without the outliers -> rows of the caller's pool
    pick_arms = [arm] * main + ["random"] * n_explore
    preds: list[Any] = [None] * B
    if problem.probs is not None and not cold_:
        rows = torch.as_tensor(picks, device=problem.device)
        preds = _to_numpy(problem.probs[rows].argmax(dim=1)).tolist()
    line, per_arm = _summary(arm, ev)
    this_round = {
        "arm": arm,
        "arms": pick_arms,
        "picks": picks.tolist(),
        "labels": [None] * B,
        "predictions": preds,
        "probabilities": dict(q),
    }
    return StrategyOutput(
        indices=picks,
        objective=None,
        diagnostics={
            "auto": {
                "arm": arm,
                "cold": cold_,
                "arms_in_play": list(arms),
                "probabilities": dict(q),
                "explore": n_explore,
                "evidence": {
                    "mode": ev.mode,
                    "rounds": len(rounds),
                    "rounds_scored": len(ev.rewards),
                    "biased_rounds": ev.biased,
                    "per_arm": per_arm,
                },
                "summary": line,
                "outliers": outliers,
                "round": this_round,
                "arm_diagnostics": out.diagnostics,
            }
        },
    )

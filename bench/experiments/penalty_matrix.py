"""The paper's pairwise penalty matrix (Ash et al. 2021, Sec. 5, after Ash et al. 2020).

For every experiment (an (experiment, config) pair of a results table):

1. Random's mean curve over seeds; ``r`` is the first round whose mean is within ``tol`` (1%,
   relative) of random's final mean. (Without random in an experiment, ``reference`` names another.)
2. The labeling budgets are ``L_k = M_0 + 2^k B <= labels(r)``, ``k = 0, 1, ...``, with ``M_0`` the
   labels at round 0 and ``B`` the batch size; ``z`` is how many of them there are.
3. At each budget, for every ordered pair of strategies (i, j), the paired t-score over the seeds
   both have, ``t = sqrt(N) mean(e_i - e_j) / std(e_i - e_j, ddof=1)``, with ``e`` the accuracy (or
   minus the error, so that larger is better). If ``t > threshold``, i beat j: ``P[i, j] += 1/z``.

With ``all_rounds=True`` step 2 is replaced by every round after round 0 that the reference reached
(``L = M_0 + B, M_0 + 2B, ...``), so comparisons past random's convergence count too; ``z`` is then
the number of rounds. Round 0 is left out: no strategy has chosen anything yet, the labels (and so
the scores) are the same for all of them.

The threshold is the two-sided 5% Student-t critical value for ``N - 1`` degrees of freedom, which
is the paper's 2.776 for its five seeds. Column averages (over the other strategies) say how often a
strategy is beaten: lower is better.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import stats

from bench.experiments.common import LOWER_IS_BETTER

PAPER_THRESHOLD = 2.776  # t_{0.975, 4}: five seeds


@dataclass
class ExperimentBudgets:
    """Budgets of one experiment.

    Attributes:
        experiment: ``"<experiment>/<config>"``.
        m0: labels at round 0.
        batch: labels per round.
        converged_labels: labels at the round where the reference came within ``tol`` of its final value.
        budgets: the ``L_k`` used (``z = len(budgets)``).
        wins: ``(budget, winner, loser, t)`` for every significant comparison.
        rounds: labels -> round index (from the reference's rows).
    """

    experiment: str
    m0: int
    batch: int
    converged_labels: int
    budgets: list[int]
    wins: list[tuple[int, str, str, float]] = field(default_factory=list)
    rounds: dict[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Loss:
    """One significant comparison lost by a strategy.

    Attributes:
        experiment: the experiment (``linear_mnist``, ...).
        config: its config (``learned``, ...).
        budget: labels at that round.
        round: round index (``-1`` when unknown).
        winner: the strategy that beat it.
        t: the paired t-score.
    """

    experiment: str
    config: str
    budget: int
    round: int
    winner: str
    t: float


@dataclass
class PenaltyResult:
    """The matrix and how it was built.

    Attributes:
        strategies: row/column order.
        matrix: ``s x s``; ``matrix[i, j]`` = budget-weighted count of experiments where i beat j.
        column_means: ``(s,)`` mean of each column over the rows ``i != j`` (lower is better).
        experiments: per-experiment budgets and wins.
    """

    strategies: list[str]
    matrix: np.ndarray
    column_means: np.ndarray
    experiments: list[ExperimentBudgets]


def t_threshold(n: int) -> float:
    """Two-sided 5% critical value of Student's t with ``n - 1`` degrees of freedom (``n >= 2``)."""
    return float(stats.t.ppf(0.975, n - 1))


def paired_t(a: np.ndarray, b: np.ndarray) -> float:
    """Paired t-score of ``a - b`` over seeds: ``sqrt(N) mean / std(ddof=1)``; ``±inf`` when every
    difference is the same nonzero number, ``0`` when all are zero, ``nan`` with fewer than 2 pairs."""
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    n = d.shape[0]
    if n < 2:
        return math.nan
    mu = float(d.mean())
    sd = float(d.std(ddof=1))
    if sd <= 1e-12 * max(1.0, abs(mu)):
        return 0.0 if mu == 0.0 else math.copysign(math.inf, mu)
    return math.sqrt(n) * mu / sd


def paired_budgets(
    mine: Mapping[int, Mapping[int, float]],
    theirs: Mapping[int, Mapping[int, float]],
    m0: int,
    *,
    lower_is_better: bool = False,
) -> dict[int, tuple[float, float, str, int]]:
    """labels -> (mean of mine - theirs, paired t, verdict, seeds) at every budget after ``m0``.

    ``mine`` and ``theirs`` map seed -> labels -> value. Only seeds with both values at a budget are
    paired; budgets with fewer than 2 such seeds are left out. The verdict is ``better`` / ``worse``
    (in the metric's own sense: with ``lower_is_better`` a negative t is better) when ``|t|`` exceeds
    :func:`t_threshold` for the paired seeds, else ``tied``.
    """
    out: dict[int, tuple[float, float, str, int]] = {}
    budgets = sorted({b for s in mine.values() for b in s} & {b for s in theirs.values() for b in s})
    for lab in budgets:
        if lab <= m0:
            continue
        seeds = sorted(s for s in set(mine) & set(theirs) if lab in mine[s] and lab in theirs[s])
        if len(seeds) < 2:
            continue
        a = np.array([mine[s][lab] for s in seeds])
        b = np.array([theirs[s][lab] for s in seeds])
        t = paired_t(a, b)
        verdict = "tied"
        if abs(t) > t_threshold(len(seeds)):
            good = t < 0 if lower_is_better else t > 0
            verdict = "better" if good else "worse"
        out[lab] = (float(a.mean() - b.mean()), t, verdict, len(seeds))
    return out


def budgets_for(labels: Sequence[int], ref_mean: Sequence[float], *, tol: float = 0.01) -> tuple[int, list[int]]:
    """Labels at convergence and the budgets ``M_0 + 2^k B`` up to it.

    Args:
        labels: ``(r,)`` labels per round (``labels[0] = M_0``, constant step ``B``).
        ref_mean: ``(r,)`` the reference strategy's mean metric per round.
        tol: relative closeness to the final value that counts as converged.

    Returns:
        ``(labels at the first converged round, [L_0, L_1, ...])``.
    """
    labels = [int(v) for v in labels]
    final = float(ref_mean[-1])
    r = next(i for i, v in enumerate(ref_mean) if abs(float(v) - final) <= tol * abs(final))
    m0 = labels[0]
    batch = labels[1] - labels[0] if len(labels) > 1 else 0
    out: list[int] = []
    k = 0
    while batch > 0 and m0 + 2**k * batch <= labels[r]:
        out.append(m0 + 2**k * batch)
        k += 1
    return labels[r], out


def penalty_matrix(
    rows: Iterable[Mapping[str, Any]],
    *,
    strategies: Sequence[str] | None = None,
    reference: str = "random",
    tol: float = 0.01,
    threshold: float | None = None,
    all_rounds: bool = False,
) -> PenaltyResult:
    """Accumulate the pairwise penalty matrix over every (experiment, config) in ``rows``.

    Args:
        rows: results rows with ``experiment, config, strategy, seed, round, labels, metric, value``.
        strategies: row/column order (default: every strategy seen, sorted).
        reference: the strategy whose convergence sets the budgets (the paper: random).
        tol: relative tolerance of "within 1% of its final accuracy".
        threshold: fixed t threshold; ``None`` = :func:`t_threshold` of the number of paired seeds
            (2.776 for five).
        all_rounds: use every round after round 0 as a budget instead of the paper's ``M_0 + 2^k B``
            up to the reference's convergence.

    Returns:
        The :class:`PenaltyResult`. Experiments without the reference strategy or with a single
        round are skipped.
    """
    # (exp, config) -> strategy -> seed -> labels -> value
    table: dict[str, dict[str, dict[int, dict[int, float]]]] = {}
    metric: dict[str, str] = {}
    round_of: dict[str, dict[int, int]] = {}
    for r in rows:
        exp = f"{r['experiment']}/{r['config']}"
        metric[exp] = str(r["metric"])
        if str(r["strategy"]) == reference and "round" in r:
            round_of.setdefault(exp, {})[int(r["labels"])] = int(r["round"])
        table.setdefault(exp, {}).setdefault(str(r["strategy"]), {}).setdefault(int(r["seed"]), {})[
            int(r["labels"])
        ] = float(r["value"])
    names = list(strategies) if strategies is not None else sorted({s for t in table.values() for s in t})
    index = {s: i for i, s in enumerate(names)}
    P = np.zeros((len(names), len(names)))
    experiments: list[ExperimentBudgets] = []
    for exp in sorted(table):
        by_strategy = table[exp]
        if reference not in by_strategy:
            continue
        sign = -1.0 if metric[exp] in LOWER_IS_BETTER else 1.0
        ref = by_strategy[reference]
        ref_labels = sorted(set.intersection(*(set(v) for v in ref.values())))
        if len(ref_labels) < 2:
            continue
        ref_mean = [float(np.mean([ref[s][lab] for s in ref])) for lab in ref_labels]
        conv, budgets = budgets_for(ref_labels, ref_mean, tol=tol)
        if all_rounds:
            budgets = ref_labels[1:]
        info = ExperimentBudgets(
            exp, ref_labels[0], ref_labels[1] - ref_labels[0], conv, budgets, rounds=round_of.get(exp, {})
        )
        experiments.append(info)
        if not budgets:
            continue
        z = len(budgets)
        present = [s for s in names if s in by_strategy]
        for budget in budgets:
            for a in present:
                for b in present:
                    if a == b:
                        continue
                    seeds = sorted(
                        s
                        for s in set(by_strategy[a]) & set(by_strategy[b])
                        if budget in by_strategy[a][s] and budget in by_strategy[b][s]
                    )
                    if len(seeds) < 2:
                        continue
                    ea = sign * np.array([by_strategy[a][s][budget] for s in seeds])
                    eb = sign * np.array([by_strategy[b][s][budget] for s in seeds])
                    t = paired_t(ea, eb)
                    thr = t_threshold(len(seeds)) if threshold is None else threshold
                    if t > thr:
                        P[index[a], index[b]] += 1.0 / z
                        info.wins.append((budget, a, b, t))
    n = len(names)
    off = ~np.eye(n, dtype=bool)
    col = np.array([P[off[:, j], j].mean() if n > 1 else 0.0 for j in range(n)])
    return PenaltyResult(strategies=names, matrix=P, column_means=col, experiments=experiments)


def losses(res: PenaltyResult, focus: str) -> list[Loss]:
    """Every significant comparison that ``focus`` lost, in experiment then budget order."""
    out: list[Loss] = []
    for e in res.experiments:
        experiment, _, config = e.experiment.partition("/")
        for budget, winner, loser, t in sorted(e.wins, key=lambda w: (w[0], w[1])):
            if loser == focus:
                out.append(Loss(experiment, config, budget, e.rounds.get(budget, -1), winner, t))
    return out


def format_table(res: PenaltyResult) -> str:
    """The matrix as a Markdown table, with the column averages as a last row."""
    head = "| beats \\ beaten | " + " | ".join(res.strategies) + " |"
    sep = "|---" * (len(res.strategies) + 1) + "|"
    lines = [head, sep]
    for i, s in enumerate(res.strategies):
        lines.append(f"| {s} | " + " | ".join(f"{v:.2f}" for v in res.matrix[i]) + " |")
    lines.append("| **column mean** | " + " | ".join(f"**{v:.2f}**" for v in res.column_means) + " |")
    return "\n".join(lines)


def plot_matrix(res: PenaltyResult, path: Any, *, title: str = "") -> None:
    """Heat map of the matrix with its values, and the column averages under it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(res.strategies)
    full = np.vstack([res.matrix, res.column_means[None, :]])
    fig, ax = plt.subplots(figsize=(1.0 + 0.9 * n, 1.2 + 0.8 * (n + 1)))
    im = ax.imshow(full, cmap="viridis", aspect="auto")
    ax.axhline(n - 0.5, color="white", lw=2)
    for i in range(n + 1):
        for j in range(n):
            ax.text(j, i, f"{full[i, j]:.2f}", ha="center", va="center", color="w", fontsize=8)
    ax.set_xticks(range(n), res.strategies, rotation=45, ha="right", fontsize=8)
    ax.set_yticks(range(n + 1), [*res.strategies, "column mean"], fontsize=8)
    ax.set_xlabel("beaten (j)")
    ax.set_ylabel("beats (i)")
    if title:
        ax.set_title(title, fontsize=10)
    fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

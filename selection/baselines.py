"""The paper's baselines: ``badge``, ``coreset``, ``confidence``, ``margin``, ``entropy``, ``random``.

All are pure torch on the problem's device and dtype, deterministic given ``problem.seed`` (random
draws are made on a CPU generator, so the same seed gives the same draws on every device), and never
return a labeled or reserved row. Ties go to the lowest pool row index. Pairwise distances are
streamed in tiles of ``problem.chunk_size x _COL_TILE`` so memory stays bounded for large pools.

Decisions where the papers leave a choice:

* ``badge`` follows BADGE's code (Ash et al. 2020, ``init_centers``): the first centre is the
  candidate of largest gradient-embedding norm, then k-means++ D^2 sampling; like the original it
  looks at candidates only (labeled and reserved rows are not centres). If every remaining candidate
  is at distance 0 from a chosen centre (duplicates), the next one is drawn uniformly.
* ``coreset`` (Sener & Savarese 2018, greedy k-center) measures distance to labeled, reserved and
  already chosen rows; with none labeled or reserved, the first row is drawn uniformly at random
  from the seed (the usual arbitrary start of Gonzalez' algorithm).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import torch

from selection.problem import Problem, StrategyOutput, register

_COL_TILE = 1024


def _slices(n: int, size: int) -> Iterator[slice]:
    for start in range(0, n, size):
        yield slice(start, min(start + size, n))


def _to_numpy(rows: torch.Tensor) -> np.ndarray:
    return rows.detach().cpu().numpy().astype(np.int64, copy=False)


def gradient_factors(probs: torch.Tensor) -> torch.Tensor:
    """The class factor ``a = e_yhat - p`` of BADGE's gradient embedding ``g = a ⊗ x``.

    ``g`` is (minus) the last-layer cross-entropy gradient for the predicted label ``yhat = argmax p``
    (ties to the lowest class), vectorised class-major (entry ``c*d + j`` is ``a_c x_j``). It is never
    materialised: ``||g||^2 = ||a||^2 ||x||^2`` and ``<g, g'> = <a, a'><x, x'>``.

    Args:
        probs: ``n x k`` class probabilities.

    Returns:
        ``n x k`` factors ``a``.
    """
    onehot = torch.zeros_like(probs)
    onehot.scatter_(1, probs.argmax(dim=1, keepdim=True), 1.0)
    return onehot - probs


def min_sqdist(Xa: torch.Tensor, Xb: torch.Tensor, chunk: int) -> torch.Tensor:
    """Squared Euclidean distance from each row of ``Xa`` to its nearest row of ``Xb``, streamed.

    Args:
        Xa: ``m x d``.
        Xb: ``l x d`` with ``l >= 1``.
        chunk: rows of ``Xa`` per tile (tiles are ``chunk x 1024``).

    Returns:
        ``(m,)`` distances, clamped at 0.
    """
    sqa = (Xa * Xa).sum(dim=1)  # (m,)
    sqb = (Xb * Xb).sum(dim=1)  # (l,)
    out = torch.full_like(sqa, math.inf)
    for ra in _slices(Xa.shape[0], chunk):
        for rb in _slices(Xb.shape[0], _COL_TILE):
            dist = sqa[ra, None] + sqb[None, rb] - 2.0 * (Xa[ra] @ Xb[rb].T)  # chunk x tile
            out[ra] = torch.minimum(out[ra], dist.min(dim=1).values)
    return out.clamp_min_(0.0)


def _sample_d2(weights: torch.Tensor, available: torch.Tensor, gen: torch.Generator) -> tuple[int, bool]:
    """Draw a position with probability ``∝ weights``; uniformly among ``available`` if all are 0
    (then the second return value is ``True``).

    The uniform number comes from the CPU generator (the same stream on every device); the inverse
    CDF is evaluated in float64 where the weights live, so only a scalar crosses the device boundary.
    """
    u = torch.rand(1, generator=gen, dtype=torch.float64)
    cum = torch.cumsum(weights.to(torch.float64), dim=0)  # (m,)
    total = float(cum[-1])
    if not total > 0.0 or not math.isfinite(total):
        pool = torch.nonzero(available).reshape(-1)
        return int(pool[min(int(u * pool.numel()), pool.numel() - 1)]), True
    target = (u * total).to(cum.device)
    pos = int(torch.searchsorted(cum, target, right=True).clamp_max(cum.numel() - 1))
    while weights[pos] <= 0:  # guards the rounding edge target == total
        pos -= 1
    return pos, False


@register(
    "badge",
    tasks=("classification",),
    summary="BADGE: k-means++ seeding on gradient embeddings (e_yhat - p) ⊗ x (uncertainty + diversity)",
)
def badge(problem: Problem) -> StrategyOutput:
    """BADGE (Ash et al., ICLR 2020): k-means++ seeding in gradient-embedding space.

    The squared distance of gradient embeddings factorises,
    ``||g_x - g_y||^2 = ||a_x||^2 ||x||^2 + ||a_y||^2 ||y||^2 - 2 <a_x, a_y><x, y>``, so each step costs
    ``O(m (d + k))`` for ``m`` candidates and no ``m x dk`` matrix is formed.

    Args:
        problem: a classification problem (``probs`` is ``n x k``).

    Returns:
        Candidate rows in pick order; ``objective`` is ``None``.
    """
    assert problem.probs is not None
    cand = problem.candidates
    gen = problem.generator()
    A = gradient_factors(problem.probs[cand])  # m x k
    X = problem.X[cand]  # m x d
    sq = (A * A).sum(dim=1) * (X * X).sum(dim=1)  # m, ||g||^2
    m, B = int(cand.numel()), problem.batch_size

    def sqdist_to(j: int) -> torch.Tensor:  # (m,)
        return (sq + sq[j] - 2.0 * (A @ A[j]) * (X @ X[j])).clamp_min_(0.0)

    chosen = torch.zeros(m, dtype=torch.bool, device=cand.device)
    first = int(torch.argmax(sq))
    picks = [first]
    chosen[first] = True
    mind = sqdist_to(first)
    problem.report(1, B)
    uniform_draws = 0
    for step in range(1, B):
        w = torch.where(chosen, torch.zeros_like(mind), mind)
        j, uniform = _sample_d2(w, ~chosen, gen)
        uniform_draws += uniform
        picks.append(j)
        chosen[j] = True
        mind = torch.minimum(mind, sqdist_to(j))
        problem.report(step + 1, B)
    rows = cand[torch.tensor(picks, device=cand.device)]
    return StrategyOutput(
        indices=_to_numpy(rows),
        diagnostics={"first_center": "max_norm", "uniform_draws": uniform_draws},
    )


@register(
    "coreset",
    tasks=("classification", "regression"),
    summary="Core-set: greedy k-center on embeddings, distances to labeled, reserved and chosen rows",
    inputs=("embeddings",),
)
def coreset(problem: Problem) -> StrategyOutput:
    """Greedy k-center (Sener & Savarese, ICLR 2018) on the embeddings.

    Each step picks the candidate farthest from its nearest labeled, reserved or already chosen row.

    Args:
        problem: any task.

    Returns:
        Candidate rows in pick order; ``objective`` is ``None``; diagnostics hold the covering
        ``radius`` (largest distance from a candidate to its nearest design row) after the batch.
    """
    cand = problem.candidates
    X = problem.X[cand]  # m x d
    m, B = int(cand.numel()), problem.batch_size
    design = problem.in_design
    picks: list[int] = []
    if design.numel():
        mind = min_sqdist(X, problem.X[design], problem.chunk_size)  # (m,)
        start = "design"
    else:
        first = int(torch.randint(m, (1,), generator=problem.generator()))
        picks.append(first)
        mind = min_sqdist(X, X[first : first + 1], problem.chunk_size)
        start = "random"
    chosen = torch.zeros(m, dtype=torch.bool, device=cand.device)
    for j in picks:
        chosen[j] = True
    neg = torch.tensor(-1.0, dtype=mind.dtype, device=mind.device)
    while len(picks) < B:
        j = int(torch.argmax(torch.where(chosen, neg, mind)))  # first maximum: lowest row
        picks.append(j)
        chosen[j] = True
        mind = torch.minimum(mind, min_sqdist(X, X[j : j + 1], problem.chunk_size))
        problem.report(len(picks), B)
    rows = cand[torch.tensor(picks, device=cand.device)]
    radius = float(mind.max().sqrt())
    return StrategyOutput(indices=_to_numpy(rows), diagnostics={"start": start, "radius": radius})


def _rank(problem: Problem, scores: torch.Tensor, *, descending: bool) -> StrategyOutput:
    """The ``batch_size`` candidates with the smallest (or largest) scores, ties to the lowest row."""
    order = torch.sort(scores, descending=descending, stable=True).indices[: problem.batch_size]
    picked = scores[order]
    return StrategyOutput(
        indices=_to_numpy(problem.candidates[order]),
        diagnostics={"score_first": float(picked[0]), "score_last": float(picked[-1])},
    )


@register(
    "confidence", tasks=("classification",), summary="Least confidence: smallest max probability", inputs=("probs",)
)
def confidence(problem: Problem) -> StrategyOutput:
    """Least-confidence sampling: candidates with the smallest ``max_c p_c`` first.

    Args:
        problem: a classification problem.
    """
    assert problem.probs is not None
    P = problem.probs[problem.candidates]  # m x k
    return _rank(problem, P.max(dim=1).values, descending=False)


@register(
    "margin",
    tasks=("classification",),
    summary="Margin: smallest gap between the top two probabilities",
    inputs=("probs",),
)
def margin(problem: Problem) -> StrategyOutput:
    """Margin sampling: candidates with the smallest ``p_(1) - p_(2)`` first.

    Args:
        problem: a classification problem (``k >= 2``).
    """
    assert problem.probs is not None
    top2 = problem.probs[problem.candidates].topk(2, dim=1).values  # m x 2
    return _rank(problem, top2[:, 0] - top2[:, 1], descending=False)


@register("entropy", tasks=("classification",), summary="Entropy: largest predictive entropy", inputs=("probs",))
def entropy(problem: Problem) -> StrategyOutput:
    """Entropy sampling: candidates with the largest ``-sum_c p_c log p_c`` first (``0 log 0 = 0``).

    Args:
        problem: a classification problem.
    """
    assert problem.probs is not None
    P = problem.probs[problem.candidates]  # m x k
    return _rank(problem, -torch.special.xlogy(P, P).sum(dim=1), descending=True)


@register("random", tasks=("classification", "regression"), summary="Uniform sampling without replacement", inputs=())
def random(problem: Problem) -> StrategyOutput:
    """Uniform sampling without replacement from the candidates.

    The permutation is drawn on a CPU generator seeded with ``problem.seed``, so the result depends
    only on the seed and the candidate set, not on the device or dtype.

    Args:
        problem: any task.
    """
    m = int(problem.candidates.numel())
    perm = torch.randperm(m, generator=problem.generator())[: problem.batch_size]
    return StrategyOutput(indices=_to_numpy(problem.candidates.cpu()[perm]))

"""Model-free first batches for pools with no or very few labels: ``typiclust`` and ``kmeanspp``.

Neither reads a model: they look at the geometry of the embeddings only (``inputs=("embeddings",)``),
so they run on a pool without a single label, where every model-based strategy (BAIT, BADGE,
margin, ...) would score items with a head trained on nothing.

* ``typiclust`` (Hacohen, Dekel & Weinshall, "Active Learning on a Budget", ICML 2022): cluster the
  pool into ``min(n_design + B, max_clusters)`` clusters with k-means; visit the clusters that hold
  the fewest labeled/reserved rows first, the largest first among those, skipping clusters smaller
  than ``min_cluster_size``; in each, pick the candidate of highest *typicality*
  ``1 / (mean squared distance to its K nearest candidates of the cluster + 1e-5)``, with
  ``K = min(knn, cluster size // 2)`` (the reference code's choices: ``knn=20``, ``max_clusters=500``,
  ``min_cluster_size=5``, squared L2 distances as faiss' ``IndexFlatL2`` returns them). When ``B``
  exceeds the clusters it cycles through them again.
* ``kmeanspp``: k-means++ seeding (Arthur & Vassilvitskii 2007) on the embeddings: each pick is drawn
  with probability proportional to the squared distance to the nearest labeled, reserved or chosen
  row; with none labeled or reserved the first pick is uniform.

Bounded memory and time for large pools (n = 10^5..10^6): k-means runs Lloyd iterations on a seeded
uniform sample of at most ``kmeans_sample`` rows (k-means++ initialised), then assigns every row to
its nearest centre in streamed tiles; the typicality of a cluster with more than
``max_typicality_points`` candidates is computed on a seeded sample of that many of them (the pick
is the most typical point of the sample). Distances are streamed in tiles of ``chunk_size x 1024``,
so no ``n x n`` or ``n x K`` matrix is held beyond a tile. Every random draw comes from the CPU
generator of ``problem.seed``: the same seed gives the same picks on every device.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from selection.baselines import _sample_d2, _slices, _to_numpy, min_sqdist
from selection.errors import ParameterError
from selection.problem import Problem, StrategyOutput, register

_TILE = 1024
_KNN_CELLS = 1 << 22  # entries of one row-block x cluster distance tile in the typicality computation


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ParameterError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ParameterError(f"{name} must be >= {minimum}, got {value}")
    return value


def nearest_center(X: torch.Tensor, C: torch.Tensor, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Index of and squared distance to the nearest row of ``C`` for every row of ``X``, streamed.

    Ties go to the lowest centre index. Returns ``((m,) int64, (m,) distances clamped at 0)``.
    """
    sqc = (C * C).sum(dim=1)
    best = torch.full((X.shape[0],), math.inf, dtype=X.dtype, device=X.device)
    arg = torch.zeros(X.shape[0], dtype=torch.int64, device=X.device)
    for ra in _slices(X.shape[0], chunk):
        xa = X[ra]
        sqa = (xa * xa).sum(dim=1)
        for rb in _slices(C.shape[0], _TILE):
            dist = sqa[:, None] + sqc[None, rb] - 2.0 * (xa @ C[rb].T)
            val, idx = dist.min(dim=1)
            better = val < best[ra]
            best[ra] = torch.where(better, val, best[ra])
            arg[ra] = torch.where(better, idx + rb.start, arg[ra])
    return arg, best.clamp_min_(0.0)


def kmeans(
    X: torch.Tensor,
    k: int,
    gen: torch.Generator,
    *,
    sample: int,
    iters: int,
    chunk: int,
    tol: float = 1e-4,
    progress: Any = None,
) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
    """k-means (k-means++ init, Lloyd) fitted on a seeded sample of ``X``, then every row assigned.

    Args:
        X: ``n x d`` rows, ``n >= k``.
        k: number of clusters.
        gen: CPU generator for the sample and the k-means++ draws.
        sample: rows the centres are fitted on (all when ``n <= sample``).
        iters: cap on Lloyd iterations.
        chunk: rows per streamed tile.
        tol: stop when the inertia improves by less than this fraction.
        progress: optional ``callback(done, total)`` per iteration.

    Returns:
        ``(assignment (n,) int64, centres k x d, info)``; ``info`` has ``iterations``, ``sample`` and
        the sample ``inertia`` (mean squared distance to the nearest centre).
    """
    n = X.shape[0]
    if n > sample:
        rows = torch.randperm(n, generator=gen)[:sample].sort().values.to(X.device)
        S = X[rows]
    else:
        S = X
    m = S.shape[0]
    # k-means++ initialisation on the sample
    first = int(torch.randint(m, (1,), generator=gen))
    picks = [first]
    mind = min_sqdist(S, S[first : first + 1], chunk)
    taken = torch.zeros(m, dtype=torch.bool, device=S.device)
    taken[first] = True
    while len(picks) < k:
        w = torch.where(taken, torch.zeros_like(mind), mind)
        j, _ = _sample_d2(w, ~taken, gen)
        picks.append(j)
        taken[j] = True
        mind = torch.minimum(mind, min_sqdist(S, S[j : j + 1], chunk))
    C = S[torch.tensor(picks, device=S.device)].clone()
    prev = math.inf
    inertia = math.inf
    done = 0
    for it in range(1, iters + 1):
        assign, dist = nearest_center(S, C, chunk)
        inertia = float(dist.mean())
        counts = torch.bincount(assign, minlength=k).to(S.dtype)
        sums = torch.zeros_like(C).index_add_(0, assign, S)
        nonempty = counts > 0
        # an empty cluster keeps its centre (a sample row, so it is never far from the data)
        C = torch.where(nonempty[:, None], sums / counts.clamp_min(1.0)[:, None], C)
        done = it
        if progress is not None:
            progress(it, iters)
        if math.isfinite(prev) and prev - inertia <= tol * max(prev, 1e-30):
            break
        prev = inertia
    assign, _ = nearest_center(X, C, chunk)
    return assign, C, {"iterations": done, "sample": int(m), "inertia": inertia}


def typicality(F: torch.Tensor, knn: int, chunk: int) -> torch.Tensor:
    """``1 / (mean squared distance to the knn nearest other rows + 1e-5)`` of every row of ``F``.

    Streamed in row blocks so at most ``~4M`` distances are held at once.
    """
    s = F.shape[0]
    sq = (F * F).sum(dim=1)
    out = torch.empty(s, dtype=F.dtype, device=F.device)
    block = max(1, min(chunk, _KNN_CELLS // max(s, 1)))
    for ra in _slices(s, block):
        dist = (sq[ra, None] + sq[None, :] - 2.0 * (F[ra] @ F.T)).clamp_min_(0.0)
        # drop each row's distance to itself (set to +inf) instead of trusting it to be the smallest
        local = torch.arange(ra.start, ra.stop, device=F.device)
        dist[torch.arange(dist.shape[0], device=F.device), local] = math.inf
        nearest = dist.topk(knn, dim=1, largest=False).values
        out[ra] = 1.0 / (nearest.mean(dim=1) + 1e-5)
    return out


@register(
    "typiclust",
    tasks=("classification", "regression"),
    summary="TypiClust: the most typical candidate of each of B (+ labeled) k-means clusters, uncovered "
    "clusters first (model-free cold start)",
    inputs=("embeddings",),
)
def typiclust(
    problem: Problem,
    *,
    max_clusters: int = 500,
    knn: int = 20,
    min_cluster_size: int = 5,
    kmeans_iters: int = 50,
    kmeans_sample: int = 20000,
    max_typicality_points: int = 2000,
) -> StrategyOutput:
    """TypiClust (Hacohen et al., ICML 2022) on the embeddings.

    Args:
        problem: any task (only the embeddings are read).
        max_clusters: cap on the number of clusters ``min(n_labeled + n_reserved + B, max_clusters, n)``.
        knn: neighbours in the typicality (``min(knn, cluster candidates // 2)``, at least 1).
        min_cluster_size: clusters with fewer rows are visited only if no cluster is this large.
        kmeans_iters: cap on Lloyd iterations.
        kmeans_sample: rows k-means is fitted on (a seeded uniform sample when the pool is larger).
        max_typicality_points: candidates of one cluster the typicality is computed on (a seeded sample
            when the cluster has more).

    Returns:
        Candidate rows in pick order; diagnostics: ``n_clusters``, ``kmeans`` (iterations, sample,
        inertia), ``clusters_covered`` (clusters that held a labeled/reserved row before), ``cycles``
        (times the visit order was restarted), ``sampled_clusters`` (clusters whose typicality used a
        sample).

    Raises:
        ParameterError: a parameter out of its range.
    """
    _check_int("max_clusters", max_clusters, 1)
    _check_int("knn", knn, 1)
    _check_int("min_cluster_size", min_cluster_size, 1)
    _check_int("kmeans_iters", kmeans_iters, 1)
    _check_int("kmeans_sample", kmeans_sample, 1)
    _check_int("max_typicality_points", max_typicality_points, 2)
    gen = problem.generator()
    X, n, B = problem.X, problem.n, problem.batch_size
    design = problem.in_design
    k = min(int(design.numel()) + B, max_clusters, n)
    total = kmeans_iters + B
    assign, _, info = kmeans(
        X,
        k,
        gen,
        sample=max(kmeans_sample, k),
        iters=kmeans_iters,
        chunk=problem.chunk_size,
        progress=lambda done, _t: problem.report(done, total),
    )
    sizes = torch.bincount(assign, minlength=k).cpu()
    existing = (
        torch.bincount(assign[design], minlength=k).cpu() if design.numel() else torch.zeros(k, dtype=torch.int64)
    )
    eligible = [c for c in range(k) if int(sizes[c]) >= min_cluster_size] or list(range(k))
    order = sorted(eligible, key=lambda c: (int(existing[c]), -int(sizes[c]), c))

    is_cand = torch.zeros(n, dtype=torch.bool, device=X.device)
    is_cand[problem.candidates] = True
    members: dict[int, torch.Tensor] = {}
    picks: list[int] = []
    sampled = 0
    cycles = 0
    pos = 0
    misses = 0
    while len(picks) < B:
        if pos == len(order):
            pos, cycles = 0, cycles + 1
            if misses == len(order):  # every visited cluster is exhausted: open the small ones too
                visited = set(order)
                rest = [c for c in range(k) if c not in visited]
                if not rest:
                    raise RuntimeError("typiclust ran out of candidates (batch_size was checked against them)")
                order = sorted(rest, key=lambda c: (int(existing[c]), -int(sizes[c]), c))
            misses = 0
        c = order[pos]
        pos += 1
        if c not in members:
            members[c] = torch.nonzero(is_cand & (assign == c)).reshape(-1)
        rows = members[c]
        if rows.numel() == 0:
            misses += 1
            continue
        if rows.numel() > max_typicality_points:
            sub = torch.randperm(int(rows.numel()), generator=gen)[:max_typicality_points].sort().values
            look = rows[sub.to(rows.device)]
            sampled += 1
        else:
            look = rows
        if look.numel() == 1:
            j = int(look[0])
        else:
            kk = max(1, min(knn, int(look.numel()) // 2))
            typ = typicality(X[look], kk, problem.chunk_size)
            j = int(look[int(torch.argmax(typ))])  # first maximum: the lowest row
        picks.append(j)
        is_cand[j] = False
        members[c] = rows[rows != j]
        problem.report(kmeans_iters + len(picks), total)
    return StrategyOutput(
        indices=_to_numpy(torch.tensor(picks, dtype=torch.int64)),
        diagnostics={
            "n_clusters": k,
            "kmeans": info,
            "clusters_covered": int((existing > 0).sum()),
            "cycles": cycles,
            "sampled_clusters": sampled,
        },
    )


@register(
    "kmeanspp",
    tasks=("classification", "regression"),
    summary="k-means++ seeding on the embeddings, distances to labeled, reserved and chosen rows "
    "(model-free cold start)",
    inputs=("embeddings",),
)
def kmeanspp(problem: Problem) -> StrategyOutput:
    """k-means++ seeding (D^2 sampling) on the embeddings.

    Args:
        problem: any task (only the embeddings are read).

    Returns:
        Candidate rows in pick order; diagnostics: ``start`` (``"design"`` when labeled/reserved rows
        seeded the distances, else ``"random"``) and ``uniform_draws`` (steps where every candidate
        coincided with a chosen row, so the draw was uniform).
    """
    cand = problem.candidates
    X = problem.X[cand]
    m, B = int(cand.numel()), problem.batch_size
    gen = problem.generator()
    design = problem.in_design
    chosen = torch.zeros(m, dtype=torch.bool, device=cand.device)
    picks: list[int] = []
    if design.numel():
        mind = min_sqdist(X, problem.X[design], problem.chunk_size)
        start = "design"
    else:
        first = int(torch.randint(m, (1,), generator=gen))
        picks.append(first)
        chosen[first] = True
        mind = min_sqdist(X, X[first : first + 1], problem.chunk_size)
        start = "random"
    uniform_draws = 0
    while len(picks) < B:
        w = torch.where(chosen, torch.zeros_like(mind), mind)
        j, uniform = _sample_d2(w, ~chosen, gen)
        uniform_draws += uniform
        picks.append(j)
        chosen[j] = True
        mind = torch.minimum(mind, min_sqdist(X, X[j : j + 1], problem.chunk_size))
        problem.report(len(picks), B)
    rows = cand[torch.tensor(picks, device=cand.device)]
    return StrategyOutput(indices=_to_numpy(rows), diagnostics={"start": start, "uniform_draws": uniform_draws})

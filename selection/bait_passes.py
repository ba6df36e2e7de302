"""BAIT's pool-wide passes over one shard of a pool, and their merge, so a cluster can map them (issue 26).

BAIT on a pool that no single process holds runs in three steps (the orchestration lives in ``worker/``):

1. **Scores** (one task per shard, :func:`shard_scores`): the head's forward pass over the shard (penultimate
   features and probabilities), the pre-filter score of each candidate, the shard's best ``top`` candidates by
   that score and its ``top + random`` candidates of smallest random key, and (when asked) the shard's sum of
   the per-row Fisher ``sum_i I(x_i)`` in the reduced class space. The Fisher sums are added as a tree
   (:func:`add_fisher`), the candidate lists are merged by :func:`merge_scores`.
2. **Gather** (one task per shard that holds a kept or design row, :func:`shard_rows`): the features and
   probabilities of the kept candidates and the design rows only.
3. **Greedy** (the job's process): exact BAIT on the gathered rows, with the pool Fisher estimated from them
   exactly as the single-process pre-filter estimates it (:func:`stratum_weights`), and the exact objective of
   the batch over the whole pool from the tree-reduced pool Fisher (:func:`objective_with_fisher`).

Equality with single-process BAIT (:func:`selection.bait.bait` with a pre-filter ``{"top": N, "random": M}``):

* The score stratum is the same: the ``N`` candidates of largest score
  (:func:`selection.bait.approx.prefilter_scores`), ties to the lowest item id, as the single-process stable sort over
  rows in id order keeps them.
* The random stratum is drawn by item id, not by a permutation of row positions: every candidate draws the key
  :func:`item_keys` ``(seed, item id)`` and the stratum is the ``M`` candidates outside the score stratum of
  smallest key. It is a uniform sample without replacement of the other candidates, the same whatever the shard
  layout and whichever worker runs which shard, and the sample
  :func:`selection.bait.approx.prefilter_candidates` draws when it is given the rows' ids (``row_ids``, as the
  service's single-process batch gives its item ids). Everything else (the stratified Fisher weights
  ``(n_C - N) / M``, the greedy) is the single-process code on the same rows, so the picks are the
  single-process picks (without ``row_ids`` the single process draws another uniform sample).
* A shard's best ``N`` by score and its ``N + M`` smallest keys are enough: a candidate of the global random
  stratum has fewer than ``N + M`` candidates of its shard with a smaller key (at most ``N`` of them in the score
  stratum, fewer than ``M`` in the random one).

The merge is bounded: when ``N + M`` exceeds a shard's rows, those lists are the whole shard, and shipping every
list to one process would pass the whole pool's ids, scores and keys through it. So the lists stay where they
were computed and travel in two rounds (:func:`sketch_of`, :func:`thresholds`, :func:`above`): first every
``s``-th entry of each list (``s`` about the square root of its length, :func:`sketch_step`), from which the job
finds a score ``tau`` that at least ``N`` candidates reach and a key ``kappa`` that at least ``N + M`` candidates
stay under; then only the entries of each list at or past those bounds. A shard sends at most ``s`` entries
beyond its share, and :func:`merge_scores` over what was sent gives exactly what it gives over the whole lists
(the global ``N``-th best score is at least ``tau``; of the candidates with a key up to ``kappa`` at most ``N``
are in the score stratum, so the ``M`` smallest keys outside it are at most ``kappa``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from selection.bait.approx import Prefilter, item_keys, prefilter_scores
from selection.errors import ParameterError
from selection.fisher import kron_sum, reduced_rank
from selection.heads import TrainedHead, predict
from selection.validation import check_probs

Tensor = torch.Tensor


@dataclass
class HeadRows:
    """The head's outputs on some rows, as :func:`selection.select` sees them: ``features`` ``m x d_pen`` and
    ``probs`` ``m x k`` (rows renormalised) or None (regression), in ``dtype``."""

    features: Tensor
    probs: Tensor | None


def head_rows(
    head: TrainedHead, X: np.ndarray, *, dtype: torch.dtype | None = None, chunk_size: int = 8192
) -> HeadRows:
    """The head's forward pass over ``X``, converted as :func:`selection.validation.build_problem` converts a
    pool (``dtype`` None: the features' own dtype)."""
    with torch.no_grad():
        out = predict(head, X, chunk_size=chunk_size)
    feats = out.features.detach().cpu()
    dt = dtype or feats.dtype
    probs = None
    if head.config.task == "classification":
        assert out.probs is not None
        probs = check_probs(out.probs.detach().cpu().to(dt), int(feats.shape[0]), "classification")
    return HeadRows(features=feats.to(dt), probs=probs)


@dataclass
class ShardScores:
    """What a shard contributes to the pre-filter and to the pool Fisher.

    Attributes:
        top_ids, top_scores: the shard's best ``top`` candidates by pre-filter score (best first, ties to the
            lowest id).
        key_ids, keys: its ``top + random`` candidates of smallest :func:`item_keys` key (smallest first).
        rows: rows in the shard; ``candidates``: of them, neither labeled nor reserved.
        fisher: ``D x D`` float64 ``sum_i I(x_i)`` over every row of the shard (reduced class space), or None.
    """

    top_ids: np.ndarray
    top_scores: np.ndarray
    key_ids: np.ndarray
    keys: np.ndarray
    rows: int
    candidates: int
    fisher: np.ndarray | None = None


def shard_scores(
    item_ids: np.ndarray,
    excluded: np.ndarray,
    X: np.ndarray,
    head: TrainedHead,
    prefilter: Prefilter,
    seed: int,
    *,
    fisher: bool = False,
    dtype: torch.dtype | None = None,
    chunk_size: int = 8192,
) -> ShardScores:
    """A shard's pre-filter summary (see :class:`ShardScores`).

    Args:
        item_ids: ``(m,)`` int64 item ids of the shard, ascending.
        excluded: sorted int64 item ids of the design (labeled, reserved): never candidates.
        X: ``m x d`` embeddings of the shard.
        head: the trained head (BAIT selects on its penultimate features).
        prefilter: the pre-filter (``top``, ``random``, ``score``; ``seed`` overrides ``seed`` when set).
        seed: the batch seed.
        fisher: also sum the per-row Fisher of every row of the shard.
        dtype: the selection's dtype (None: the features' own, as the service selects).
        chunk_size: rows per chunk.
    """
    ids = np.asarray(item_ids, dtype=np.int64)
    out = head_rows(head, X, dtype=dtype, chunk_size=chunk_size)
    cand = ~np.isin(ids, excluded) if excluded.size else np.ones(ids.shape[0], dtype=bool)
    rows = np.nonzero(cand)[0]
    scores = prefilter_scores(
        out.features[rows], None if out.probs is None else out.probs[rows], prefilter.score, chunk_size
    ).numpy()
    c_ids = ids[rows]
    top = np.lexsort((c_ids, -scores))[: prefilter.top]
    keys = item_keys(int(seed if prefilter.seed is None else prefilter.seed), c_ids)
    low = np.lexsort((c_ids, keys))[: prefilter.top + prefilter.random]
    fmat = None
    if fisher:
        fmat = kron_sum(out.features, out.probs, None, out_dtype=torch.float64, chunk_size=chunk_size).numpy()
    return ShardScores(
        top_ids=c_ids[top],
        top_scores=scores[top],
        key_ids=c_ids[low],
        keys=keys[low],
        rows=int(ids.shape[0]),
        candidates=int(rows.shape[0]),
        fisher=fmat,
    )


def add_fisher(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """One node of the pool Fisher's tree reduction: the sum of two partial sums."""
    if a.shape != b.shape:
        raise ParameterError(f"Fisher partial sums of shapes {a.shape} and {b.shape} cannot be added")
    return a + b


def tree_sum(parts: Sequence[np.ndarray]) -> np.ndarray:
    """The sum of partial Fisher sums, pairwise in a balanced tree (the order a cluster's reduction adds them)."""
    if not parts:
        raise ParameterError("no Fisher partial sums to add")
    level = list(parts)
    while len(level) > 1:
        level = [
            add_fisher(level[i], level[i + 1]) if i + 1 < len(level) else level[i] for i in range(0, len(level), 2)
        ]
    return level[0]


@dataclass
class Kept:
    """The pre-filter's result over the whole pool: ``top`` and ``random`` item ids (ascending), the weight of a
    random row in the stratified Fisher estimate, and the candidate count ``n_C``."""

    top: np.ndarray
    random: np.ndarray
    weight: float
    candidates: int

    @property
    def ids(self) -> np.ndarray:
        return np.union1d(self.top, self.random)


def merge_scores(parts: Sequence[ShardScores], prefilter: Prefilter) -> Kept:
    """The global score stratum (best ``top`` by score, ties to the lowest id) and random stratum (the ``random``
    candidates outside it of smallest key) from every shard's summary."""
    n_c = sum(p.candidates for p in parts)
    empty_i, empty_f = np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float64)
    t_ids = np.concatenate([p.top_ids for p in parts]) if parts else empty_i
    t_scores = np.concatenate([p.top_scores for p in parts]) if parts else empty_f
    n_top = min(prefilter.top, n_c)
    top = t_ids[np.lexsort((t_ids, -t_scores))[:n_top]]
    k_ids = np.concatenate([p.key_ids for p in parts]) if parts else empty_i
    keys = np.concatenate([p.keys for p in parts]) if parts else empty_f
    rest = ~np.isin(k_ids, top)
    k_ids, keys = k_ids[rest], keys[rest]
    n_rand = min(prefilter.random, n_c - n_top)
    rand = k_ids[np.lexsort((k_ids, keys))[:n_rand]]
    weight = (n_c - n_top) / n_rand if n_rand > 0 else 0.0
    return Kept(top=np.sort(top), random=np.sort(rand), weight=weight, candidates=n_c)


@dataclass
class ShardSketch:
    """Every ``step``-th entry of a shard's two candidate lists, and each list's last entry: ``score_marks``
    (descending, ``top_scores[0], top_scores[step], ..., top_scores[-1]``) and ``key_marks`` (ascending, from
    ``keys``), with the lists' lengths, so a lower bound on how many entries reach a value can be read off."""

    score_marks: np.ndarray
    key_marks: np.ndarray
    n_top: int
    n_keys: int
    step: int
    rows: int
    candidates: int


def sketch_step(length: int) -> int:
    """The sketch's stride for a list of ``length`` entries: about its square root, which balances the sketch
    (``length / step`` entries) against what a shard may send beyond its share in the second round (``step``)."""
    return max(1, int(np.sqrt(max(length, 1))))


def _marks(values: np.ndarray, step: int) -> np.ndarray:
    if not values.size:
        return values[:0].copy()
    pos = np.arange(0, values.shape[0], step)
    if pos[-1] != values.shape[0] - 1:
        pos = np.append(pos, values.shape[0] - 1)
    return np.ascontiguousarray(values[pos])


def sketch_of(part: ShardScores) -> ShardSketch:
    """The first round of the bounded merge: a shard's lists, thinned (see :class:`ShardSketch`)."""
    step = sketch_step(max(part.top_scores.shape[0], part.keys.shape[0]))
    return ShardSketch(
        score_marks=_marks(part.top_scores, step),
        key_marks=_marks(part.keys, step),
        n_top=int(part.top_scores.shape[0]),
        n_keys=int(part.keys.shape[0]),
        step=step,
        rows=part.rows,
        candidates=part.candidates,
    )


def _at_least(length: int, step: int, n_marks: int, reached: int) -> int:
    """A lower bound on how many entries of a list of ``length`` reach a value that ``reached`` of its
    ``n_marks`` marks reach (they form a prefix): all of them when the last mark does, else the last reached
    mark's rank plus one."""
    if reached == 0:
        return 0
    return length if reached == n_marks else (reached - 1) * step + 1


def _lower_bound(sketches: Sequence[ShardSketch], value: float, scores: bool) -> int:
    total = 0
    for sk in sketches:
        if scores:
            reached = int(np.count_nonzero(sk.score_marks >= value))
            total += _at_least(sk.n_top, sk.step, int(sk.score_marks.shape[0]), reached)
        else:
            reached = int(np.count_nonzero(sk.key_marks <= value))
            total += _at_least(sk.n_keys, sk.step, int(sk.key_marks.shape[0]), reached)
    return total


def _bound(sketches: Sequence[ShardSketch], need: int, scores: bool) -> float:
    """The first mark, in the order that makes the lower bound grow (scores descending, keys ascending), whose
    lower bound on the entries that reach it (:func:`_lower_bound`) is at least ``need``: a binary search."""
    marks = np.unique(np.concatenate([sk.score_marks if scores else sk.key_marks for sk in sketches]))
    values = marks[::-1] if scores else marks
    lo, hi = 0, values.shape[0] - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if _lower_bound(sketches, float(values[mid]), scores) >= need:
            hi = mid
        else:
            lo = mid + 1
    return float(values[lo])


def thresholds(sketches: Sequence[ShardSketch], prefilter: Prefilter) -> tuple[float, float]:
    """The second round's bounds ``(tau, kappa)``: the largest mark that at least ``min(top, n_C)`` list entries
    reach by score (``+inf`` when no score stratum), and the smallest mark that at least
    ``min(top + random, n_C)`` entries stay under by key (``-inf`` when no random stratum)."""
    n_c = sum(sk.candidates for sk in sketches)
    n_top = min(prefilter.top, n_c)
    n_rand = min(prefilter.random, n_c - n_top)
    tau = _bound(sketches, n_top, True) if n_top > 0 else float("inf")
    kappa = _bound(sketches, n_top + n_rand, False) if n_rand > 0 else float("-inf")
    return tau, kappa


def above(part: ShardScores, tau: float, kappa: float) -> ShardScores:
    """The second round of the bounded merge: the shard's list entries with a score of at least ``tau`` and
    with a key of at most ``kappa`` (no Fisher sum)."""
    t = part.top_scores >= tau
    k = part.keys <= kappa
    return ShardScores(
        top_ids=part.top_ids[t],
        top_scores=part.top_scores[t],
        key_ids=part.key_ids[k],
        keys=part.keys[k],
        rows=part.rows,
        candidates=part.candidates,
        fisher=None,
    )


def stratum_weights(rows: np.ndarray, kept: Kept) -> np.ndarray:
    """Fisher weights of the gathered rows (item ids ``rows``, ascending: the design and the kept candidates) in
    the stratified estimate of the pool Fisher, as :func:`selection.bait` weighs a pre-filtered pool: 1 for a
    design or score-stratum row, ``kept.weight`` for a random-stratum row (not normalised)."""
    w = np.ones(rows.shape[0], dtype=np.float64)
    w[np.isin(rows, kept.random)] = kept.weight
    return w


@dataclass
class ShardRows:
    """Rows of a shard the job's process asked for: item ids (ascending), external ids, the head's features and
    probabilities (as :func:`head_rows` returns them, as numpy)."""

    ids: np.ndarray
    external_ids: list[str]
    features: np.ndarray
    probs: np.ndarray | None


def shard_rows(
    item_ids: np.ndarray,
    external_ids: Sequence[str],
    X: np.ndarray,
    wanted: np.ndarray,
    head: TrainedHead,
    *,
    dtype: torch.dtype | None = None,
    chunk_size: int = 8192,
) -> ShardRows:
    """The head's outputs on the shard's rows whose ids are in ``wanted`` (sorted int64)."""
    ids = np.asarray(item_ids, dtype=np.int64)
    pos = np.nonzero(np.isin(ids, wanted))[0]
    out = head_rows(head, X[pos], dtype=dtype, chunk_size=chunk_size)
    return ShardRows(
        ids=ids[pos],
        external_ids=[external_ids[int(p)] for p in pos],
        features=out.features.numpy(),
        probs=None if out.probs is None else out.probs.numpy(),
    )


def objective_with_fisher(
    fisher_sum: np.ndarray,
    n_pool: int,
    features: Tensor,
    probs: Tensor | None,
    design: Tensor,
    picked: Tensor,
    *,
    lam: float,
    w_design: float,
    w_picked: float,
    chunk_size: int = 8192,
) -> float:
    """``tr(M^{-1} F)`` in float64 with ``F = fisher_sum / n_pool`` (the pool Fisher from the tree reduction) and
    ``M = lam I + w_design sum_{design} I(x) + w_picked sum_{picked} I(x)`` over the given rows: the value
    :func:`selection.fisher.exact_objective` computes over the whole pool."""
    f64 = torch.float64
    r = reduced_rank(probs)
    big_d = r * int(features.shape[1])
    if fisher_sum.shape != (big_d, big_d):
        raise ParameterError(f"pool Fisher of shape {fisher_sum.shape}, expected ({big_d}, {big_d})")
    mmat = torch.zeros(big_d, big_d, dtype=f64)
    for rows, w in ((design, w_design), (picked, w_picked)):
        if rows.numel() and w != 0.0:
            p = None if probs is None else probs[rows]
            mmat += w * kron_sum(features[rows], p, None, out_dtype=f64, chunk_size=chunk_size)
    mmat.diagonal().add_(lam)
    chol = torch.linalg.cholesky(mmat)
    fmat = torch.as_tensor(fisher_sum, dtype=f64) / n_pool
    y = torch.linalg.solve_triangular(chol, fmat, upper=False)
    z = torch.linalg.solve_triangular(chol, y.T, upper=False)
    return float(z.diagonal().sum())


def keep_ladder(n_cand: int, min_candidates: int, min_keep: int) -> list[int]:
    """Candidate counts a distributed auto plan tries, largest first: every candidate, then (for a pool of more
    than ``min_candidates`` candidates) ``n_C / 2, n_C / 4, ...`` down to ``min_keep``, as the single-process auto
    plan's free pre-filter halvings."""
    out = [n_cand]
    if n_cand > min_candidates:
        keep = n_cand // 2
        while keep >= min_keep:
            out.append(keep)
            keep //= 2
        if out[-1] > min_keep:
            out.append(min(min_keep, n_cand))
    return out


def split_keep(keep: int, top_fraction: float, score: str = "gradnorm") -> Prefilter:
    """The pre-filter of ``keep`` candidates that the single-process auto plan builds: ``round(fraction * keep)``
    by score, the rest at random."""
    n_top = round(top_fraction * keep)
    return Prefilter(top=n_top, random=keep - n_top, score=score)

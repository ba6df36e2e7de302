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
  layout and whichever worker runs which shard, but not the sample :func:`selection.bait.approx.prefilter_candidates`
  draws with the same seed. Everything else (the stratified Fisher weights ``(n_C - N) / M``, the greedy) is
  the single-process code on the same rows, so with ``M = 0``, or with every candidate kept, the picks are
  the single-process picks.
* A shard's best ``N`` by score and its ``N + M`` smallest keys are enough: a candidate of the global random
  stratum has fewer than ``N + M`` candidates of its shard with a smaller key (at most ``N`` of them in the score
  stratum, fewer than ``M`` in the random one).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from selection.bait.approx import Prefilter, prefilter_scores
from selection.errors import ParameterError
from selection.fisher import kron_sum, reduced_rank
from selection.heads import TrainedHead, predict
from selection.validation import check_probs

Tensor = torch.Tensor

_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _splitmix64(z: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser of ``z`` (uint64, wrapping)."""
    with np.errstate(over="ignore"):
        z = (z + np.uint64(0x9E3779B97F4A7C15)) & _MASK64
        z = ((z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & _MASK64
        z = ((z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & _MASK64
        return z ^ (z >> np.uint64(31))


def item_keys(seed: int, item_ids: np.ndarray) -> np.ndarray:
    """``(m,)`` float64 keys in ``[0, 1)``, a function of ``(seed, item id)`` only (splitmix64 of the id mixed with
    the seed's): the random stratum of a pre-filter, the same whatever the shard layout."""
    if seed < 0:
        raise ParameterError("seed must be non-negative")
    ids = np.asarray(item_ids, dtype=np.int64).astype(np.uint64)
    mixed = _splitmix64(np.asarray([seed], dtype=np.uint64))[0]
    bits = _splitmix64(ids ^ mixed)
    return (bits >> np.uint64(11)).astype(np.float64) * 2.0**-53


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

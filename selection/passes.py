"""Pool-wide passes as pure functions over one shard of a pool, so a cluster can map them (issue 26).

A shard is a slice of the pool's rows in ascending row id order (the pool store keeps item ids ascending
across shards). Each pass returns a small summary of its shard; :func:`merge_top` reduces the summaries of
all shards to the batch. This module imports no engine: the orchestration (which shards, retries, where the
reduction runs) lives in ``worker/``.

Equality with the single-process strategies (:mod:`selection.baselines`):

* ``margin``, ``confidence``, ``entropy``: the same scores (same formulas on the same head outputs), and the
  merge orders by score and then by row id, as the single-process stable sort over rows in id order does. The
  top ``B`` of the merged per-shard top ``B`` lists is therefore the single-process pick, ties to the lowest id.
* ``random``: a different, documented convention. Each row of shard ``i`` draws a key from
  ``numpy.random.default_rng([seed, i])`` (every row of the shard, excluded or not, in shard order); the batch
  is the ``B`` candidates of smallest key (ties to the lowest id). That is a uniform sample without replacement,
  reproducible from the seed and the shard layout (a store version's layout is fixed by its manifest), and the
  same whichever worker runs which shard. It is not the permutation the single-process ``random`` draws.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from selection.errors import ParameterError
from selection.heads import TrainedHead, predict

TOP_B_STRATEGIES = ("random", "margin", "confidence", "entropy")
"""Strategies whose whole selection is a per-shard top ``B`` and a merge."""

_DESCENDING = {"random": False, "margin": False, "confidence": False, "entropy": True}


@dataclass
class ShardTop:
    """A shard's best candidates for a top-``B`` strategy.

    Attributes:
        ids: ``(m,)`` int64 row ids, ``m <= B``, best first.
        scores: ``(m,)`` float64 scores (the random key for ``random``), in the same order.
        rows: rows in the shard; ``candidates``: of them, not excluded.
    """

    ids: np.ndarray
    scores: np.ndarray
    rows: int
    candidates: int


def uncertainty_scores(strategy: str, probs: torch.Tensor) -> torch.Tensor:
    """Scores of the uncertainty baselines, as :mod:`selection.baselines` computes them.

    Args:
        strategy: ``margin`` (``p_(1) - p_(2)``, smaller first), ``confidence`` (``max_c p_c``, smaller first)
            or ``entropy`` (``-sum_c p_c log p_c``, larger first).
        probs: ``m x k`` class probabilities.

    Returns:
        ``(m,)`` scores in the dtype of ``probs``.
    """
    if strategy == "margin":
        top2 = probs.topk(2, dim=1).values  # m x 2
        return top2[:, 0] - top2[:, 1]
    if strategy == "confidence":
        return probs.max(dim=1).values
    if strategy == "entropy":
        return -torch.special.xlogy(probs, probs).sum(dim=1)
    raise ParameterError(f"no shard scores for strategy {strategy!r}; valid: margin, confidence, entropy")


def random_keys(seed: int, shard_index: int, rows: int) -> np.ndarray:
    """``(rows,)`` float64 uniform keys of a shard's rows: ``default_rng([seed, shard_index]).random(rows)``."""
    if seed < 0 or shard_index < 0:
        raise ParameterError("seed and shard index must be non-negative")
    return np.random.default_rng([int(seed), int(shard_index)]).random(rows)


def _best(ids: np.ndarray, scores: np.ndarray, keep: int, descending: bool) -> tuple[np.ndarray, np.ndarray]:
    """The ``keep`` best (score, id) pairs, best first: by score (descending when asked), then by lowest id."""
    order = np.lexsort((ids, -scores if descending else scores))[:keep]
    return ids[order], scores[order]


def shard_top(
    strategy: str,
    item_ids: np.ndarray,
    excluded: np.ndarray,
    batch_size: int,
    *,
    X: np.ndarray | None = None,
    head: TrainedHead | None = None,
    seed: int = 0,
    shard_index: int = 0,
    chunk_size: int = 8192,
) -> ShardTop:
    """A shard's top ``batch_size`` candidates for ``random``, ``margin``, ``confidence`` or ``entropy``.

    Args:
        strategy: one of :data:`TOP_B_STRATEGIES`.
        item_ids: ``(m,)`` int64 row ids of the shard, ascending.
        excluded: int64 row ids never returned (labeled or reserved), sorted ascending.
        batch_size: ``B``.
        X: ``m x d`` float32 embeddings (not read by ``random``).
        head: the trained head whose probabilities the uncertainty strategies score (not read by ``random``).
        seed: the batch seed (``random``).
        shard_index: the shard's position in the store's version (``random``).
        chunk_size: rows per forward pass of the head.

    Returns:
        A :class:`ShardTop` with at most ``batch_size`` rows.

    Raises:
        ParameterError: an unknown strategy, or a missing head or embeddings.
    """
    if strategy not in _DESCENDING:
        raise ParameterError(f"strategy {strategy!r} has no shard pass; valid: {', '.join(TOP_B_STRATEGIES)}")
    ids = np.asarray(item_ids, dtype=np.int64)
    keep = ~np.isin(ids, excluded, assume_unique=False) if excluded.size else np.ones(ids.shape[0], dtype=bool)
    if strategy == "random":
        scores = random_keys(seed, shard_index, int(ids.shape[0]))  # every row draws, so the design moves no key
    else:
        if head is None or X is None:
            raise ParameterError(f"strategy {strategy!r} needs the shard's embeddings and the trained head")
        if head.config.task != "classification":
            raise ParameterError(f"strategy {strategy!r} needs a classification head")
        rows = np.nonzero(keep)[0]
        scores = np.zeros(ids.shape[0], dtype=np.float64)
        if rows.size:
            with torch.no_grad():
                probs = predict(head, X[rows], chunk_size=chunk_size).probs  # c x k
                assert probs is not None
                scores[rows] = uncertainty_scores(strategy, probs).double().cpu().numpy()
    best_ids, best_scores = _best(ids[keep], scores[keep], batch_size, _DESCENDING[strategy])
    return ShardTop(ids=best_ids, scores=best_scores, rows=int(ids.shape[0]), candidates=int(keep.sum()))


def merge_top(strategy: str, parts: Sequence[ShardTop], batch_size: int) -> ShardTop:
    """The ``batch_size`` best candidates over every shard's :class:`ShardTop` (tree-reducible: merging merged
    parts gives the same result).

    Raises:
        ParameterError: fewer candidates than ``batch_size`` over all shards.
    """
    if strategy not in _DESCENDING:
        raise ParameterError(f"strategy {strategy!r} has no shard pass; valid: {', '.join(TOP_B_STRATEGIES)}")
    candidates = sum(p.candidates for p in parts)
    if candidates < batch_size:
        raise ParameterError(
            f"batch_size {batch_size} exceeds the {candidates} candidate rows (rows neither labeled nor reserved)"
        )
    ids = np.concatenate([p.ids for p in parts]) if parts else np.empty(0, dtype=np.int64)
    scores = np.concatenate([p.scores for p in parts]) if parts else np.empty(0, dtype=np.float64)
    best_ids, best_scores = _best(ids, scores, batch_size, _DESCENDING[strategy])
    return ShardTop(ids=best_ids, scores=best_scores, rows=sum(p.rows for p in parts), candidates=candidates)

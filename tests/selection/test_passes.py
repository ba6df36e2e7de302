"""Shard passes (selection/passes.py): per-shard top B and the merge pick what the single-process strategies
pick on the same data (margin, confidence, entropy; ties to the lowest row id), for any shard layout; random
follows its own per-shard seeded convention, reproducibly."""

from __future__ import annotations

import numpy as np
import pytest

import selection
from selection.errors import ParameterError
from selection.heads import HeadConfig, TrainedHead, predict, train_head
from selection.passes import ShardTop, merge_top, random_keys, shard_top

UNCERTAINTY = ("margin", "confidence", "entropy")


def _pool(n: int, d: int, dtype: type, duplicates: bool = False) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    centres = rng.normal(0, 2.0, size=(3, d))
    y = rng.integers(0, 3, size=n)
    X = centres[y] + rng.normal(0, 1.5, size=(n, d))
    if duplicates:  # ten distinct rows repeated: exact ties in every score
        X = X[np.arange(n) % 10]
        y = y[np.arange(n) % 10]
    return X.astype(dtype), y


def _head(X: np.ndarray, y: np.ndarray, labeled: np.ndarray, kind: str) -> TrainedHead:
    config = HeadConfig.from_dict(
        {"input_dim": X.shape[1], "n_outputs": 3, "task": "classification", "kind": kind, "max_epochs": 30}
    )
    return train_head(config, X[labeled], y[labeled], device="cpu", seed=1)


def _shards(ids: np.ndarray, sizes: list[int]) -> list[slice]:
    out, start = [], 0
    for size in sizes:
        out.append(slice(start, min(start + size, ids.shape[0])))
        start += size
    assert start >= ids.shape[0]
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kind", ["linear", "mlp"])
@pytest.mark.parametrize("duplicates", [False, True])
def test_merged_shard_tops_equal_the_single_process_pick(dtype: type, kind: str, duplicates: bool) -> None:
    n, B = 250, 17
    X, y = _pool(n, 5, dtype, duplicates)
    ids = 7 + 3 * np.arange(n, dtype=np.int64)  # item ids: ascending, not the row numbers
    labeled = np.arange(0, 40, 3)
    reserved = np.array([1, 2, 50, 51, 52, 200])
    head = _head(X, y, labeled, kind)
    out = predict(head, X)
    excluded = np.sort(ids[np.union1d(labeled, reserved)])
    for strategy in UNCERTAINTY:
        single = selection.select(
            strategy, embeddings=out.features, probs=out.probs, labeled=labeled, reserved=reserved, batch_size=B
        )
        for sizes in ([n], [64, 64, 64, 58], [1, 100, 9, 140], [30] * 9):
            parts = [
                shard_top(strategy, ids[sl], excluded, B, X=X[sl], head=head, shard_index=i)
                for i, sl in enumerate(_shards(ids, sizes))
            ]
            merged = merge_top(strategy, parts, B)
            assert merged.candidates == n - excluded.shape[0] and merged.rows == n
            picked_rows = ((merged.ids - 7) // 3).tolist()
            assert picked_rows == single.indices.tolist(), (strategy, sizes)


def test_random_is_the_smallest_keys_of_the_per_shard_seeded_draws() -> None:
    n, B, seed = 300, 25, 11
    ids = np.arange(1000, 1000 + n, dtype=np.int64)
    excluded = ids[::4]
    sizes = [70, 70, 70, 90]
    slices = _shards(ids, sizes)
    parts = [shard_top("random", ids[sl], excluded, B, seed=seed, shard_index=i) for i, sl in enumerate(slices)]
    merged = merge_top("random", parts, B)
    # the convention, written out once for the whole pool: every row's key from its shard's generator
    keys = np.concatenate([random_keys(seed, i, sl.stop - sl.start) for i, sl in enumerate(slices)])
    candidates = np.nonzero(~np.isin(ids, excluded))[0]
    expected = ids[candidates[np.argsort(keys[candidates], kind="stable")[:B]]]
    assert merged.ids.tolist() == expected.tolist()
    assert not np.isin(merged.ids, excluded).any() and np.unique(merged.ids).shape[0] == B
    # reproducible, whatever the order the shards are merged in (a tree reduction)
    tree = merge_top("random", [merge_top("random", parts[2:], B), merge_top("random", parts[:2], B)], B)
    assert tree.ids.tolist() == merged.ids.tolist()
    # another seed, another sample
    other = merge_top("random", [shard_top("random", ids[sl], excluded, B, seed=seed + 1, shard_index=i)
                                 for i, sl in enumerate(slices)], B)  # fmt: skip
    assert other.ids.tolist() != merged.ids.tolist()


def test_random_is_uniform_over_the_candidates() -> None:
    ids = np.arange(40, dtype=np.int64)
    excluded = np.array([0, 1, 2, 3], dtype=np.int64)
    counts = np.zeros(40)
    for seed in range(400):
        parts = [
            shard_top("random", ids[a : a + 10], excluded, 4, seed=seed, shard_index=a // 10) for a in (0, 10, 20, 30)
        ]
        counts[merge_top("random", parts, 4).ids] += 1
    assert counts[:4].sum() == 0
    expected = 400 * 4 / 36
    assert np.all(np.abs(counts[4:] - expected) < 5 * np.sqrt(expected))  # ~44 each; 5 sigma


def test_merge_refuses_a_batch_larger_than_the_candidates() -> None:
    ids = np.arange(10, dtype=np.int64)
    part = shard_top("random", ids, ids[:8], 5)
    assert part.candidates == 2 and part.ids.shape[0] == 2
    with pytest.raises(ParameterError, match="exceeds the 2 candidate rows"):
        merge_top("random", [part], 5)


def test_uncertainty_passes_need_a_head_and_known_strategies() -> None:
    ids = np.arange(5, dtype=np.int64)
    with pytest.raises(ParameterError, match="needs the shard's embeddings"):
        shard_top("margin", ids, np.empty(0, dtype=np.int64), 2)
    with pytest.raises(ParameterError, match="no shard pass"):
        shard_top("bait", ids, np.empty(0, dtype=np.int64), 2)
    with pytest.raises(ParameterError, match="no shard pass"):
        merge_top("badge", [ShardTop(ids, np.zeros(5), 5, 5)], 2)

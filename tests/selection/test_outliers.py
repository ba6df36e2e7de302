"""The robust outlier rule: a corrupt row (10^3 times the pool's scale) that BAIT picks is flagged; a normal
pool's rows, and the picks of BAIT on it, are not; sparse and constant dimensions do not explode the score."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from selection import InputDataError, ParameterError, select
from selection.outliers import DEFAULT_C, fit_stats, robust_outliers, row_distances, sample_positions


def corrupt_pool(seed: int = 0) -> tuple[np.ndarray, int]:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(400, 6))
    bad = 123
    X[bad] = X[bad] * 1e3
    return X, bad


def test_bait_picks_the_corrupt_row_and_the_rule_flags_it() -> None:
    X, bad = corrupt_pool()
    res = select("bait", embeddings=X, labeled=np.arange(10), batch_size=10, task="regression", seed=0)
    assert bad in res.indices  # BAIT's pull towards extreme inputs
    rep = robust_outliers(X, res.indices)
    assert rep.outlier_rows.tolist() == [bad]
    assert rep.distances[res.indices.tolist().index(bad)] > 100 * rep.threshold
    info = rep.as_dict()
    assert info["c"] == DEFAULT_C and info["n_flagged"] == 1 and info["n_checked"] == 10


def test_normal_pool_has_no_outliers_at_any_dimension() -> None:
    for d in (2, 16, 128):
        X = np.random.default_rng(d).normal(size=(3000, d))
        rep = robust_outliers(X)
        assert rep.flagged.sum() <= 1, d  # about 1 in 10^4 at d = 2, none above
        picks = select("bait", embeddings=X, labeled=np.arange(5), batch_size=10, task="regression").indices
        assert not robust_outliers(X, picks).flagged.any()


def test_sparse_and_constant_dimensions() -> None:
    rng = np.random.default_rng(1)
    X = rng.normal(size=(500, 4))
    X = np.hstack([X, np.zeros((500, 1)), (rng.random((500, 1)) < 0.1).astype(float)])  # constant, sparse
    rep = robust_outliers(X)
    assert not rep.flagged.any()
    X[7, :4] = 1e4
    assert robust_outliers(X).outlier_rows.tolist() == [7]


def test_sample_is_seeded_and_torch_input_agrees() -> None:
    X, bad = corrupt_pool()
    a = robust_outliers(X, sample=100, seed=3)
    b = robust_outliers(torch.as_tensor(X), sample=100, seed=3)
    assert a.threshold == pytest.approx(b.threshold) and a.n_sample == 100
    assert a.outlier_rows.tolist() == b.outlier_rows.tolist() == [bad]


def test_the_pieces_give_a_sharded_pool_the_whole_pools_numbers() -> None:
    """What a cluster does with the pieces: the sample's positions split over shards of the pool in row order,
    the statistics from those rows, each shard's distances on its own: the whole pool's report, exactly."""
    rng = np.random.default_rng(5)
    X = rng.normal(size=(900, 7)).astype(np.float32)
    X[[4, 600]] *= 1e3
    ref = robust_outliers(X, sample=250, seed=9)
    pos = sample_positions(900, 250, 9)
    assert pos.shape == (250,) and (np.diff(pos) > 0).all() and pos.tolist() == sample_positions(900, 250, 9).tolist()
    assert sample_positions(900, 250, 10).tolist() != pos.tolist()
    assert sample_positions(200, 250, 9).tolist() == list(range(200))  # a small pool is its own sample
    shards = [(lo, X[lo : lo + 128]) for lo in range(0, 900, 128)]
    sample = np.concatenate([part[pos[(pos >= lo) & (pos < lo + len(part))] - lo] for lo, part in shards])
    stats = fit_stats(sample)
    assert (stats.threshold, stats.median, stats.mad, stats.n_sample) == (ref.threshold, ref.median, ref.mad, 250)
    dist = np.concatenate([row_distances(part, stats) for _, part in shards])
    assert dist.tolist() == ref.distances.tolist()
    assert np.flatnonzero(stats.flagged(dist)).tolist() == [4, 600]
    assert stats.summary(900, 2) == ref.as_dict()


@pytest.mark.parametrize(
    ("kwargs", "err", "match"),
    [
        ({"c": 0}, ParameterError, "c must be"),
        ({"sample": 1}, ParameterError, "sample must be"),
        ({"rows": [0, 999]}, ParameterError, "rows must be in"),
        ({"rows": [[0]]}, ParameterError, "1-d array"),
    ],
)
def test_bad_arguments(kwargs: dict, err: type, match: str) -> None:
    X, _ = corrupt_pool()
    with pytest.raises(err, match=match):
        robust_outliers(X, **kwargs)


def test_bad_embeddings() -> None:
    with pytest.raises(InputDataError):
        robust_outliers(np.array([[np.nan, 1.0]]))
    with pytest.raises(InputDataError):
        robust_outliers(np.zeros((0, 3)))

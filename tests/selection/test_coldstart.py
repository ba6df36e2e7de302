"""Cold-start strategies (typiclust, kmeanspp): determinism, diversity, typicality against brute force,
the design (labeled/reserved rows), bounded-memory paths and input validation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from selection import STRATEGIES, InputDataError, ParameterError, select
from selection.coldstart import kmeans, nearest_center, typicality

COLD = ["typiclust", "kmeanspp"]


def blobs(per: int = 60, centers: int = 4, d: int = 5, sep: float = 20.0, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.normal(size=(per, d)) + sep * i for i in range(centers)])


def typicality_ref(F: np.ndarray, knn: int) -> np.ndarray:
    D = ((F[:, None, :] - F[None, :, :]) ** 2).sum(-1)
    np.fill_diagonal(D, np.inf)
    return 1.0 / (np.sort(D, axis=1)[:, :knn].mean(1) + 1e-5)


@pytest.mark.parametrize("name", COLD)
def test_model_free_and_for_both_tasks(name: str) -> None:
    info = STRATEGIES[name]
    assert info.inputs == ("embeddings",)
    assert info.tasks == ("classification", "regression")


@pytest.mark.parametrize("name", COLD)
@pytest.mark.parametrize("task", ["classification", "regression"])
def test_same_seed_same_picks_other_seed_other_picks(name: str, task: str) -> None:
    X = np.random.default_rng(1).normal(size=(300, 6))
    a = select(name, embeddings=X, batch_size=10, seed=3, task=task)
    b = select(name, embeddings=X, batch_size=10, seed=3, task=task)
    c = select(name, embeddings=X, batch_size=10, seed=4, task=task)
    assert a.indices.tolist() == b.indices.tolist()
    assert a.indices.tolist() != c.indices.tolist()
    assert len(set(a.indices.tolist())) == 10


@pytest.mark.parametrize("name", COLD)
def test_one_pick_per_blob(name: str) -> None:
    X = blobs()
    for seed in range(5):
        res = select(name, embeddings=X, batch_size=4, seed=seed)
        assert sorted(res.indices // 60) == [0, 1, 2, 3], (name, seed, res.indices)


def test_typiclust_picks_the_most_typical_point_of_each_blob() -> None:
    X = blobs()
    res = select("typiclust", embeddings=X, batch_size=4, seed=0)
    for i in res.indices:
        blob = int(i) // 60
        F = X[60 * blob : 60 * blob + 60]
        assert int(i) - 60 * blob == int(np.argmax(typicality_ref(F, 20)))
    assert res.diagnostics["n_clusters"] == 4
    assert res.diagnostics["clusters_covered"] == 0


def test_typiclust_single_cluster_matches_brute_force_typicality() -> None:
    X = np.random.default_rng(2).normal(size=(50, 3))
    res = select("typiclust", embeddings=X, batch_size=1, max_clusters=1, knn=7, seed=0)
    assert res.indices.tolist() == [int(np.argmax(typicality_ref(X, 7)))]


@pytest.mark.parametrize("knn", [1, 5, 20])
def test_typicality_streamed_matches_numpy(knn: int) -> None:
    F = np.random.default_rng(3).normal(size=(120, 4))
    got = typicality(torch.from_numpy(F), knn, chunk=7).numpy()
    np.testing.assert_allclose(got, typicality_ref(F, knn), rtol=1e-9)


def test_nearest_center_and_kmeans_recover_blobs() -> None:
    X = torch.from_numpy(blobs(per=50, centers=3))
    C = X[[0, 50, 100]]
    arg, dist = nearest_center(X, C, chunk=16)
    assert arg.tolist() == [0] * 50 + [1] * 50 + [2] * 50
    assert dist[[0, 50, 100]].max() < 1e-9
    assign, centres, info = kmeans(X, 3, torch.Generator().manual_seed(0), sample=10_000, iters=20, chunk=16)
    assert len({tuple(assign[i : i + 50].unique().tolist()) for i in (0, 50, 100)}) == 3
    assert all(assign[i : i + 50].unique().numel() == 1 for i in (0, 50, 100))
    means = torch.stack([X[i : i + 50].mean(0) for i in (0, 50, 100)])
    assert torch.cdist(centres, means).min(dim=1).values.max() < 1e-9  # the centres are the blob means
    assert info["sample"] == 150 and 1 <= info["iterations"] <= 20


def test_typiclust_visits_uncovered_clusters_first() -> None:
    X = blobs()
    labeled = [0, 1, 60]  # blobs 0 and 1 already have labels
    res = select("typiclust", embeddings=X, labeled=labeled, batch_size=2, max_clusters=4, seed=0)
    assert sorted(res.indices // 60) == [2, 3]
    assert res.diagnostics["clusters_covered"] == 2


@pytest.mark.parametrize("name", COLD)
def test_never_picks_labeled_or_reserved(name: str) -> None:
    X = blobs(per=10)
    labeled = list(range(0, 40, 2))
    reserved = [1, 3, 5, 11]
    res = select(name, embeddings=X, labeled=labeled, reserved=reserved, batch_size=16, seed=0)
    assert not set(res.indices.tolist()) & (set(labeled) | set(reserved))
    assert len(set(res.indices.tolist())) == 16


def test_kmeanspp_counts_the_design_as_centres() -> None:
    X = blobs()
    res = select("kmeanspp", embeddings=X, labeled=[0, 60, 120], batch_size=1, seed=0)
    assert res.diagnostics["start"] == "design"
    assert int(res.indices[0]) // 60 == 3  # the only blob without a labeled row
    assert select("kmeanspp", embeddings=X, batch_size=1, seed=0).diagnostics["start"] == "random"


def test_typiclust_cycles_when_the_batch_exceeds_the_clusters() -> None:
    X = blobs(per=20, centers=2)
    res = select("typiclust", embeddings=X, batch_size=6, max_clusters=2, seed=0)
    assert sorted((res.indices // 20).tolist()) == [0, 0, 0, 1, 1, 1]
    assert res.diagnostics["cycles"] == 2


def test_typiclust_small_clusters_are_used_when_the_large_ones_run_out() -> None:
    X = np.concatenate([blobs(per=6, centers=1), np.array([[500.0] * 5, [900.0] * 5])])
    res = select("typiclust", embeddings=X, batch_size=8, max_clusters=3, min_cluster_size=5, seed=0)
    assert sorted(res.indices.tolist()) == list(range(8))


def test_typiclust_bounded_paths_sample_rows_and_clusters() -> None:
    X = np.random.default_rng(5).normal(size=(3000, 8)).astype(np.float32)
    res = select(
        "typiclust", embeddings=X, batch_size=3, kmeans_sample=500, max_typicality_points=200, chunk_size=128, seed=0
    )
    assert res.diagnostics["kmeans"]["sample"] == 500
    assert res.diagnostics["sampled_clusters"] == 3
    again = select(
        "typiclust", embeddings=X, batch_size=3, kmeans_sample=500, max_typicality_points=200, chunk_size=128, seed=0
    )
    assert again.indices.tolist() == res.indices.tolist()


@pytest.mark.parametrize("name", COLD)
def test_float32_and_float64_agree_on_separated_data(name: str) -> None:
    X = blobs()
    a = select(name, embeddings=X, batch_size=4, seed=1, dtype="float64")
    b = select(name, embeddings=X, batch_size=4, seed=1, dtype="float32")
    assert a.indices.tolist() == b.indices.tolist()


@pytest.mark.parametrize("name", COLD)
def test_input_errors(name: str) -> None:
    X = np.random.default_rng(0).normal(size=(5, 3))
    with pytest.raises(ParameterError, match="batch_size=6 but only 5 candidate rows"):
        select(name, embeddings=X, batch_size=6)
    with pytest.raises(ParameterError, match="only 3 candidate rows"):
        select(name, embeddings=X, labeled=[0, 1], batch_size=4)
    bad = X.copy()
    bad[2, 1] = np.nan
    with pytest.raises(InputDataError, match="NaN or inf"):
        select(name, embeddings=bad, batch_size=2)
    with pytest.raises(InputDataError, match="2-D"):
        select(name, embeddings=X[:, 0], batch_size=2)
    with pytest.raises(InputDataError, match="empty"):
        select(name, embeddings=np.zeros((0, 3)), batch_size=1)


@pytest.mark.parametrize(
    ("param", "value", "message"),
    [
        ("knn", 0, "knn must be >= 1"),
        ("max_clusters", True, "max_clusters must be an integer"),
        ("kmeans_sample", 2.5, "kmeans_sample must be an integer"),
        ("max_typicality_points", 1, "max_typicality_points must be >= 2"),
        ("min_cluster_size", 0, "min_cluster_size must be >= 1"),
        ("kmeans_iters", 0, "kmeans_iters must be >= 1"),
    ],
)
def test_typiclust_parameter_errors(param: str, value: object, message: str) -> None:
    X = blobs(per=10)
    with pytest.raises(ParameterError, match=message):
        select("typiclust", embeddings=X, batch_size=2, **{param: value})


def test_kmeanspp_takes_no_parameters() -> None:
    with pytest.raises(ParameterError, match="valid parameters: none"):
        select("kmeanspp", embeddings=blobs(per=10), batch_size=2, knn=3)


def test_duplicates_do_not_break_either_strategy() -> None:
    X = np.ones((30, 4))
    for name in COLD:
        res = select(name, embeddings=X, batch_size=7, seed=0)
        assert len(set(res.indices.tolist())) == 7

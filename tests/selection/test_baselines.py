"""Baselines against naive brute-force implementations on tiny pools (float32, float64, CUDA if present)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from selection import STRATEGIES, InputDataError, TaskMismatchError, select
from selection.logdet import greedy_logdet_kron
from tests.devices import AVAILABLE_DEVICES, DEVICES

DTYPES = ["float32", "float64"]
CLASSIFICATION_ONLY = ["badge", "confidence", "margin", "entropy", "logdet_rank1"]
BASELINES = ["badge", "coreset", "confidence", "margin", "entropy", "random", "logdet_rank1"]


def make_pool(n: int = 40, d: int = 4, k: int = 3, seed: int = 0, temp: float = 1.0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d))
    logits = rng.normal(size=(n, k)) * temp
    P = np.exp(logits - logits.max(1, keepdims=True))
    P /= P.sum(1, keepdims=True)
    return X, P


def candidates_of(n: int, labeled, reserved=()) -> np.ndarray:
    taken = set(labeled) | set(reserved)
    return np.array([i for i in range(n) if i not in taken], dtype=np.int64)


# ---------------------------------------------------------------- naive references (numpy, float64)


def kron_embeddings(X: np.ndarray, P: np.ndarray) -> np.ndarray:
    """Explicit n x dk BADGE embeddings, class-major: row = (e_yhat - p) ⊗ x."""
    A = np.eye(P.shape[1])[P.argmax(1)] - P
    return np.stack([np.kron(a, x) for a, x in zip(A, X, strict=True)])


def badge_ref(X, P, cand, B, seed):
    G = kron_embeddings(X, P)[cand]
    gen = torch.Generator().manual_seed(seed)
    picks = [int(np.argmax((G**2).sum(1)))]
    mind = ((G - G[picks[0]]) ** 2).sum(1)
    for _ in range(B - 1):
        w = mind.copy()
        w[picks] = 0.0
        u = float(torch.rand(1, generator=gen, dtype=torch.float64))
        cum = np.cumsum(w)
        j = int(np.searchsorted(cum, u * cum[-1], side="right"))
        picks.append(j)
        mind = np.minimum(mind, ((G - G[j]) ** 2).sum(1))
    return cand[picks]


def coreset_ref(X, cand, design, B, seed):
    D = ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1)  # n x n
    picks: list[int] = []
    centres = list(design)
    if not centres:
        first = int(torch.randint(len(cand), (1,), generator=torch.Generator().manual_seed(seed)))
        picks.append(int(cand[first]))
        centres.append(int(cand[first]))
    while len(picks) < B:
        best, best_d = -1, -1.0
        for i in cand:
            if i in picks:
                continue
            di = min(D[i, c] for c in centres)
            if di > best_d:
                best, best_d = int(i), di
        picks.append(best)
        centres.append(best)
    return np.array(picks)


def uncertainty_ref(name, P, cand, B):
    def score(i):
        p = sorted(P[i], reverse=True)
        if name == "confidence":
            return p[0]
        if name == "margin":
            return p[0] - p[1]
        return sum(v * math.log(v) for v in p if v > 0)  # minus entropy: smallest first

    return np.array(sorted(cand, key=lambda i: (score(i), i))[:B])


def logdet_ref(X, P, cand, design, B, lam):
    G = kron_embeddings(X, P)
    M = lam * np.eye(G.shape[1]) + G[design].T @ G[design]
    picks, total = [], 0.0
    for _ in range(B):
        gains = {int(i): math.log1p(G[i] @ np.linalg.solve(M, G[i])) for i in cand if i not in picks}
        best = max(gains, key=lambda i: (gains[i], -i))
        picks.append(best)
        total += gains[best]
        M = M + np.outer(G[best], G[best])
    return np.array(picks), total


# ---------------------------------------------------------------- against the references


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_badge_matches_bruteforce(dtype, device, seed):
    X, P = make_pool(seed=seed)
    lab = [0, 5, 7]
    res = select("badge", embeddings=X, probs=P, labeled=lab, batch_size=8, seed=seed, dtype=dtype, device=device)
    ref = badge_ref(X, P, candidates_of(40, lab), 8, seed)
    np.testing.assert_array_equal(res.indices, ref)


def test_badge_first_center_has_largest_gradient_norm():
    X, P = make_pool(n=60, seed=3)
    G = kron_embeddings(X, P)
    res = select("badge", embeddings=X, probs=P, batch_size=1)
    assert res.indices[0] == int(np.argmax((G**2).sum(1)))


def test_badge_second_pick_follows_d2_distribution():
    # k-means++: P(second = j) ∝ ||g_j - g_first||^2. 4000 seeds, 12 candidates.
    X, P = make_pool(n=12, d=2, k=3, seed=4)
    G = kron_embeddings(X, P)
    first = int(np.argmax((G**2).sum(1)))
    w = ((G - G[first]) ** 2).sum(1)
    expected = w / w.sum()
    counts = np.zeros(12)
    for seed in range(4000):
        counts[select("badge", embeddings=X, probs=P, batch_size=2, seed=seed).indices[1]] += 1
    assert counts[first] == 0
    freq = counts / counts.sum()
    assert np.abs(freq - expected).max() < 4 * np.sqrt(expected.max() / 4000)


def test_badge_handles_duplicate_rows_with_uniform_fallback():
    X = np.ones((6, 3))
    P = np.full((6, 2), 0.5)
    res = select("badge", embeddings=X, probs=P, batch_size=6)
    assert sorted(res.indices) == list(range(6))
    assert res.diagnostics["uniform_draws"] == 5


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("labeled", "reserved"), [([], []), ([1, 2, 30], []), ([3], [4, 9])])
def test_coreset_matches_bruteforce(dtype, device, labeled, reserved):
    X, _ = make_pool(n=35, d=3)
    res = select(
        "coreset", embeddings=X, task="regression", labeled=labeled, reserved=reserved,
        batch_size=7, seed=5, dtype=dtype, device=device, chunk_size=4,
    )  # fmt: skip
    ref = coreset_ref(X, candidates_of(35, labeled, reserved), labeled + reserved, 7, 5)
    np.testing.assert_array_equal(res.indices, ref)


def test_coreset_random_start_depends_on_seed_only_without_design():
    X, _ = make_pool(n=50)
    starts = {int(select("coreset", embeddings=X, task="regression", batch_size=1, seed=s).indices[0])
              for s in range(10)}  # fmt: skip
    assert len(starts) > 1
    with_lab = {tuple(select("coreset", embeddings=X, task="regression", labeled=[0], batch_size=3,
                             seed=s).indices) for s in range(5)}  # fmt: skip
    assert len(with_lab) == 1


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["confidence", "margin", "entropy"])
def test_uncertainty_matches_bruteforce(name, dtype, device):
    X, P = make_pool(n=50, k=4, temp=2.0)
    lab = [0, 1, 10]
    res = select(name, embeddings=X, probs=P, labeled=lab, reserved=[11], batch_size=10, dtype=dtype,
                 device=device)  # fmt: skip
    np.testing.assert_array_equal(res.indices, uncertainty_ref(name, P, candidates_of(50, lab, [11]), 10))


@pytest.mark.parametrize("name", ["confidence", "margin", "entropy"])
def test_uncertainty_ties_go_to_lowest_row(name):
    X, P = make_pool(n=10, k=3)
    P[[2, 5, 8]] = np.array([1 / 3, 1 / 3, 1 / 3])  # identical, most uncertain rows
    res = select(name, embeddings=X, probs=P, labeled=[2], batch_size=2)
    np.testing.assert_array_equal(res.indices, [5, 8])


def test_entropy_handles_zero_probabilities():
    X, _ = make_pool(n=3)
    P = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.2, 0.3, 0.5]])
    res = select("entropy", embeddings=X, probs=P, batch_size=3)
    np.testing.assert_array_equal(res.indices, [2, 1, 0])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("labeled", "init"),
    [([], "none"), ([0, 3, 6, 9, 12], "woodbury"), (list(range(0, 40, 3)), "dense")],  # dk = 12
)
def test_logdet_rank1_matches_bruteforce(dtype, device, labeled, init):
    X, P = make_pool(n=40, d=4, k=3)
    res = select("logdet_rank1", embeddings=X, probs=P, labeled=labeled, batch_size=8, lam=0.5,
                 dtype=dtype, device=device, chunk_size=7)  # fmt: skip
    ref, total = logdet_ref(X, P, candidates_of(40, labeled), labeled, 8, 0.5)
    assert res.diagnostics["init"] == init
    np.testing.assert_array_equal(res.indices, ref)
    rtol = 1e-4 if dtype == "float32" else 1e-10
    assert res.objective == pytest.approx(total, rel=rtol)


def test_logdet_objective_is_logdet_increase():
    X, P = make_pool(n=30, d=3, k=2)
    G = kron_embeddings(X, P)
    lab = [0, 1]
    res = select("logdet_rank1", embeddings=X, probs=P, labeled=lab, batch_size=5, lam=2.0)
    M0 = 2.0 * np.eye(6) + G[lab].T @ G[lab]
    MB = M0 + G[res.indices].T @ G[res.indices]
    expected = np.linalg.slogdet(MB)[1] - np.linalg.slogdet(M0)[1]
    assert res.objective == pytest.approx(expected, rel=1e-10)


def test_greedy_logdet_kron_with_unit_factors_is_plain_vectors():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(25, 5))
    ones = torch.ones(25, 1, dtype=torch.float64)
    out = greedy_logdet_kron(ones, torch.from_numpy(X), ones[:0], torch.from_numpy(X[:0]), lam=0.3, steps=6)
    M = 0.3 * np.eye(5)
    picks = []
    for _ in range(6):
        gains = [(-np.inf if i in picks else math.log1p(x @ np.linalg.solve(M, x))) for i, x in enumerate(X)]
        j = int(np.argmax(gains))
        picks.append(j)
        M += np.outer(X[j], X[j])
    assert out.picks == picks


@pytest.mark.parametrize("lam", [0.0, -1.0, math.nan, math.inf, True, "1"])
def test_logdet_rejects_bad_lam(lam):
    X, P = make_pool()
    with pytest.raises(ValueError, match="lam"):
        select("logdet_rank1", embeddings=X, probs=P, batch_size=2, lam=lam)


# ---------------------------------------------------------------- random


def test_random_is_reproducible_and_device_dtype_independent():
    X, P = make_pool(n=100)
    runs = [
        select("random", embeddings=X, probs=P, labeled=[1, 2], batch_size=10, seed=7, dtype=dt).indices
        for dt in DTYPES
    ]
    runs += [select("random", embeddings=X, task="regression", labeled=[1, 2], batch_size=10, seed=7,
                    device=dev).indices for dev in AVAILABLE_DEVICES]  # fmt: skip
    for r in runs[1:]:
        np.testing.assert_array_equal(r, runs[0])
    other = select("random", embeddings=X, probs=P, labeled=[1, 2], batch_size=10, seed=8).indices
    assert not np.array_equal(other, runs[0])


def test_random_is_uniform_over_candidates():
    X, P = make_pool(n=20)
    counts = np.zeros(20)
    for seed in range(2000):
        counts[select("random", embeddings=X, probs=P, labeled=[0, 1], batch_size=3, seed=seed).indices] += 1
    assert counts[:2].sum() == 0
    expected = 2000 * 3 / 18
    assert np.abs(counts[2:] - expected).max() < 4 * math.sqrt(expected)


# ---------------------------------------------------------------- properties of every baseline


@pytest.mark.parametrize("name", BASELINES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_baseline_never_returns_labeled_or_reserved_and_rows_are_distinct(name, dtype):
    X, P = make_pool(n=30)
    lab, res_ = [0, 4, 9, 17], [2, 3, 29]
    out = select(name, embeddings=X, probs=P, labeled=lab, reserved=res_, batch_size=23, dtype=dtype)
    assert out.indices.dtype == np.int64
    assert len(set(out.indices.tolist())) == 23
    assert sorted(out.indices.tolist()) == candidates_of(30, lab, res_).tolist()  # all candidates taken


@pytest.mark.parametrize("name", BASELINES)
def test_baseline_is_deterministic_given_seed(name):
    X, P = make_pool(n=60)
    a = select(name, embeddings=X, probs=P, labeled=[1], batch_size=12, seed=3)
    b = select(name, embeddings=X, probs=P, labeled=[1], batch_size=12, seed=3)
    np.testing.assert_array_equal(a.indices, b.indices)


@pytest.mark.parametrize("name", BASELINES)
def test_baseline_float32_agrees_with_float64(name):
    X, P = make_pool(n=60, seed=9)
    a = select(name, embeddings=X, probs=P, batch_size=10, seed=1, dtype="float32")
    b = select(name, embeddings=X, probs=P, batch_size=10, seed=1, dtype="float64")
    np.testing.assert_array_equal(a.indices, b.indices)
    assert a.diagnostics["dtype"] == "float32" and b.diagnostics["dtype"] == "float64"


@pytest.mark.parametrize("name", CLASSIFICATION_ONLY)
def test_classification_only_strategy_rejects_regression(name):
    X, _ = make_pool()
    assert STRATEGIES[name].tasks == ("classification",)
    with pytest.raises(TaskMismatchError, match="coreset"):
        select(name, embeddings=X, task="regression", batch_size=2)


@pytest.mark.parametrize("name", ["coreset", "random"])
def test_regression_strategies_run_on_regression(name):
    X, _ = make_pool()
    assert set(STRATEGIES[name].tasks) == {"classification", "regression"}
    res = select(name, embeddings=X, task="regression", labeled=[0], batch_size=5)
    assert len(res.indices) == 5 and 0 not in res.indices
    with pytest.raises(InputDataError, match="regression"):
        select(name, embeddings=X, probs=make_pool()[1], task="regression", batch_size=5)


@pytest.mark.parametrize("name", ["badge", "coreset", "logdet_rank1"])
def test_progress_callback_reaches_total(name):
    X, P = make_pool(n=30)
    calls: list[tuple[int, int]] = []
    select(name, embeddings=X, probs=P, batch_size=6, progress=lambda done, total: calls.append((done, total)))
    assert calls[-1] == (6, 6)
    assert [c[0] for c in calls] == sorted(c[0] for c in calls)

"""Fast structured BAIT against the naive explicit implementation (tests/selection/naive_bait.py).

float64: identical picks (kept set in forward order) and objectives equal to 1e-8 relative.
float32: compared by the exact float64 objective of the chosen set (the notes' sec. 3 tolerances).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import pytest
import torch

from selection import select
from selection.bait import bait, bait_nofisher, design_weights, logdet_fisher
from selection.errors import MemoryBudgetError, ParameterError
from selection.fisher import exact_objective
from selection.problem import Problem
from tests.devices import DEVICES
from tests.selection.naive_bait import naive_bait


@dataclass(frozen=True)
class Case:
    seed: int
    n: int
    d: int
    k: int  # 1 = regression
    batch: int
    n_labeled: int = 0
    n_reserved: int = 0
    lam: float = 1.0
    convention: str = "reference"
    oversample: int = 2
    temperature: float = 2.0  # logit scale
    dup_frac: float = 0.0  # fraction of rows replaced by copies of other rows
    rank: int | None = None  # embedding rank (None = full)
    chunk_size: int = 64


@dataclass
class Data:
    x: np.ndarray  # n x d
    probs: np.ndarray | None  # n x k
    labeled: list[int]
    reserved: list[int]


def make_data(case: Case) -> Data:
    rng = np.random.default_rng(case.seed)
    x = rng.normal(size=(case.n, case.d))
    if case.rank is not None and case.rank < case.d:
        x = rng.normal(size=(case.n, case.rank)) @ rng.normal(size=(case.rank, case.d)) / math.sqrt(case.rank)
    probs = None
    logits = rng.normal(size=(case.n, max(case.k, 1))) * case.temperature
    if case.dup_frac > 0:
        n_dup = int(case.dup_frac * case.n)
        src = rng.integers(0, case.n, size=n_dup)
        dst = rng.choice(case.n, size=n_dup, replace=False)
        x[dst] = x[src]
        logits[dst] = logits[src]
    if case.k > 1:
        z = np.exp(logits - logits.max(1, keepdims=True))
        probs = z / z.sum(1, keepdims=True)
    perm = rng.permutation(case.n)
    labeled = sorted(perm[: case.n_labeled].tolist())
    reserved = sorted(perm[case.n_labeled : case.n_labeled + case.n_reserved].tolist())
    return Data(x=x, probs=probs, labeled=labeled, reserved=reserved)


def make_problem(
    data: Data, batch: int, *, dtype: torch.dtype = torch.float64, device: str = "cpu", chunk_size: int = 64
) -> Problem:
    n = data.x.shape[0]
    cand = sorted(set(range(n)) - set(data.labeled) - set(data.reserved))

    def idx(a: list[int]) -> torch.Tensor:
        return torch.tensor(a, dtype=torch.int64, device=device)

    return Problem(
        X=torch.tensor(data.x, dtype=dtype, device=device),
        probs=None if data.probs is None else torch.tensor(data.probs, dtype=dtype, device=device),
        labeled=idx(data.labeled),
        reserved=idx(data.reserved),
        candidates=idx(cand),
        batch_size=batch,
        task="classification" if data.probs is not None else "regression",
        chunk_size=chunk_size,
    )


def random_case(seed: int) -> Case:
    rng = np.random.default_rng(10_000 + seed)
    k = int(rng.choice([1, 2, 3, 4, 6]))
    d = int(rng.integers(1, 17))
    d = max(1, min(d, 64 // max(k, 1)))  # keep the naive kd x kd algebra small
    n = int(rng.integers(20, 201))
    return Case(
        seed=seed,
        n=n,
        d=d,
        k=k,
        batch=int(rng.integers(1, min(20, n // 4) + 1)),
        n_labeled=int(rng.choice([0, 3, 10])),
        n_reserved=int(rng.choice([0, 0, 4])),
        lam=float(rng.choice([0.01, 1.0])),
        convention=str(rng.choice(["reference", "paper", "sum"])),
        temperature=float(rng.choice([0.5, 2.0, 6.0])),
        dup_frac=float(rng.choice([0.0, 0.0, 0.2])),
        rank=None if rng.random() < 0.75 else max(1, d // 3),
        chunk_size=int(rng.choice([7, 64, 8192])),
    )


def assert_matches_naive(case: Case, strategy: str = "bait", *, fisher_weights: np.ndarray | None = None) -> None:
    data = make_data(case)
    problem = make_problem(data, case.batch, chunk_size=case.chunk_size)
    if strategy == "bait":
        out = bait(
            problem,
            lam=case.lam,
            convention=case.convention,
            oversample=case.oversample,
            fisher_weights=fisher_weights,
        )
        mode = "fisher"
    elif strategy == "bait_nofisher":
        out = bait_nofisher(problem, lam=case.lam, convention=case.convention, oversample=case.oversample)
        mode = "identity"
    else:
        out = logdet_fisher(problem, lam=case.lam, convention=case.convention)
        mode = "logdet"
    ref = naive_bait(
        data.x,
        data.probs,
        data.labeled,
        data.reserved,
        case.batch,
        lam=case.lam,
        oversample=case.oversample,
        convention=case.convention,
        mode=mode,
        fisher_weights=fisher_weights,
    )
    assert out.indices.dtype == np.int64
    assert out.indices.tolist() == ref.indices, case
    if mode != "logdet":
        assert out.diagnostics["forward_indices"] == ref.forward, case
    value = out.diagnostics["logdet"] if mode == "logdet" else out.objective
    assert value == pytest.approx(ref.objective, rel=1e-8, abs=1e-12), case


# --------------------------------------------------------------------------------------------------
# Random small problems, float64: identical picks, objective to 1e-8
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(40))
def test_bait_matches_naive_on_random_problems(seed: int) -> None:
    assert_matches_naive(random_case(seed), "bait")


@pytest.mark.parametrize("seed", range(12))
def test_bait_nofisher_matches_naive_on_random_problems(seed: int) -> None:
    assert_matches_naive(random_case(100 + seed), "bait_nofisher")


@pytest.mark.parametrize("seed", range(12))
def test_logdet_fisher_matches_naive_on_random_problems(seed: int) -> None:
    case = random_case(200 + seed)
    if case.k == 1:
        case = replace(case, k=3, d=min(case.d, 16))
    assert_matches_naive(case, "logdet_fisher")


@pytest.mark.parametrize("convention", ["reference", "paper", "sum"])
@pytest.mark.parametrize("lam", [0.01, 1.0])
@pytest.mark.parametrize("k", [1, 2, 5])
def test_bait_matches_naive_each_convention_lam_and_k(convention: str, lam: float, k: int) -> None:
    case = Case(seed=7, n=150, d=6, k=k, batch=12, n_labeled=10, n_reserved=3, lam=lam, convention=convention)
    assert_matches_naive(case)


def test_bait_matches_naive_on_larger_pool_with_cholesky_setup() -> None:
    # |L| r >= D/2 forces the dense Cholesky path for M_0.
    case = Case(seed=3, n=300, d=5, k=4, batch=20, n_labeled=40, n_reserved=5, lam=0.01)
    problem = make_problem(make_data(case), case.batch)
    assert bait(problem, lam=case.lam).diagnostics["p0_method"] == "cholesky"
    assert_matches_naive(case)


def test_bait_matches_naive_with_woodbury_setup() -> None:
    case = Case(seed=4, n=200, d=16, k=4, batch=10, n_labeled=3, n_reserved=2, lam=1.0)
    problem = make_problem(make_data(case), case.batch)
    assert bait(problem).diagnostics["p0_method"] == "woodbury"
    assert_matches_naive(case)


def test_bait_uses_identity_setup_without_labels() -> None:
    case = Case(seed=5, n=120, d=8, k=3, batch=8)
    problem = make_problem(make_data(case), case.batch)
    assert bait(problem).diagnostics["p0_method"] == "identity"
    assert_matches_naive(case)


def test_bait_fisher_weights_match_naive() -> None:
    case = Case(seed=11, n=120, d=6, k=3, batch=8, n_labeled=5, lam=0.1)
    weights = np.random.default_rng(0).uniform(0, 3, size=case.n)
    weights[:10] = 0.0
    assert_matches_naive(case, fisher_weights=weights)


def test_bait_uniform_fisher_weights_equal_default() -> None:
    case = Case(seed=12, n=100, d=5, k=3, batch=6, n_labeled=4)
    problem = make_problem(make_data(case), case.batch)
    a = bait(problem)
    b = bait(problem, fisher_weights=np.full(case.n, 2.5))
    assert a.indices.tolist() == b.indices.tolist()
    assert a.objective == pytest.approx(b.objective, rel=1e-12)


# --------------------------------------------------------------------------------------------------
# Edge cases
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("lam", [0.01, 1.0])
def test_bait_peaked_probabilities(lam: float) -> None:
    # logit scale 40: smallest probabilities ~1e-30, class Fisher nearly singular.
    assert_matches_naive(Case(seed=21, n=150, d=6, k=5, batch=10, n_labeled=5, lam=lam, temperature=40.0))


def test_bait_one_hot_probabilities() -> None:
    case = Case(seed=22, n=80, d=4, k=3, batch=5, n_labeled=3)
    data = make_data(case)
    assert data.probs is not None
    data.probs[:20] = np.eye(3)[np.arange(20) % 3]  # exactly zero Fisher on these rows
    problem = make_problem(data, case.batch)
    out = bait(problem)
    ref = naive_bait(data.x, data.probs, data.labeled, data.reserved, case.batch)
    assert out.indices.tolist() == ref.indices
    assert out.objective == pytest.approx(ref.objective, rel=1e-8)


@pytest.mark.parametrize("k", [1, 2, 5])
def test_bait_duplicate_rows(k: int) -> None:
    assert_matches_naive(Case(seed=23, n=150, d=6, k=k, batch=12, n_labeled=4, dup_frac=0.3, lam=0.01))


@pytest.mark.parametrize("k", [1, 2, 5])
def test_bait_exact_ties_go_to_lowest_index(k: int) -> None:
    # Every point triplicated: every gain is tied three ways; the lowest row must win every tie.
    base = make_data(Case(seed=24, n=20, d=4, k=k, batch=1))
    x = np.concatenate([base.x] * 3)
    probs = None if base.probs is None else np.concatenate([base.probs] * 3)
    data = Data(x=x, probs=probs, labeled=[], reserved=[])
    problem = make_problem(data, 8)
    out = bait(problem, lam=0.1)
    ref = naive_bait(x, probs, [], [], 8, lam=0.1)
    assert out.indices.tolist() == ref.indices
    first = bait(problem, lam=0.1, oversample=1)
    assert int(first.indices[0]) < 20  # the first pick is the lowest copy of its point


@pytest.mark.parametrize("k", [1, 3])
def test_bait_rank_deficient_embeddings(k: int) -> None:
    assert_matches_naive(Case(seed=25, n=150, d=12, k=k, batch=15, n_labeled=5, rank=3, lam=0.01))


def test_bait_binary_classification() -> None:
    assert_matches_naive(Case(seed=26, n=200, d=10, k=2, batch=15, n_labeled=8, n_reserved=2, lam=0.01))


@pytest.mark.parametrize("k", [1, 2, 4])
def test_bait_one_dimensional_embeddings(k: int) -> None:
    assert_matches_naive(Case(seed=27, n=60, d=1, k=k, batch=5, n_labeled=3))


@pytest.mark.parametrize("k", [1, 3])
def test_bait_batch_equals_number_of_candidates(k: int) -> None:
    case = Case(seed=28, n=30, d=3, k=k, batch=24, n_labeled=4, n_reserved=2)
    assert_matches_naive(case)
    out = bait(make_problem(make_data(case), case.batch))
    assert sorted(out.indices.tolist()) == sorted(
        set(range(30)) - set(make_data(case).labeled) - set(make_data(case).reserved)
    )
    assert out.diagnostics["steps"] == {"forward": 24, "backward": 0}


def test_bait_oversample_capped_at_candidates() -> None:
    case = Case(seed=29, n=30, d=3, k=3, batch=20)
    out = bait(make_problem(make_data(case), case.batch))
    assert out.diagnostics["steps"] == {"forward": 30, "backward": 10}
    assert_matches_naive(case)


def test_bait_oversample_one_is_forward_only() -> None:
    case = Case(seed=30, n=120, d=5, k=4, batch=10, n_labeled=5, oversample=1)
    assert_matches_naive(case)
    data = make_data(case)
    out = bait(make_problem(data, case.batch), oversample=1)
    assert out.diagnostics["steps"] == {"forward": 10, "backward": 0}
    # Forward-only picks are the first B forward picks of the oversampled run.
    ref = naive_bait(data.x, data.probs, data.labeled, data.reserved, case.batch, oversample=2)
    assert out.indices.tolist() == ref.forward[: case.batch]


def test_bait_oversample_three() -> None:
    assert_matches_naive(Case(seed=31, n=150, d=4, k=3, batch=6, n_labeled=4, oversample=3))


def test_bait_reserved_rows_never_picked_and_counted_in_design() -> None:
    case = Case(seed=32, n=120, d=5, k=3, batch=10, n_labeled=5, n_reserved=15)
    data = make_data(case)
    out = bait(make_problem(data, case.batch))
    assert not set(out.indices.tolist()) & set(data.reserved)
    # Same selection as if the reserved rows were labeled: they are in M with the labeled weight.
    as_labeled = Data(x=data.x, probs=data.probs, labeled=sorted(data.labeled + data.reserved), reserved=[])
    out2 = bait(make_problem(as_labeled, case.batch))
    assert out.indices.tolist() == out2.indices.tolist()
    assert out.objective == pytest.approx(out2.objective, rel=1e-12)
    ref = naive_bait(data.x, data.probs, data.labeled, data.reserved, case.batch)
    assert out.indices.tolist() == ref.indices
    # Ignoring them changes the design and the objective.
    ignored = naive_bait(data.x, data.probs, data.labeled, [], case.batch)
    assert ignored.objective != pytest.approx(out.objective, rel=1e-6)


def test_bait_objective_equals_exact_objective_of_returned_set() -> None:
    case = Case(seed=33, n=150, d=6, k=4, batch=10, n_labeled=6, lam=0.1, convention="paper")
    data = make_data(case)
    problem = make_problem(data, case.batch)
    out = bait(problem, lam=0.1, convention="paper")
    w_l, w_s = design_weights("paper", len(data.labeled), case.batch)
    exact = exact_objective(
        problem.X,
        problem.probs,
        problem.in_design,
        torch.as_tensor(out.indices),
        lam=0.1,
        w_design=w_l,
        w_picked=w_s,
    )
    assert out.objective == pytest.approx(exact, rel=1e-10)


def test_bait_result_independent_of_chunk_size() -> None:
    case = Case(seed=34, n=200, d=7, k=4, batch=10, n_labeled=6)
    data = make_data(case)
    outs = [bait(make_problem(data, case.batch, chunk_size=cs)) for cs in (1, 13, 8192)]
    assert outs[0].indices.tolist() == outs[1].indices.tolist() == outs[2].indices.tolist()
    assert outs[0].objective == pytest.approx(outs[2].objective, rel=1e-10)


def test_bait_reports_progress_to_completion() -> None:
    case = Case(seed=35, n=100, d=4, k=3, batch=5, n_labeled=3)
    seen: list[tuple[int, int]] = []
    problem = replace(make_problem(make_data(case), case.batch), progress=lambda a, b: seen.append((a, b)))
    bait(problem)
    assert seen
    dones = [a for a, _ in seen]
    assert dones == sorted(dones)
    assert seen[-1][0] == seen[-1][1]
    assert len({b for _, b in seen}) == 1


def test_bait_diagnostics() -> None:
    case = Case(seed=36, n=100, d=4, k=3, batch=5, n_labeled=3)
    out = bait(make_problem(make_data(case), case.batch))
    diag = out.diagnostics
    assert set(diag["timings"]) >= {"setup", "forward", "backward"}
    assert all(v >= 0 for v in diag["timings"].values())
    assert diag["steps"] == {"forward": 10, "backward": 5}
    assert diag["D"] == (3 - 1) * 4
    assert diag["dtype"] == "float64" and diag["matrix_dtype"] == "float64"
    assert diag["device"] == "cpu"
    assert diag["approximation"]["kind"] == "exact" and diag["approximation"]["requested"] == "auto"


def test_logdet_fisher_single_pick_maximises_logdet() -> None:
    case = Case(seed=37, n=60, d=3, k=3, batch=1)
    data = make_data(case)
    out = logdet_fisher(make_problem(data, 1))
    best = max(
        range(case.n),
        key=lambda i: (
            naive_bait(
                data.x[[i]], None if data.probs is None else data.probs[[i]], [], [], 1, mode="logdet", convention="sum"
            ).objective
        ),
    )
    assert out.indices.tolist() == [best]


# --------------------------------------------------------------------------------------------------
# float32
# --------------------------------------------------------------------------------------------------


def _exact(data: Data, rows: np.ndarray, *, lam: float, convention: str, batch: int) -> float:
    problem = make_problem(data, batch)
    w_l, w_s = design_weights(convention, len(data.labeled) + len(data.reserved), batch)
    return exact_objective(
        problem.X,
        problem.probs,
        problem.in_design,
        torch.as_tensor(rows),
        lam=lam,
        w_design=w_l,
        w_picked=w_s,
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("lam", "rtol"), [(1.0, 1e-3), (0.01, 3e-2)])
@pytest.mark.parametrize("k", [1, 2, 6])
def test_bait_float32_objective_close_to_float64(device: str, lam: float, rtol: float, k: int) -> None:
    case = Case(seed=40 + k, n=600, d=16, k=k, batch=20, n_labeled=20, n_reserved=5, lam=lam)
    data = make_data(case)
    out64 = bait(make_problem(data, case.batch, device=device, chunk_size=256), lam=lam)
    out32 = bait(make_problem(data, case.batch, dtype=torch.float32, device=device, chunk_size=256), lam=lam)
    assert out32.diagnostics["dtype"] == "float32"
    assert out32.diagnostics["matrix_dtype"] == "float64"
    assert len(set(out32.indices.tolist())) == case.batch
    exact64 = _exact(data, out64.indices, lam=lam, convention="reference", batch=case.batch)
    exact32 = _exact(data, out32.indices, lam=lam, convention="reference", batch=case.batch)
    assert exact64 == pytest.approx(out64.objective, rel=1e-8)
    assert abs(exact32 - exact64) <= rtol * exact64
    # The reported float32 objective is that of the returned set.
    assert out32.objective == pytest.approx(exact32, rel=1e-3)


# --------------------------------------------------------------------------------------------------
# Approximation, memory budget, parameters
# --------------------------------------------------------------------------------------------------


def test_bait_pca_approximation_close_to_exact() -> None:
    rng = np.random.default_rng(50)
    n, d, k = 400, 24, 4
    # Embeddings with a decaying spectrum, as real penultimate layers have.
    x = rng.normal(size=(n, d)) * (0.8 ** np.arange(d))
    logits = x[:, :k] * 3 + rng.normal(size=(n, k))
    probs = np.exp(logits - logits.max(1, keepdims=True))
    probs /= probs.sum(1, keepdims=True)
    data = Data(x=x, probs=probs, labeled=list(range(0, n, 40)), reserved=[])
    problem = make_problem(data, 15)
    exact = bait(problem)
    approx = bait(problem, approx="pca", approx_dim=d // 2)
    assert approx.diagnostics["approximation"]["kind"] == "pca"
    assert approx.diagnostics["approx_dim"] == d // 2
    assert approx.diagnostics["objective_kind"] == "exact"
    gap = approx.diagnostics["exact_objective"] / exact.objective - 1
    assert -0.02 <= gap <= 0.03, gap  # within a few % (greedy on the projection may even do better)
    assert approx.objective == approx.diagnostics["exact_objective"]
    # A full-dimensional projection is a rotation: same problem, same objective.
    full = bait(problem, approx="pca", approx_dim=d)
    assert full.diagnostics["exact_objective"] == pytest.approx(exact.objective, rel=1e-8)


def test_bait_memory_budget_error_names_the_approximation() -> None:
    case = Case(seed=51, n=200, d=64, k=6, batch=5)
    problem = make_problem(make_data(case), case.batch)
    with pytest.raises(MemoryBudgetError, match="approx='pca'"):
        bait(problem, max_memory_gb=1e-3, approx="exact")
    # The default (auto) plan projects by itself and records it.
    auto = bait(problem, max_memory_gb=1e-3)
    assert auto.diagnostics["approximation"]["kind"] in ("pca", "pca+topc")
    assert auto.diagnostics["approximation"]["estimated_gb"] <= 1e-3
    # The suggested projection fits the same budget.
    out = bait(problem, max_memory_gb=1e-3, approx="pca", approx_dim=8)
    assert len(out.indices) == case.batch
    assert out.diagnostics["D"] == 5 * 8


def test_bait_default_pca_dim_shrinks_to_budget() -> None:
    case = Case(seed=52, n=200, d=64, k=6, batch=5)
    problem = make_problem(make_data(case), case.batch)
    # d // 4 = 16 needs ~0.35 MB here; the default must shrink below it to fit 0.2 MB.
    out = bait(problem, max_memory_gb=2e-4, approx="pca")
    assert 1 <= out.diagnostics["approx_dim"] < 16
    assert len(out.indices) == case.batch


@pytest.mark.parametrize(
    "params",
    [
        {"lam": 0.0},
        {"lam": -1.0},
        {"lam": float("nan")},
        {"oversample": 0.5},
        {"convention": "bogus"},
        {"approx": "random"},
        {"approx": "pca", "approx_dim": 0},
        {"approx": "pca", "approx_dim": 1000},
        {"approx": "exact", "approx_dim": 3},
        {"max_memory_gb": 0},
        {"fisher_weights": [1.0, 2.0]},
        {"fisher_weights": np.full(50, -1.0)},
        {"fisher_weights": np.zeros(50)},
    ],
)
def test_bait_rejects_bad_parameters(params: dict[str, object]) -> None:
    problem = make_problem(make_data(Case(seed=53, n=50, d=4, k=3, batch=3)), 3)
    with pytest.raises(ParameterError):
        bait(problem, **params)  # type: ignore[arg-type]


def test_logdet_fisher_rejects_bad_lam() -> None:
    problem = make_problem(make_data(Case(seed=54, n=50, d=4, k=3, batch=3)), 3)
    with pytest.raises(ParameterError):
        logdet_fisher(problem, lam=0)


def test_select_api_runs_bait() -> None:
    case = Case(seed=55, n=100, d=5, k=3, batch=6, n_labeled=5)
    data = make_data(case)
    res = select("bait", embeddings=data.x, probs=data.probs, labeled=data.labeled, batch_size=6, dtype="float64")
    direct = bait(make_problem(data, 6))
    assert res.indices.tolist() == direct.indices.tolist()
    assert res.objective == pytest.approx(direct.objective, rel=1e-12)

"""BAIT at scale (selection/bait/approx.py, selection/bait/plan.py): top-c classes, pre-filtering, and the auto plan
of the cost model.

The approximate objective of a top-c run is checked against an explicit ``kd x kd`` computation that
shares no code with the engine; the ``c = k - 1`` and keep-everything pre-filter limits must give the
exact picks; every plan is recorded in the diagnostics; bad parameters raise ParameterError.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from selection import MemoryBudgetError, ParameterError, select
from selection.bait import approx as bait_approx
from selection.bait import design_weights, driver, engine, plan
from selection.bait.approx import auto_classes, topc_class_factor
from selection.bait.plan import estimate_seconds
from selection.linalg import helmert_basis, reduced_class_factor
from tests.selection.naive_bait import naive_bait

F64 = torch.float64


@pytest.fixture
def frozen_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """The committed rate table and a clock that stands still: tests of which plan is chosen under tiny
    time budgets must not depend on how fast (or loaded) the machine is today, nor see the guard cut the
    greedy passes because it is slower than the estimate."""
    monkeypatch.setenv("BAIT_RATES", "table")
    monkeypatch.setattr(engine, "_CLOCK", lambda: 0.0)


@pytest.fixture
def no_fixed_costs(monkeypatch: pytest.MonkeyPatch) -> None:
    """No fixed seconds in the estimates (per setup, per Python op) and no planning reserve: the tests
    that place a budget between two plans' estimates at toy sizes pin the knobs' order, which the
    fixed costs (the same for every plan) would otherwise swamp."""
    monkeypatch.setattr(plan, "SETUP_FIXED_S", 0.0)
    monkeypatch.setattr(plan, "SETUP_OP_S", 0.0)
    monkeypatch.setattr(driver, "PLAN_RESERVE_FRACTION", 0.0)


def _probs(rng: np.random.Generator, n: int, k: int, scale_: float) -> np.ndarray:
    logits = rng.normal(size=(n, k)) * scale_
    z = np.exp(logits - logits.max(1, keepdims=True))
    return z / z.sum(1, keepdims=True)


def _data(seed: int, n: int, d: int, k: int, scale_: float = 3.0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)) * (0.85 ** np.arange(d))
    return x, _probs(rng, n, k, scale_)


# --------------------------------------------------------------------------------------------------
# The top-c factor
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("c", [1, 2, 3, 5])
def test_topc_factor_is_a_psd_lower_bound_of_rank_c(c: int) -> None:
    rng = np.random.default_rng(1)
    k = 6
    p = torch.as_tensor(_probs(rng, 40, k, 2.5))
    p[0] = torch.tensor([1.0, 0, 0, 0, 0, 0], dtype=F64)  # no mass outside the top c
    p[1] = torch.full((k,), 1.0 / k, dtype=F64)  # flat: top-k ties
    basis = helmert_basis(k, dtype=F64, device=torch.device("cpu"))
    full = reduced_class_factor(p, basis)
    exact = full @ full.transpose(1, 2)
    e = topc_class_factor(p, c, dtype=F64)
    assert e.shape == (40, k - 1, c)
    assert bool(torch.isfinite(e).all())
    approx = e @ e.transpose(1, 2)
    assert float(torch.linalg.eigvalsh(approx).min()) >= -1e-12  # PSD
    assert float(torch.linalg.eigvalsh(exact - approx).min()) >= -1e-12  # below the exact class Fisher
    assert int(torch.linalg.matrix_rank(approx[5], atol=1e-12)) <= c
    # Trace lost: sum_rest p_j (1 - p_j) - p_rest (1 - p_rest) ||z||^2, z = rest probabilities / p_rest.
    top = torch.topk(p, c, dim=1).values
    rest = 1 - top.sum(1)
    sq_rest = (p * p).sum(1) - (top * top).sum(1)
    z2 = torch.where(rest > 1e-300, sq_rest / rest.clamp_min(1e-300) ** 2, torch.zeros_like(rest))
    lost = (p * (1 - p)).sum(1) - (top * (1 - top)).sum(1) - rest * (1 - rest) * z2
    got = exact.diagonal(dim1=1, dim2=2).sum(-1) - approx.diagonal(dim1=1, dim2=2).sum(-1)
    assert torch.allclose(got, lost, atol=1e-9)


def test_topc_factor_is_exact_with_k_minus_1_classes() -> None:
    p = torch.as_tensor(_probs(np.random.default_rng(2), 30, 5, 2.0))
    basis = helmert_basis(5, dtype=F64, device=torch.device("cpu"))
    full = reduced_class_factor(p, basis)
    e = topc_class_factor(p, 4, dtype=F64)
    assert torch.allclose(e @ e.transpose(1, 2), full @ full.transpose(1, 2), atol=1e-14)


def test_auto_classes_follows_the_probability_mass() -> None:
    rng = np.random.default_rng(3)
    peaked = torch.as_tensor(_probs(rng, 500, 50, 12.0))
    flat = torch.as_tensor(_probs(rng, 500, 50, 0.1))
    for lam in (1.0, 0.01):
        limit = bait_approx.rest_mass_limit(lam)
        c_peaked = auto_classes(peaked, lam=lam)
        assert c_peaked < 49
        assert bait_approx.rest_mass(peaked, c_peaked) <= limit
        assert c_peaked == 1 or bait_approx.rest_mass(peaked, c_peaked - 1) > limit
        assert auto_classes(flat, lam=lam) == 49
    assert auto_classes(peaked, lam=0.01) > auto_classes(peaked, lam=1.0)


# --------------------------------------------------------------------------------------------------
# BAIT with top-c classes
# --------------------------------------------------------------------------------------------------


def _explicit_objective(x: np.ndarray, p: np.ndarray, design: list[int], picked: list[int], c: int | None) -> float:
    """``tr(M~^{-1} F)`` with explicit ``(k-1)d`` matrices: exact F and design, top-c factors for picks."""
    xt, pt = torch.as_tensor(x), torch.as_tensor(p)
    n, d = xt.shape
    k = pt.shape[1]
    basis = helmert_basis(k, dtype=F64, device=torch.device("cpu"))
    e_full = reduced_class_factor(pt, basis)
    e_pick = e_full if c is None else topc_class_factor(pt, c, dtype=F64)

    def fisher(e: torch.Tensor, i: int) -> torch.Tensor:
        v = torch.kron(e[i].contiguous(), xt[i].reshape(-1, 1).clone())
        return v @ v.T

    fmat = sum(fisher(e_full, i) for i in range(n)) / n
    w_l, w_s = design_weights("reference", len(design), len(picked))
    mmat = 0.01 * torch.eye((k - 1) * d, dtype=F64)
    for i in design:
        mmat += w_l * fisher(e_full, i)
    for i in picked:
        mmat += w_s * fisher(e_pick, i)
    return float(torch.trace(torch.linalg.solve(mmat, fmat)))


def test_topc_with_all_classes_gives_the_exact_picks() -> None:
    x, p = _data(4, 150, 5, 5)
    labeled = [0, 7, 30]
    exact = select("bait", embeddings=x, probs=p, labeled=labeled, batch_size=6, approx="exact")
    full = select("bait", embeddings=x, probs=p, labeled=labeled, batch_size=6, approx="topc", approx_classes=4)
    assert full.indices.tolist() == exact.indices.tolist()
    assert full.objective == pytest.approx(exact.objective, rel=1e-10)
    assert full.diagnostics["approximation"]["kind"] == "topc"
    assert full.diagnostics["approximation"]["classes"] == 4


@pytest.mark.parametrize("c", [1, 2])
def test_topc_objective_matches_explicit_truncated_problem(c: int) -> None:
    x, p = _data(5, 120, 4, 5, scale_=3.0)
    labeled = [3, 50]
    out = select("bait", embeddings=x, probs=p, labeled=labeled, batch_size=5, approx="topc", approx_classes=c)
    diag = out.diagnostics
    assert diag["approx_classes"] == c and diag["objective_kind"] == "exact"
    assert diag["approximate_objective"] == pytest.approx(
        _explicit_objective(x, p, labeled, out.indices.tolist(), c), rel=1e-8
    )
    # The reported objective is the exact one of the returned set.
    assert out.objective == pytest.approx(_explicit_objective(x, p, labeled, out.indices.tolist(), None), rel=1e-8)
    assert diag["exact_objective"] == out.objective


def test_topc_auto_classes_close_to_exact_on_peaked_probabilities() -> None:
    x, p = _data(6, 400, 6, 12, scale_=6.0)
    labeled = list(range(0, 400, 25))
    exact = select("bait", embeddings=x, probs=p, labeled=labeled, batch_size=10, approx="exact")
    approx = select("bait", embeddings=x, probs=p, labeled=labeled, batch_size=10, approx="topc")
    c = approx.diagnostics["approximation"]["classes"]
    assert c < 11
    assert approx.diagnostics["approx_rest_mass"] <= bait_approx.rest_mass_limit(0.01)
    assert approx.objective is not None and exact.objective is not None
    gap = approx.objective / exact.objective - 1
    assert gap <= 0.02, gap


def test_pca_plus_topc_records_both() -> None:
    x, p = _data(7, 200, 8, 6, scale_=5.0)
    out = select("bait", embeddings=x, probs=p, batch_size=5, approx="pca+topc", approx_dim=4, approx_classes=2)
    info = out.diagnostics["approximation"]
    assert info["kind"] == "pca+topc" and info["pca_dim"] == 4 and info["classes"] == 2
    assert out.diagnostics["D"] == 5 * 4
    assert out.diagnostics["objective_kind"] == "exact"
    assert len(set(out.indices.tolist())) == 5


# --------------------------------------------------------------------------------------------------
# The auto plan
# --------------------------------------------------------------------------------------------------


def test_auto_plan_keeps_exact_when_it_fits() -> None:
    x, p = _data(8, 200, 5, 4)
    auto = select("bait", embeddings=x, probs=p, batch_size=6)
    exact = select("bait", embeddings=x, probs=p, batch_size=6, approx="exact")
    assert auto.indices.tolist() == exact.indices.tolist()
    info = auto.diagnostics["approximation"]
    assert info["kind"] == "exact" and info["requested"] == "auto" and info["reason"] == "fits the budgets"
    assert info["estimated_seconds"] > 0 and info["estimated_gb"] > 0
    assert exact.diagnostics["approximation"]["requested"] == "exact"


def test_auto_plan_over_every_budget_and_forced_exact() -> None:
    x, p = _data(9, 300, 16, 10, scale_=6.0)
    # Nothing fits the time budget: the fastest plan that fits memory runs, and the reason says so.
    out = select("bait", embeddings=x, probs=p, batch_size=5, time_budget_s=1e-9)
    info = out.diagnostics["approximation"]
    # The fastest plan: the smallest projection and the smallest class rank (3 top classes + 1 sampled
    # pseudo-label; before the sampled approximation existed it was pca+topc), forward only.
    assert "no plan fits the time budget" in info["reason"] and info["kind"] == "pca+sampled", info
    assert info["pca_dim"] == 8 and info["classes"] + info["samples"] == min(plan.SAMPLED_RANKS)
    assert info["oversample"] == 1.0
    # The guard stopped the greedy passes at once: the batch is the initial scores' top 5, and says so.
    assert out.diagnostics["deadline"]["forward_stopped_at"] == 0 and out.diagnostics["deadline"]["filled"] == 5
    assert len(set(out.indices.tolist())) == 5
    # Nothing fits memory: a MemoryBudgetError that names the options.
    with pytest.raises(MemoryBudgetError, match="no BAIT plan fits max_memory_gb"):
        select("bait", embeddings=x, probs=p, batch_size=5, max_memory_gb=1e-7)
    forced = select("bait", embeddings=x, probs=p, batch_size=5, approx="exact", time_budget_s=1e-9)
    assert forced.diagnostics["approximation"]["kind"] == "exact"
    assert forced.diagnostics["approximation"]["reason"] == "forced (approx='exact')"
    with pytest.raises(MemoryBudgetError, match="approx='pca'"):
        select("bait", embeddings=x, probs=p, batch_size=5, approx="exact", max_memory_gb=1e-4)


def test_auto_plan_picks_the_first_approximation_that_fits(frozen_clock: None, no_fixed_costs: None) -> None:
    x, p = _data(10, 300, 16, 10, scale_=6.0)
    # Forward only (oversample=1): dropping the oversampling is itself a knob of the plan since the
    # budget became a promise; without it, the order of the other knobs is what this test pins.
    kw: dict[str, Any] = {"embeddings": x, "probs": p, "batch_size": 5, "oversample": 1}
    secs = {}
    for c in (None, auto_classes(torch.as_tensor(p), lam=0.01)):
        secs[c] = estimate_seconds(
            n_rows=300,
            n_cand=300,
            d=16,
            r=9,
            rc=9 if c is None else c,
            n_forward=5,
            n_backward=0,
            n_design=0,
            mode="fisher",
            device=torch.device("cpu"),
            dtype=F64,
        )
    c_auto = auto_classes(torch.as_tensor(p), lam=0.01)
    assert c_auto < 9 and secs[c_auto] < secs[None]
    budget = 0.5 * (secs[c_auto] + secs[None])  # exact does not fit, top-c at full dimension does
    out = select("bait", **kw, time_budget_s=budget)
    info = out.diagnostics["approximation"]
    assert info["kind"] == "topc" and info["classes"] == c_auto, info
    assert info["estimated_seconds"] <= budget
    assert "exact needs" in info["reason"]
    assert out.diagnostics["objective_kind"] == "exact"
    # Under a memory budget that exact misses, the plan projects (PCA) and says so.
    mem = plan.estimate_bytes(n_cand=300, d=16, r=9, matrix_dtype=F64, state_dtype=F64, mode="fisher", rc=c_auto)
    out = select("bait", **kw, max_memory_gb=0.6 * mem / 1e9)
    info = out.diagnostics["approximation"]
    assert info["kind"] == "pca+topc" and info["pca_dim"] == 8 and info["classes"] == c_auto, info


# --------------------------------------------------------------------------------------------------
# Pre-filtering
# --------------------------------------------------------------------------------------------------


def test_prefilter_keeping_everything_is_exact() -> None:
    x, p = _data(11, 150, 4, 4)
    labeled = [1, 2, 90]
    exact = select("bait", embeddings=x, probs=p, labeled=labeled, batch_size=5, approx="exact")
    pre = select("bait", embeddings=x, probs=p, labeled=labeled, batch_size=5, prefilter={"top": 1000})
    assert pre.indices.tolist() == exact.indices.tolist()
    assert pre.objective == pytest.approx(exact.objective, rel=1e-10)
    assert pre.diagnostics["approximation"]["prefilter"]["kept_top"] == 147


@pytest.mark.parametrize("score", ["gradnorm", "margin"])
def test_prefilter_records_its_strata_and_is_seeded(score: str) -> None:
    x, p = _data(12, 400, 4, 5)
    labeled = [0, 10, 20]
    spec = {"top": 30, "random": 20, "score": score}
    a = select("bait", embeddings=x, probs=p, labeled=labeled, batch_size=8, prefilter=spec, seed=3)
    b = select("bait", embeddings=x, probs=p, labeled=labeled, batch_size=8, prefilter=spec, seed=3)
    assert a.indices.tolist() == b.indices.tolist()
    info = a.diagnostics["approximation"]["prefilter"]
    assert info == {
        "top": 30, "random": 20, "score": score, "seed": None, "kept_top": 30, "kept_random": 20,
        "random_drawn_by": "position",
    }  # fmt: skip
    assert a.diagnostics["objective_kind"] == "exact"
    assert "prefiltered_objective" in a.diagnostics
    # Every pick is a top-scored or a random-stratum candidate, never a labeled row.
    scores = bait_approx.prefilter_scores(torch.as_tensor(x), torch.as_tensor(p), score, 64)
    cand = np.setdiff1d(np.arange(400), labeled)
    top = set(cand[np.argsort(-scores.numpy()[cand], kind="stable")[:30]].tolist())
    picked = set(a.indices.tolist())
    assert not picked & set(labeled)
    # The random stratum depends on the seed (and only a few picks can be random ones).
    gen_rows = [
        set(
            bait_approx.prefilter_candidates(
                torch.as_tensor(x),
                torch.as_tensor(p),
                torch.as_tensor(cand),
                bait_approx.Prefilter(30, 20, score),
                seed=s,
                chunk_size=64,
            )[1].tolist()
        )
        for s in (3, 4)
    ]
    assert gen_rows[0] != gen_rows[1]
    assert picked <= top | gen_rows[0]


def test_prefilter_gap_against_exact_is_small() -> None:
    x, p = _data(13, 1200, 5, 4, scale_=2.0)
    labeled = list(range(0, 1200, 60))
    exact = select("bait", embeddings=x, probs=p, labeled=labeled, batch_size=10, approx="exact")
    pre = select("bait", embeddings=x, probs=p, labeled=labeled, batch_size=10, prefilter={"top": 300, "random": 100})
    assert pre.objective is not None and exact.objective is not None
    gap = pre.objective / exact.objective - 1
    assert -0.05 <= gap <= 0.02, gap  # greedy exact BAIT is not optimal: the pre-filtered run may beat it


def test_auto_prefilter_above_the_named_pool_size(
    monkeypatch: pytest.MonkeyPatch, frozen_clock: None, no_fixed_costs: None
) -> None:
    monkeypatch.setattr(plan, "PREFILTER_MIN_CANDIDATES", 500)
    monkeypatch.setattr(plan, "PREFILTER_MIN_KEEP", 200)
    x, p = _data(14, 1000, 6, 4)
    kw: dict[str, Any] = {"embeddings": x, "probs": p, "batch_size": 5}
    exact = select("bait", **kw, approx="exact")
    half = select("bait", **kw, approx="exact", prefilter={"top": 375, "random": 125})
    # A budget between exact on all candidates and exact on half of them (the estimates include a fixed
    # cost per greedy step, so halving the pool does not halve them).
    est = 0.5 * sum(r.diagnostics["approximation"]["estimated_seconds"] for r in (exact, half))
    out = select("bait", **kw, time_budget_s=est)
    info = out.diagnostics["approximation"]
    assert info["kind"] == "exact" and "prefilter" in info, info
    assert info["prefilter"]["top"] + info["prefilter"]["random"] == 500
    assert "pre-filtered to 500" in info["reason"]
    # prefilter="none" forbids it: the plan approximates instead (or fails), never pre-filters.
    try:
        out = select("bait", **kw, time_budget_s=est, prefilter="none")
        assert "prefilter" not in out.diagnostics["approximation"]
    except MemoryBudgetError:
        pass


# --------------------------------------------------------------------------------------------------
# Parameters
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"approx": "bogus"}, "unknown approx"),
        ({"approx": "topc", "approx_classes": 0}, r"approx_classes must be an integer in \[1, k-1=3\]"),
        ({"approx": "topc", "approx_classes": 4}, r"approx_classes must be an integer in \[1, k-1=3\]"),
        ({"approx": "topc", "approx_classes": 2.0}, "approx_classes must be an integer"),
        ({"approx": "pca", "approx_classes": 2}, "approx_classes is only used with"),
        ({"approx": "exact", "approx_dim": 2}, "approx_dim is only used with"),
        ({"time_budget_s": 0}, "time_budget_s must be a finite number > 0"),
        ({"time_budget_s": float("inf")}, "time_budget_s must be a finite number > 0"),
        ({"prefilter": {"top": -1}}, r"prefilter\['top'\] must be an integer >= 0"),
        ({"prefilter": {"top": 0, "random": 0}}, "prefilter keeps no candidate"),
        ({"prefilter": {"top": 5, "size": 3}}, r"unknown prefilter keys \['size'\]"),
        ({"prefilter": {"top": 5, "score": "entropy"}}, r"prefilter\['score'\] must be one of"),
        ({"prefilter": {"top": 2}}, "prefilter keeps 2 candidates, fewer than batch_size=4"),
        ({"prefilter": "sometimes"}, "prefilter must be None"),
    ],
)
def test_bad_scale_parameters_raise_parameter_error(params: dict[str, Any], message: str) -> None:
    x, p = _data(15, 60, 3, 4)
    with pytest.raises(ParameterError, match=message):
        select("bait", embeddings=x, probs=p, batch_size=4, **params)


def test_class_options_need_classification() -> None:
    x = np.random.default_rng(16).normal(size=(50, 3))
    for params, message in (
        ({"approx": "topc"}, "needs class probabilities"),
        ({"approx_classes": 1}, "needs class probabilities"),
        ({"prefilter": {"top": 10, "score": "margin"}}, "'margin' needs class probabilities"),
    ):
        with pytest.raises(ParameterError, match=message):
            select("bait", embeddings=x, task="regression", batch_size=3, **params)
    out = select("bait", embeddings=x, task="regression", batch_size=3, prefilter={"top": 20, "random": 10})
    assert out.diagnostics["approximation"]["prefilter"]["kept_top"] == 20


# --------------------------------------------------------------------------------------------------
# The exact step (the compiled kernel, small chunks) against the naive implementation, float64
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("k", "lam"), [(4, 0.01), (7, 1.0)])
def test_exact_step_gives_the_naive_picks(k: int, lam: float) -> None:
    x, p = _data(20 + k, 300, 6, k, scale_=2.0)
    labeled = [0, 4, 8, 100]
    kw: dict[str, Any] = {"embeddings": x, "probs": p, "labeled": labeled, "batch_size": 12, "lam": lam}
    out = select("bait", **kw, approx="exact", chunk_size=64, dtype="float64")
    ref = naive_bait(x, p, labeled, [], 12, lam=lam)
    assert out.indices.tolist() == ref.indices
    assert out.diagnostics["forward_indices"] == ref.forward
    assert out.objective == pytest.approx(ref.objective, rel=1e-8)


def test_auto_plan_prefers_no_projection_within_the_slack(
    frozen_clock: None, no_fixed_costs: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plan without PCA whose estimate is over the time budget but within PCA_TIME_SLACK x runs instead.

    Forward only (oversample=1), as in test_auto_plan_picks_the_first_approximation_that_fits, and top-c
    by the mass rule as the only class approximation (no sampled ranks, which would fit the budget)."""
    monkeypatch.setattr(plan, "SAMPLED_RANKS", ())
    x, p = _data(10, 300, 16, 10, scale_=6.0)
    c_auto = auto_classes(torch.as_tensor(p), lam=0.01)
    secs = {
        c: estimate_seconds(
            n_rows=300,
            n_cand=300,
            d=16,
            r=9,
            rc=9 if c is None else c,
            n_forward=5,
            n_backward=0,
            n_design=0,
            mode="fisher",
            device=torch.device("cpu"),
            dtype=F64,
        )
        for c in (None, c_auto)
    }
    budget = secs[c_auto] / (0.5 * (1 + plan.PCA_TIME_SLACK))  # top-c over it, within the slack
    assert secs[None] > plan.PCA_TIME_SLACK * budget  # exact is not
    out = select("bait", embeddings=x, probs=p, batch_size=5, oversample=1, time_budget_s=budget)
    info = out.diagnostics["approximation"]
    assert info["kind"] == "topc" and "pca_dim" not in info, info
    assert info["estimated_seconds"] > budget and "no PCA projection" in info["reason"]
    # Below the slack the projection is taken, as before.
    out = select(
        "bait",
        embeddings=x,
        probs=p,
        batch_size=5,
        oversample=1,
        time_budget_s=secs[c_auto] / (2 * plan.PCA_TIME_SLACK),
    )
    assert "pca_dim" in out.diagnostics["approximation"]

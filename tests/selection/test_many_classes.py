"""Many classes: the top-c + sampled-rest class factor, the calibrated rates, and the auto plan's guard.

The guard is tested with a fake clock (``selection.bait.engine._CLOCK``) that advances a fixed amount per
reading, so "time" is a count of the engine's clock readings and no test depends on the machine's speed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from selection import ParameterError, calibrate, select
from selection.bait import engine
from selection.bait.approx import class_fisher_kept, sampled_class_factor, topc_class_factor
from selection.linalg import helmert_basis, reduced_class_factor

F64 = torch.float64


def _probs(rng: np.random.Generator, n: int, k: int, scale_: float) -> np.ndarray:
    logits = rng.normal(size=(n, k)) * scale_
    z = np.exp(logits - logits.max(1, keepdims=True))
    return z / z.sum(1, keepdims=True)


def _data(seed: int, n: int, d: int, k: int, scale_: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)) * (0.85 ** np.arange(d))
    return x, _probs(rng, n, k, scale_)


# --------------------------------------------------------------------------------------------------
# The sampled factor
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("top", [0, 2, 5])
def test_sampled_factor_is_unbiased(top: int) -> None:
    """The mean of E^ E^^T over seeds converges to the exact reduced class Fisher O^T C O."""
    k = 8
    p = torch.as_tensor(_probs(np.random.default_rng(1), 3, k, 1.0))
    basis = helmert_basis(k, dtype=F64, device=torch.device("cpu"))
    full = reduced_class_factor(p, basis)
    exact = full @ full.transpose(1, 2)
    n_seeds = 3000
    draws = []
    for seed in range(n_seeds):
        e = sampled_class_factor(p, top, 2, dtype=F64, seed=seed)
        assert e.shape == (3, k - 1, top + 2)
        draws.append(e @ e.transpose(1, 2))
    stack = torch.stack(draws)
    mean = stack.mean(0)
    se = stack.std(0) / n_seeds**0.5
    # Every entry within 5 standard errors of the exact one (exact entries have se = 0).
    assert bool(((mean - exact).abs() <= 5 * se + 1e-12).all()), float(((mean - exact).abs() / (se + 1e-12)).max())


def test_sampled_factor_is_exact_when_the_rest_has_one_class_and_seeded() -> None:
    k = 6
    p = torch.as_tensor(_probs(np.random.default_rng(2), 20, k, 2.0))
    basis = helmert_basis(k, dtype=F64, device=torch.device("cpu"))
    # Mass on three classes only: with top = 2 the rest holds one class of positive mass (no
    # within-rest covariance), so the sampled columns carry nothing and the factor is exact.
    q = p.clone()
    q[:, 3:] = 0
    q /= q.sum(1, keepdim=True)
    full = reduced_class_factor(q, basis)
    e = sampled_class_factor(q, 2, 2, dtype=F64, seed=0)
    assert torch.allclose(e @ e.transpose(1, 2), full @ full.transpose(1, 2), atol=1e-12)
    # The top-c part is the top-c factor; draws depend on the seed only.
    e1 = sampled_class_factor(p, 2, 3, dtype=F64, seed=5)
    e2 = sampled_class_factor(p, 2, 3, dtype=F64, seed=5)
    e3 = sampled_class_factor(p, 2, 3, dtype=F64, seed=6)
    assert torch.equal(e1, e2) and not torch.equal(e1, e3)
    assert torch.allclose(e1[:, :, :2], topc_class_factor(p, 2, dtype=F64))
    with pytest.raises(ParameterError, match="top \\+ sampled"):
        sampled_class_factor(p, 4, 2, dtype=F64, seed=0)


def test_class_fisher_kept_matches_the_topc_trace() -> None:
    p = torch.as_tensor(_probs(np.random.default_rng(3), 50, 10, 1.5))
    basis = helmert_basis(10, dtype=F64, device=torch.device("cpu"))
    full = reduced_class_factor(p, basis)
    total = (full * full).sum((1, 2))
    for c in (1, 3, 6):
        e = topc_class_factor(p, c, dtype=F64)
        frac = float(((e * e).sum((1, 2)) / total).mean())
        assert class_fisher_kept(p, c) == pytest.approx(frac, rel=1e-9)
    assert class_fisher_kept(p, 0) == 0.0 and class_fisher_kept(p, 9) == 1.0


def test_forced_sampled_runs_and_records_its_columns() -> None:
    x, p = _data(4, 300, 6, 12, scale_=1.0)
    kw: dict[str, Any] = {"embeddings": x, "probs": p, "labeled": [0, 5, 9], "batch_size": 6, "dtype": "float64"}
    out = select("bait", **kw, approx="sampled", approx_classes=3, approx_samples=4, seed=1)
    info = out.diagnostics["approximation"]
    assert info["kind"] == "sampled" and info["classes"] == 3 and info["samples"] == 4
    assert out.diagnostics["approx_samples"] == 4
    assert out.diagnostics["objective_kind"] == "exact"
    assert len(set(out.indices.tolist())) == 6
    again = select("bait", **kw, approx="sampled", approx_classes=3, approx_samples=4, seed=1)
    assert again.indices.tolist() == out.indices.tolist()
    # Nearly all classes kept exactly (top 9 + 2 sampled of 11): close to exact BAIT.
    exact = select("bait", **kw, approx="exact")
    near = select("bait", **kw, approx="sampled", approx_classes=9, approx_samples=2)
    assert near.objective is not None and exact.objective is not None
    assert near.objective <= 1.03 * exact.objective
    pca = select("bait", **kw, approx="pca+sampled", approx_dim=3, approx_classes=0, approx_samples=5)
    assert pca.diagnostics["approximation"]["kind"] == "pca+sampled" and pca.diagnostics["D"] == 11 * 3


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"approx": "topc", "approx_samples": 2}, "approx_samples is only used with"),
        ({"approx": "sampled", "approx_samples": 0}, r"approx_samples must be an integer in \[1, k-1=5\]"),
        ({"approx": "sampled", "approx_classes": 4, "approx_samples": 3}, "approx_classes \\+ approx_samples"),
        ({"approx": "sampled", "approx_classes": -1}, r"approx_classes must be an integer in \[0, k-1=5\]"),
    ],
)
def test_bad_sampled_parameters_raise(params: dict[str, Any], message: str) -> None:
    x, p = _data(5, 60, 3, 6)
    with pytest.raises(ParameterError, match=message):
        select("bait", embeddings=x, probs=p, batch_size=4, **params)


# --------------------------------------------------------------------------------------------------
# Rates
# --------------------------------------------------------------------------------------------------


def test_rates_are_measured_once_per_process_and_table_on_request(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Any, ...]] = []
    real = calibrate.measure

    def counting(device: torch.device, dtype: torch.dtype, threads: int, **kw: Any) -> calibrate.Rates:
        calls.append((device.type, dtype, threads))
        return real(device, dtype, threads, **kw)

    monkeypatch.setattr(calibrate, "measure", counting)
    monkeypatch.delenv("BAIT_RATES", raising=False)
    calibrate.clear_cache()
    cpu = torch.device("cpu")
    a = calibrate.machine_rates(cpu, torch.float32, 1)
    b = calibrate.machine_rates(cpu, torch.float32, 1)
    assert a is b and len(calls) == 1 and a.source.startswith("measured")
    for value in (a.gemm, a.small_lo, a.small_hi, a.matrix, a.stream, a.dense_rate):
        assert value > 0 and np.isfinite(value)
    assert min(a.small_lo, a.small_hi) <= a.small(12) <= max(a.small_lo, a.small_hi)
    monkeypatch.setenv("BAIT_RATES", "table")
    assert calibrate.machine_rates(cpu, torch.float32, 1) is calibrate.TABLE[("cpu", torch.float32)]
    assert len(calls) == 1


def test_a_failing_microbenchmark_falls_back_to_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: Any) -> calibrate.Rates:
        raise RuntimeError("no")

    monkeypatch.setattr(calibrate, "measure", broken)
    monkeypatch.delenv("BAIT_RATES", raising=False)
    calibrate.clear_cache()
    try:
        assert calibrate.machine_rates(torch.device("cpu"), torch.float64, 3) is calibrate.TABLE[("cpu", F64)]
    finally:
        calibrate.clear_cache()


# --------------------------------------------------------------------------------------------------
# The auto plan: what it picks for many classes, and the guard
# --------------------------------------------------------------------------------------------------


class _FakeClock:
    """Advances ``tick`` seconds per reading."""

    def __init__(self, tick: float) -> None:
        self.now = 0.0
        self.tick = tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


@pytest.fixture
def table_rates(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BAIT_RATES", "table")


def test_flat_many_class_head_gets_a_class_approximation_that_says_what_it_gave_up(
    table_rates: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(engine, "_CLOCK", lambda: 0.0)
    x, p = _data(6, 400, 8, 40, scale_=1.0)  # flat head: the mass rule keeps (almost) every class
    kw: dict[str, Any] = {"embeddings": x, "probs": p, "labeled": list(range(0, 400, 40)), "batch_size": 5}
    exact = select("bait", **kw, approx="exact")
    est = exact.diagnostics["approximation"]["estimated_seconds"]
    out = select("bait", **kw, time_budget_s=0.3 * est)
    info = out.diagnostics["approximation"]
    assert info["estimated_seconds"] <= 0.3 * est
    assert info["estimated_gap"] > 0 and info["gave_up"], info
    assert any(s.startswith("classes:") for s in info["gave_up"]) or "pca_dim" in info, info
    assert out.diagnostics["objective_kind"] == "exact"
    assert out.objective is not None and exact.objective is not None
    assert out.objective >= exact.objective * 0.95  # greedy is not optimal, but not far below


@pytest.mark.parametrize("tick", [1.0, 3.0])
def test_guard_returns_a_valid_batch_when_time_runs_out(
    table_rates: None, monkeypatch: pytest.MonkeyPatch, tick: float
) -> None:
    """Every clock reading costs ``tick`` s against a 10 s budget: the passes stop early, the batch
    is completed and still has B distinct candidates, and the diagnostics say what happened."""
    clock = _FakeClock(tick)
    monkeypatch.setattr(engine, "_CLOCK", clock)
    x, p = _data(7, 300, 5, 6, scale_=2.0)
    labeled = [1, 2, 3]
    out = select("bait", embeddings=x, probs=p, labeled=labeled, batch_size=8, time_budget_s=10.0)
    deadline = out.diagnostics["deadline"]
    assert deadline["forward_stopped_at"] < 16 and deadline["forward_planned"] == 16
    picks = out.indices.tolist()
    assert len(picks) == 8 and len(set(picks)) == 8 and not set(picks) & set(labeled)
    if deadline["forward_stopped_at"] < 8:
        assert deadline["filled"] == 8 - deadline["forward_stopped_at"]
    cut = any(key in deadline for key in ("filled", "removed_at_once", "backward_skipped"))
    if cut:
        # The engine's value is not the returned set's: no objective, unless an exact one was computed.
        assert out.objective is None or out.diagnostics["objective_kind"] == "exact"
    else:
        # Stopped at B picks or more and kept them: the engine's value is the returned set's.
        assert out.objective is not None and out.diagnostics["steps"]["forward"] == 8


def test_guard_prunes_at_once_when_the_backward_pass_runs_late(
    table_rates: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The forward pass fits, the backward pass does not: the rest of the removals happen at once."""
    x, p = _data(8, 300, 5, 6, scale_=2.0)
    kw: dict[str, Any] = {"embeddings": x, "probs": p, "labeled": [0, 1], "batch_size": 6}
    ref = select("bait", **kw, approx="exact")
    state = {"now": 0.0, "phase": "forward"}
    real_backward = engine._Bait.backward

    def clock() -> float:
        state["now"] += 20.0 if state["phase"] == "backward" else 1e-6
        return state["now"]

    def backward(self: Any, *args: Any, **kwargs: Any) -> Any:
        state["phase"] = "backward"
        return real_backward(self, *args, **kwargs)

    monkeypatch.setattr(engine, "_CLOCK", clock)
    monkeypatch.setattr(engine._Bait, "backward", backward)
    out = select("bait", **kw, time_budget_s=30.0)
    deadline = out.diagnostics["deadline"]
    assert "forward_stopped_at" not in deadline and deadline["removed_at_once"] >= 1
    assert out.diagnostics["forward_indices"] == ref.diagnostics["forward_indices"]
    kept = out.indices.tolist()
    assert len(kept) == 6 and set(kept) <= set(ref.diagnostics["forward_indices"])
    assert out.objective is None  # the engine's value is not the returned set's, and no time was left


def test_forced_plans_have_no_guard(table_rates: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine, "_CLOCK", _FakeClock(100.0))
    x, p = _data(9, 200, 4, 5, scale_=2.0)
    out = select("bait", embeddings=x, probs=p, batch_size=5, approx="exact", time_budget_s=1.0)
    assert "deadline" not in out.diagnostics and out.diagnostics["steps"]["forward"] == 10

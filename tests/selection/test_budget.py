"""The time budget of the auto plan: bounded rate measurement, its time counted, the setup in the
estimate, per-phase corrections, and one real small-size call under a budget of a few seconds."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch

from selection import calibrate, select
from selection.bait import driver, engine
from selection.bait.plan import estimate_phases

CPU = torch.device("cpu")
F64 = torch.float64


def _flat(seed: int, n: int, d: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Random embeddings and the softmax of N(0, 2^2) logits (mean top-1 ~0.25 at k = 100)."""
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((n, k)) * 2.0
    p = np.exp(logits - logits.max(1, keepdims=True))
    return rng.standard_normal((n, d)), p / p.sum(1, keepdims=True)


@pytest.fixture
def fresh_rates(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.delenv("BAIT_RATES", raising=False)
    calibrate.clear_cache()
    yield
    calibrate.clear_cache()


class _FakeStages:
    """Stages that report twice the table's rates and cost ``tick`` seconds of the fake clock each."""

    def __init__(self, clock: list[float], tick: float) -> None:
        self.clock, self.tick = clock, tick
        self.ran: list[str] = []

    def __enter__(self) -> Any:
        table = calibrate.TABLE[("cpu", F64)]

        def run(name: str) -> float:
            self.ran.append(name)
            self.clock[0] += self.tick
            return 2.0 * calibrate._table_value(table, name)

        return run

    def __exit__(self, *exc: object) -> None:
        return None


def test_measurement_stops_at_its_cap_and_scales_the_table(fresh_rates: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    stages = _FakeStages(clock, tick=0.15)
    monkeypatch.setattr(calibrate, "_CLOCK", lambda: clock[0])
    monkeypatch.setattr(calibrate, "_stages_cpu", lambda *a: stages)
    rates = calibrate.measure(CPU, F64, 2, cap_s=0.2)
    # 0.15 s after the first stage is under the cap, 0.30 s after the second is not.
    assert stages.ran == ["gemm", "dense"]
    assert not rates.complete and f"partial (2 of {len(calibrate._RATE_NAMES)} stages" in rates.source
    table = calibrate.TABLE[("cpu", F64)]
    for name in calibrate._RATE_NAMES:  # the measured ones were 2x the table: so are the scaled ones
        assert calibrate._table_value(rates, name) == pytest.approx(2.0 * calibrate._table_value(table, name))
    whole = calibrate.measure(CPU, F64, 2, cap_s=10.0)
    assert whole.complete and len(stages.ran) == 2 + len(calibrate._RATE_NAMES)


def test_a_small_budget_measures_less_and_a_later_call_completes_it_once(
    fresh_rates: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    caps: list[float] = []

    def fake_measure(device: torch.device, dtype: torch.dtype, threads: int, *, cap_s: float) -> calibrate.Rates:
        caps.append(cap_s)
        return replace(calibrate.TABLE[("cpu", F64)], source="measured (fake)", complete=cap_s >= 1.0)

    monkeypatch.setattr(calibrate, "measure", fake_measure)
    calibrate.machine_rates(CPU, F64, 2, budget_s=0.5)
    assert caps == [pytest.approx(0.05)]  # a tenth of the budget, under CAP_S
    calibrate.machine_rates(CPU, F64, 2)  # the cost model's own reads never measure again
    calibrate.machine_rates(CPU, F64, 2, budget_s=0.5)
    assert len(caps) == 1
    calibrate.machine_rates(CPU, F64, 2, budget_s=60.0)  # a budget that allows CAP_S: redone, once
    calibrate.machine_rates(CPU, F64, 2, budget_s=60.0)
    assert caps[1:] == [calibrate.CAP_S]


def test_observed_times_correct_the_phases(fresh_rates: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(calibrate, "measure", lambda *a, **k: calibrate.TABLE[("cpu", F64)])
    monkeypatch.setattr(calibrate, "OBSERVE_MIN_S", 1e-3)  # the factor's arithmetic on a small problem
    kw: dict[str, Any] = dict(
        n_rows=2000, n_cand=1800, d=16, r=99, rc=16, n_forward=10, n_backward=0, n_design=200,
        mode="fisher", device=CPU, dtype=F64, threads=2,
    )  # fmt: skip
    before = estimate_phases(**kw)
    kind = calibrate.step_kind(99, 16)
    calibrate.observe(CPU, F64, 2, phase="setup", estimated=before["setup"], measured=4 * before["setup"], kind=kind)
    after = estimate_phases(**kw)
    assert after["setup"] == pytest.approx(2 * before["setup"])  # half-way in log: sqrt(4)
    assert after["forward"] == pytest.approx(before["forward"])
    calibrate.observe(CPU, F64, 2, phase="greedy", estimated=before["forward"], measured=5e-4, kind=kind)  # too short
    assert estimate_phases(**kw)["forward"] == pytest.approx(before["forward"])
    monkeypatch.setenv("BAIT_RATES", "table")  # the table is never corrected
    calibrate.observe(CPU, F64, 2, phase="setup", estimated=1.0, measured=10.0, kind=kind)
    assert estimate_phases(**kw)["setup"] == pytest.approx(before["setup"])


def test_correction_factors_are_kept_per_step_kind(fresh_rates: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run of one kind of plan (here rank one, under-estimated 4x) corrects that kind only: the next
    all-classes and class-approximation plans keep their estimates."""
    monkeypatch.setattr(calibrate, "measure", lambda *a, **k: calibrate.TABLE[("cpu", F64)])
    monkeypatch.setattr(calibrate, "_rank1_measure", lambda *a, **k: calibrate.RANK1_TABLE_CPU)
    common: dict[str, Any] = dict(
        n_rows=2000, n_design=200, n_forward=10, n_backward=0, mode="fisher", device=CPU, dtype=F64, threads=2
    )  # fmt: skip
    rank1 = dict(common, n_cand=10**6, d=64, r=1, rc=1)
    full = dict(common, n_cand=1800, d=16, r=9, rc=9)
    classes = dict(common, n_cand=1800, d=16, r=99, rc=16)
    assert calibrate.step_kind(1, 1) == "rank1"
    assert calibrate.step_kind(9, 9) == "full"
    assert calibrate.step_kind(99, 16) == "classes"
    before = {name: estimate_phases(**kw) for name, kw in (("rank1", rank1), ("full", full), ("classes", classes))}
    est = before["rank1"]["forward"]
    assert est > calibrate.OBSERVE_MIN_S
    calibrate.observe(CPU, F64, 2, phase="greedy", estimated=est, measured=4 * est, kind="rank1")
    assert calibrate.factors(CPU, F64, 2) == {"greedy": {"rank1": pytest.approx(2.0, rel=1e-2)}}
    assert estimate_phases(**rank1)["forward"] == pytest.approx(2 * est)
    assert estimate_phases(**full) == pytest.approx(before["full"])
    assert estimate_phases(**classes) == pytest.approx(before["classes"])
    with pytest.raises(ValueError, match="step kind"):
        calibrate.observe(CPU, F64, 2, phase="greedy", estimated=1.0, measured=2.0, kind="numpy")


def test_rank_one_steps_are_costed_at_the_measured_rank_one_rate(fresh_rates: Any) -> None:
    """The rank-one step reads X from memory: its estimate follows the rank1 rate (bytes of X per second),
    not the cache-resident stream rate, and halving the rate doubles the pool-sized part of a step."""
    table = calibrate.TABLE[("cpu", torch.float32)]
    kw: dict[str, Any] = dict(
        n_rows=10**6, n_cand=10**6, d=64, r=1, rc=1, n_forward=100, n_backward=0, n_design=20,
        mode="fisher", device=CPU, dtype=torch.float32, threads=2,
    )  # fmt: skip
    fast = estimate_phases(**kw, rates=table)["forward"]
    slow = estimate_phases(**kw, rates=replace(table, rank1=table.rank1 / 2))["forward"]
    streamed = estimate_phases(**kw, rates=replace(table, stream=table.stream * 10))["forward"]
    pool_part = 100 * 10**6 * 64 * 4 / table.rank1
    assert fast == pytest.approx(pool_part, rel=0.05)
    assert slow == pytest.approx(fast + pool_part, rel=0.05)
    assert streamed == pytest.approx(fast, rel=0.05)


def test_a_rank_one_plan_is_costed_at_the_rate_measured_at_its_dimension(fresh_rates: Any) -> None:
    """The rank-one rate is measured per dimension (the GEMV's speed changes with d in no simple way), once per
    process: a second plan at the same d measures nothing; short phases dominated by fixed costs (a 10^4-row
    pool's 0.08 s greedy) do not move the correction factors."""
    calls: list[int] = []

    def fake(device: torch.device, dtype: torch.dtype, threads: int, d: int) -> float:
        calls.append(d)
        return 1e10 if d == 64 else 5e9

    kw: dict[str, Any] = dict(
        n_rows=10**6, n_cand=10**6, n_forward=100, n_backward=0, n_design=20, r=1, rc=1, mode="fisher",
        device=CPU, dtype=torch.float32, threads=2,
    )  # fmt: skip
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(calibrate, "measure", lambda *a, **k: calibrate.TABLE[("cpu", torch.float32)])
        mp.setattr(calibrate, "_rank1_measure", fake)
        at64 = estimate_phases(d=64, **kw)["forward"]
        at128 = estimate_phases(d=128, **kw)["forward"]
        estimate_phases(d=64, **kw)
        assert calls == [64, 128]
        assert at64 == pytest.approx(100 * 10**6 * 64 * 4 / 1e10, rel=0.05)
        assert at128 == pytest.approx(100 * 10**6 * 128 * 4 / 5e9, rel=0.05)
        calibrate.observe(CPU, torch.float32, 2, phase="greedy", estimated=0.02, measured=0.08, kind="rank1")
        assert calibrate.factors(CPU, torch.float32, 2) == {}
        assert calibrate.OBSERVE_MIN_S >= 0.5


def test_a_rank_one_step_gives_every_worker_thread_a_chunk() -> None:
    from selection.linalg import RANK_ONE_MIN_CHUNK, rank_one_chunk

    assert rank_one_chunk(100_000, 2, 2**18) == 50_000  # one chunk of 10^5 rows left a core idle
    assert rank_one_chunk(10**7, 2, 2**18) == 2**18  # big pools: chunks at the cap
    assert rank_one_chunk(1000, 2, 2**18) == RANK_ONE_MIN_CHUNK  # small pools: one chunk
    assert rank_one_chunk(100_000, 1, 2**18) == 100_000


def test_the_setup_estimate_counts_what_grows_with_d_k_and_the_design() -> None:
    base: dict[str, Any] = dict(
        n_rows=1500, n_cand=1300, d=8, r=99, rc=4, n_forward=10, n_backward=0, n_design=200,
        mode="fisher", device=CPU, dtype=F64, threads=2, rates=calibrate.TABLE[("cpu", F64)],
    )  # fmt: skip
    small = estimate_phases(**base)["setup"]
    # The D^3 factorisations (D = 99 d) at the dense rate: 8x the d gives > 8^3 / 10 x the setup.
    big = estimate_phases(**{**base, "d": 64})["setup"]
    assert big > 50 * small
    # At small d the block forms are bound by memory: halving the stream rate costs setup time.
    slow_mem = replace(calibrate.TABLE[("cpu", F64)], stream=calibrate.TABLE[("cpu", F64)].stream / 2)
    assert estimate_phases(**{**base, "rates": slow_mem})["setup"] > 1.3 * small
    # A slower dense rate shows in the setup, not in the greedy steps.
    slow_dense = replace(calibrate.TABLE[("cpu", F64)], dense=1e8)
    a, b = estimate_phases(**{**base, "d": 32}), estimate_phases(**{**base, "d": 32, "rates": slow_dense})
    assert b["setup"] > 2 * a["setup"] and b["forward"] == pytest.approx(a["forward"])


@pytest.mark.parametrize("budget", [0.5, 2.0, 8.0])
def test_plan_fits_setup_and_greedy_in_what_is_left_after_the_rates(
    monkeypatch: pytest.MonkeyPatch, budget: float
) -> None:
    """A fake clock: the rates take 30 % of the budget. The plan gets the rest (less a reserve), its
    estimate (setup included) fits it whenever some plan does, and it runs real greedy steps."""
    monkeypatch.setenv("BAIT_RATES", "table")
    clock = [0.0]
    monkeypatch.setattr(engine, "_CLOCK", lambda: clock[0])
    real_rates = driver.machine_rates

    def slow_rates(*a: Any, **k: Any) -> calibrate.Rates:
        clock[0] += 0.3 * budget
        return real_rates(*a, **k)

    monkeypatch.setattr(driver, "machine_rates", slow_rates)
    x, p = _flat(0, 1500, 32, 100)
    out = select("bait", embeddings=x, probs=p, labeled=np.arange(200), batch_size=10, time_budget_s=budget)
    info = out.diagnostics["approximation"]
    left = budget - 0.3 * budget - min(driver.PLAN_RESERVE_S, driver.PLAN_RESERVE_FRACTION * budget)
    assert info["calibration_seconds"] == pytest.approx(0.3 * budget)
    assert info["planned_budget_seconds"] == pytest.approx(max(1e-3, left), rel=1e-3)
    assert 0 < info["estimated_setup_seconds"] < info["estimated_seconds"]
    fits = "no plan fits the time budget" not in info["reason"]
    if budget >= 2.0:
        assert fits, info  # pre-filtering, PCA and the class approximation reach it on the table's rates
    if fits:
        assert info["estimated_seconds"] <= left * 1.0001
        assert info["gave_up"], info
    else:
        assert info["estimated_seconds"] > left
    # The fake clock stands still while the passes run: the guard never cuts them.
    assert "deadline" not in out.diagnostics
    assert out.diagnostics["steps"]["forward"] >= 10  # B picks, or 2B with the oversampling kept
    assert len(set(out.indices.tolist())) == 10


def test_a_real_flat_100_class_call_keeps_a_budget_of_a_few_seconds(fresh_rates: Any) -> None:
    """Measured rates, real clock, small sizes. The bound is loose (a loaded 2-core box moves between
    the rates' measurement and the call), the greedy must not have been cut to nothing.

    The rates and correction factors start fresh: in a whole-suite process earlier calls leave factors
    down to ``FACTOR_BOUNDS[0]``, and exact (~14 s here) then looked as if it fitted 5 s."""
    budget = 5.0
    x, p = _flat(1, 700, 16, 100)
    select("bait", embeddings=x[:60], probs=p[:60], batch_size=2, time_budget_s=budget)  # warm the process
    t0 = time.perf_counter()
    out = select("bait", embeddings=x, probs=p, labeled=np.arange(200), batch_size=10, time_budget_s=budget)
    total = time.perf_counter() - t0
    info = out.diagnostics["approximation"]
    assert info["kind"] != "exact" and info["gave_up"], info
    assert total <= 3 * budget, (total, info, out.diagnostics["timings"])
    assert out.diagnostics["steps"]["forward"] >= 1, out.diagnostics
    assert len(set(out.indices.tolist())) == 10


def test_the_exact_objectives_cost_is_timed_on_a_pilot_when_the_model_would_let_it_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pass over the whole pool is bound by memory and per-block work the model does not count (g14 of
    the grid: 159 s where the model said ~6 s, 6.8x the budget). Before it runs, it is timed on a pilot."""
    from selection.bait import plan
    from selection.validation import build_problem

    x, p = _flat(1, 20_000, 32, 10)
    problem = build_problem(
        embeddings=x, probs=p, labeled=np.arange(100), reserved=None, batch_size=10, task="classification",
        seed=0, device=None, dtype=None, chunk_size=None, progress=None, needs_probs=True,
    )  # fmt: skip
    monkeypatch.setattr(plan, "_modelled_objective_seconds", lambda *a: 1e-9)  # a model that sees no cost
    timed: list[int] = []
    real = plan.kron_sum

    def counting(xs: torch.Tensor, *a: Any, **k: Any) -> torch.Tensor:
        timed.append(int(xs.shape[0]))
        return real(xs, *a, **k)

    monkeypatch.setattr(plan, "kron_sum", counting)
    measured = plan._objective_seconds(problem, 9, "fisher", within=30.0)
    assert timed == [plan.OBJECTIVE_PILOT_ROWS] and measured > 1e-6  # the pilot's time, scaled to 20,000 rows
    # no pilot when the model already rules the pass out, when anything goes, or in identity mode
    monkeypatch.setattr(plan, "_modelled_objective_seconds", lambda *a: 50.0)
    assert plan._objective_seconds(problem, 9, "fisher", within=30.0) == 50.0
    assert plan._objective_seconds(problem, 9, "fisher", within=float("inf")) == 50.0
    assert plan._objective_seconds(problem, 9, "identity", within=100.0) == 50.0
    assert timed == [plan.OBJECTIVE_PILOT_ROWS]


def test_an_exact_plan_that_fits_pays_for_no_objective_estimate(
    fresh_rates: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The exact objective's estimate (and its pilot pass) matters only to approximate plans: a call whose exact
    plan fits never computes it (it took 3.3 s of a 9.4 s k = 26 call); one that must approximate does."""
    from selection.bait import plan

    monkeypatch.setattr(calibrate, "measure", lambda *a, **k: calibrate.TABLE[("cpu", F64)])
    asked: list[int] = []
    real = plan._objective_seconds

    def recording(problem: Any, *a: Any, **k: Any) -> float:
        asked.append(problem.n)
        return real(problem, *a, **k)

    monkeypatch.setattr(plan, "_objective_seconds", recording)
    x, p = _flat(1, 3000, 16, 6)
    res = select("bait", embeddings=x, probs=p, labeled=np.arange(60), batch_size=10, time_budget_s=60.0)
    assert res.diagnostics["approximation"]["kind"] == "exact" and asked == []
    x, p = _flat(1, 3000, 64, 60)
    res = select("bait", embeddings=x, probs=p, labeled=np.arange(120), batch_size=10, time_budget_s=2.0)
    assert res.diagnostics["approximation"]["kind"] != "exact" and asked == [3000]

"""The compiled forward step (selection/fused.py) against the engine's chunked step and the naive implementation.

The kernel must give the same ``g``, ``h~`` and scores as the chunked step's CPU update
(``_update_rows_numpy``, which the engine keeps for log det mode and the backward pass on ``P`` and ``Q``)
followed by ``trace_solve_scores`` (float64 to rounding), keep padding lanes inert, give NaN where
``I + g`` is not positive definite, and leave the forward pass's picks unchanged: the same picks as the
engine's chunked step (the path of the CUDA device, run here on CPU by turning the kernel off for the
call) and as the naive implementation in float64.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from selection import fused
from selection.bait import bait, engine
from selection.bait.engine import _update_rows_numpy
from selection.linalg import trace_solve_scores
from tests.selection.naive_bait import naive_bait
from tests.selection.test_bait import Case, make_data, make_problem


def _chunked_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """Later calls run the forward steps through the engine's chunked step instead of the kernel."""
    monkeypatch.setattr(engine._Bait, "_runs_fused", lambda self, st, half_h: False)


def _random_state(
    rng: np.random.Generator, m: int, d: int, r: int, rc: int, dtype: type[np.floating]
) -> dict[str, np.ndarray]:
    a = rng.normal(size=(m, rc, rc)) * 0.3
    b = rng.normal(size=(m, rc, rc)) * 0.3
    return {
        "x": rng.normal(size=(m, d)).astype(dtype),
        "et": (rng.normal(size=(m, rc, r)) * 0.5).astype(dtype),
        "g": (a @ a.transpose(0, 2, 1) + np.eye(rc)).astype(dtype),
        "h": (b @ b.transpose(0, 2, 1) * 0.5 + rng.normal(size=(m, rc, rc)) * 0.01).astype(dtype),
        "blocks": (rng.normal(size=(d, r * 2 * rc)) * 0.05).astype(dtype),
    }


def _reference(s: dict[str, np.ndarray], sigma: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    g, h = s["g"].copy(), s["h"].copy()
    t = {k: torch.from_numpy(v) for k, v in s.items()}
    _update_rows_numpy(t["x"], t["et"], torch.from_numpy(g), torch.from_numpy(h), t["blocks"], sigma, half_h=True)
    scores = trace_solve_scores(torch.from_numpy(g), torch.from_numpy(h), sigma, half_h=True).numpy()
    return g, h, scores


def _kernel(s: dict[str, np.ndarray], sigma: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    m, rc = s["g"].shape[:2]
    lanes = fused.lanes_for(rc)
    n_pad = fused.padded(m, lanes)
    dt = s["g"].dtype
    x = np.zeros((n_pad, s["x"].shape[1]), dtype=dt)
    x[:m] = s["x"]
    t = np.ascontiguousarray(s["blocks"].T) @ x.T
    et, g, h = (fused.to_tiles(s[k], n_pad, lanes) for k in ("et", "g", "h"))
    out = np.full(n_pad, -1.0, dtype=dt)
    fused.fused_step(t, et, g, h, out, sigma, np.empty((6, rc, rc, lanes), dtype=dt), np.empty((4, lanes), dtype=dt))
    # Padding lanes: zero embedding, zero state -> unchanged state and a zero score.
    assert np.all(out[m:] == 0.0)
    assert np.all(fused.from_tiles(g, n_pad)[m:] == 0.0)
    return fused.from_tiles(g, m), fused.from_tiles(h, m), out[:m]


@pytest.mark.parametrize(("m", "r", "rc"), [(300, 4, 4), (1, 9, 9), (257, 9, 9), (40, 5, 3), (70, 25, 25)])
@pytest.mark.parametrize("sigma", [1.0, -1.0])
def test_kernel_matches_the_numpy_update_and_scores_in_float64(m: int, r: int, rc: int, sigma: float) -> None:
    rng = np.random.default_rng(m * 100 + r * 10 + rc)
    s = _random_state(rng, m, 6, r, rc, np.float64)
    if sigma < 0:
        s["g"] *= 0.05  # I - g must stay positive definite for most rows
        s["blocks"] *= 0.5 / r
    g_ref, h_ref, sc_ref = _reference(s, sigma)
    g, h, sc = _kernel(s, sigma)
    np.testing.assert_allclose(g, g_ref, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(h, h_ref, rtol=1e-12, atol=1e-12)
    assert np.array_equal(np.isnan(sc), np.isnan(sc_ref))
    ok = ~np.isnan(sc_ref)
    assert ok.any()
    np.testing.assert_allclose(sc[ok], sc_ref[ok], rtol=1e-10, atol=1e-12)


def test_kernel_in_float32_agrees_with_float64() -> None:
    rng = np.random.default_rng(3)
    s64 = _random_state(rng, 1000, 16, 9, 9, np.float64)
    s32 = {k: v.astype(np.float32) for k, v in s64.items()}
    _, _, sc64 = _reference(s64, 1.0)
    g, _, sc32 = _kernel(s32, 1.0)
    assert g.dtype == np.float32 and sc32.dtype == np.float32
    np.testing.assert_allclose(sc32, sc64, rtol=1e-3, atol=1e-4)


def test_rows_whose_system_is_not_positive_definite_score_nan() -> None:
    rng = np.random.default_rng(5)
    s = _random_state(rng, 20, 6, 4, 4, np.float64)
    s["g"][3] = -2.0 * np.eye(4)  # I + g = -I
    s["g"][7, 2, 2] = -1.0 - 1e-3  # one negative pivot
    s["blocks"][:] = 0.0
    _, _, sc_ref = _reference(s, 1.0)
    _, _, sc = _kernel(s, 1.0)
    assert np.isnan(sc[3]) and np.isnan(sc[7])
    assert np.array_equal(np.isnan(sc), np.isnan(sc_ref))
    assert np.isfinite(np.delete(sc, [3, 7])).all()


def test_tile_layout_round_trips() -> None:
    a = np.arange(5 * 3 * 2, dtype=np.float64).reshape(5, 3, 2)
    t = fused.to_tiles(a, 8, 4)
    assert t.shape == (2, 3, 2, 4)
    assert t[1, 2, 1, 0] == a[4, 2, 1]
    assert np.all(t[1, :, :, 1:] == 0.0)
    assert np.array_equal(fused.from_tiles(t, 5), a)
    assert fused.lanes_for(9) == 256 and fused.lanes_for(25) == 64 and fused.lanes_for(99) == 16


@pytest.mark.parametrize("k", [3, 10])
@pytest.mark.parametrize("chunk", [64, 4096])
def test_forward_picks_equal_the_chunked_step_and_naive(k: int, chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    case = Case(seed=11 + k, n=700, d=6, k=k, batch=12, n_labeled=8, lam=0.05)
    data = make_data(case)
    out = bait(make_problem(data, case.batch, chunk_size=chunk), lam=case.lam)
    _chunked_step(monkeypatch)
    ref_step = bait(make_problem(data, case.batch, chunk_size=chunk), lam=case.lam)
    ref = naive_bait(data.x, data.probs, data.labeled, data.reserved, case.batch, lam=case.lam)
    assert out.diagnostics["forward_indices"] == ref_step.diagnostics["forward_indices"] == ref.forward
    assert out.indices.tolist() == ref_step.indices.tolist() == ref.indices
    assert out.objective == pytest.approx(ref_step.objective, rel=1e-10)


@pytest.mark.parametrize(("k", "d", "n_labeled"), [(5, 40, 0), (5, 40, 30), (3, 40, 8)])
@pytest.mark.parametrize("span", [True, False])
def test_deferred_updates_pick_what_naive_picks(
    k: int, d: int, n_labeled: int, span: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 2B (r + 1) < 2 D and 2 (2B) r <= D: the forward pass defers P's and Q's updates. The backward pass
    # reads them in the picks' span, or (span=False, as when 2B r >= D) folds them into P and Q first.
    if not span:
        monkeypatch.setattr(engine, "_span_backward", lambda span_cols, big_d: False)
    case = Case(seed=5 + k + n_labeled, n=400, d=d, k=k, batch=6, n_labeled=n_labeled, lam=0.05)
    data = make_data(case)
    out = bait(make_problem(data, case.batch), lam=case.lam)
    assert out.diagnostics["pq_updates"] == "deferred"
    _chunked_step(monkeypatch)
    ref_step = bait(make_problem(data, case.batch), lam=case.lam)
    assert ref_step.diagnostics["pq_updates"] == "in place"
    ref = naive_bait(data.x, data.probs, data.labeled, data.reserved, case.batch, lam=case.lam)
    assert out.diagnostics["forward_indices"] == ref_step.diagnostics["forward_indices"] == ref.forward
    assert out.indices.tolist() == ref_step.indices.tolist() == ref.indices
    assert out.objective == pytest.approx(ref.objective, rel=1e-8)


def test_updates_stay_in_place_when_deferring_would_exceed_the_memory_of_f() -> None:
    # k = 10, d = 6: 2 * 2B * r = 2 * 24 * 9 > D = 54.
    case = Case(seed=2, n=300, d=6, k=10, batch=12, lam=0.05)
    out = bait(make_problem(make_data(case), case.batch), lam=case.lam)
    assert out.diagnostics["pq_updates"] == "in place"


def test_deferred_updates_in_float32_stay_close_to_float64() -> None:
    case = Case(seed=21, n=3000, d=48, k=8, batch=10, n_labeled=40, lam=0.05)
    data = make_data(case)
    o64 = bait(make_problem(data, case.batch, dtype=torch.float64), lam=case.lam)
    o32 = bait(make_problem(data, case.batch, dtype=torch.float32), lam=case.lam)
    assert o32.diagnostics["pq_updates"] == o64.diagnostics["pq_updates"] == "deferred"
    assert o32.objective == pytest.approx(o64.objective, rel=1e-3)

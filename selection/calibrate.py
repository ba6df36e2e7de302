"""Rates of the BAIT cost model on the machine it runs on: a quick microbenchmark, cached per process.

The auto plan (:func:`selection.bait.plan._plan`) turns multiply-add counts into seconds with four rates:

* ``gemm``: multiply-adds per second of pool-sized GEMMs in the pool dtype (the setup's ``F``, ``g``,
  ``h`` and the greedy step's ``[U~ | R^]^T X^T``), run the way the engine runs them (on CPU: one
  OpenBLAS thread per worker thread, ``threads`` workers at once);
* ``small``: multiply-adds per second of the per-candidate ``rc x rc`` algebra of a greedy step (on
  CPU the compiled kernel of :mod:`selection.fused`; elsewhere torch's batched ops), measured at a small
  and a large ``rc`` (small matrices run at a lower rate) and interpolated in ``log rc``;
* ``matrix``: float64 multiply-adds per second of the ``D x D`` rank updates of ``P`` and ``Q``;
* ``stream``: bytes per second of the ``D x D`` block matrix-vector passes.

:func:`machine_rates` measures them once per process and key ``(device, dtype, threads)`` (about
0.3-0.6 s on a 2-core CPU, a compile of the kernel included on a cold numba cache); the result is
cached, so every later plan of the process uses the same numbers. ``BAIT_RATES=table`` uses
:data:`TABLE` instead (deterministic plans, e.g. for tests that pin one): rates measured on the 2-core
AMD EPYC benchmark machine after the compiled step (issue 15), and round figures for CUDA.

The measurement sees the machine as it is (other processes included): on a loaded box the rates, and
so the plans, are slower ones. That is the point: the budget is a promise about this machine.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from selection import fused
from selection.linalg import block_matvec, trace_solve_scores

__all__ = ["TABLE", "Rates", "machine_rates", "measure", "small_flops"]


@dataclass(frozen=True)
class Rates:
    """Rates of one ``(device, dtype, threads)``; see the module docstring."""

    gemm: float
    small_lo: float  # at rc = SMALL_RC[0]
    small_hi: float  # at rc = SMALL_RC[1]
    matrix: float
    stream: float
    source: str = "table"
    seconds: float = 0.0  # time the measurement took

    def small(self, rc: int) -> float:
        """Rate of the per-candidate algebra at ``rc`` columns (log-linear between the two measured ``rc``).

        Above the larger one the rate falls as ``(rc_hi / rc)^0.4``: a candidate's ``rc x rc`` state then
        leaves the cache (k = 100, rc = 99, d = 32: ~1.1e9/s measured against ~1.8e9/s at rc = 24).
        """
        lo, hi = SMALL_RC
        t = min(1.0, max(0.0, (math.log(max(rc, 1)) - math.log(lo)) / (math.log(hi) - math.log(lo))))
        rate = math.exp((1 - t) * math.log(self.small_lo) + t * math.log(self.small_hi))
        return rate * (hi / rc) ** 0.4 if rc > hi else rate

    def describe(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "gemm": float(f"{self.gemm:.3g}"),
            "small": [float(f"{self.small_lo:.3g}"), float(f"{self.small_hi:.3g}")],
            "matrix": float(f"{self.matrix:.3g}"),
            "stream": float(f"{self.stream:.3g}"),
        }


#: ``rc`` at which the per-candidate rate is measured.
SMALL_RC = (8, 24)

#: Fallback rates per (device type, dtype) for 2 threads: measured on the 2-core AMD EPYC benchmark
#: machine (load ~1) with the compiled step; CUDA figures are round guesses for a datacenter GPU (never
#: measured here: no GPU was available), used only when ``BAIT_RATES=table``.
TABLE: dict[tuple[str, torch.dtype], Rates] = {
    ("cpu", torch.float32): Rates(gemm=6e10, small_lo=2.5e9, small_hi=6e9, matrix=2e10, stream=1.5e10),
    ("cpu", torch.float64): Rates(gemm=3e10, small_lo=1.5e9, small_hi=3.5e9, matrix=2e10, stream=1.5e10),
    ("cuda", torch.float32): Rates(gemm=2e13, small_lo=2e11, small_hi=1e12, matrix=2e12, stream=1e12),
    ("cuda", torch.float64): Rates(gemm=1e12, small_lo=1e11, small_hi=4e11, matrix=1e12, stream=1e12),
}

_CACHE: dict[tuple[str, int | None, torch.dtype, int], Rates] = {}
_LOCK = threading.Lock()


def small_flops(r: int, rc: int, cols: int = 2) -> float:
    """Multiply-adds per candidate of one greedy step's small algebra: ``[W | Z] = E^T T``, the
    ``g``/``h`` updates and the elimination score (the counts the rates are measured in)."""
    return cols * r * rc * rc + 1.5 * rc**3 + (2.0 / 3.0) * rc**3


def table_rates(device: torch.device, dtype: torch.dtype) -> Rates:
    return TABLE.get((device.type, dtype), TABLE[("cpu", torch.float64)])


def machine_rates(device: torch.device, dtype: torch.dtype, threads: int) -> Rates:
    """The rates of ``(device, dtype, threads)``: measured once per process (cached), or :data:`TABLE`
    with ``BAIT_RATES=table``."""
    if os.environ.get("BAIT_RATES", "").strip() == "table":
        return table_rates(device, dtype)
    key = (device.type, device.index, dtype, int(threads))
    with _LOCK:
        hit = _CACHE.get(key)
        if hit is None:
            try:
                hit = measure(device, dtype, threads)
            except Exception:  # a failed microbenchmark must not fail a selection: fall back to the table
                hit = table_rates(device, dtype)
            _CACHE[key] = hit
        return hit


def clear_cache() -> None:
    """Forget measured rates (the next plan measures again)."""
    with _LOCK:
        _CACHE.clear()


def _best(fn: Callable[[], object], repeat: int, sync: Callable[[], None]) -> float:
    fn()  # warm: first-touch of buffers, kernel load
    sync()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    # The median, not the best: on a shared machine the best run is a lucky slice the real work rarely gets.
    return max(sorted(times)[len(times) // 2], 1e-7)


def _parallel(pool: ThreadPoolExecutor | None, threads: int, fn: Callable[[int], None]) -> Callable[[], None]:
    """``fn(i)`` for ``i < threads`` on the pool's threads (BLAS at one thread each, as in the engine)."""
    if pool is None or threads <= 1:
        return lambda: fn(0)

    def run() -> None:
        for _ in pool.map(fn, range(threads)):
            pass

    return run


def measure(device: torch.device, dtype: torch.dtype, threads: int) -> Rates:
    """Microbenchmark of the four rates on ``device`` (see the module docstring)."""
    t_start = time.perf_counter()
    out = _measure_cpu(dtype, max(1, threads)) if device.type == "cpu" else _measure_torch(device, dtype)
    return Rates(
        gemm=out["gemm"],
        small_lo=out["small_lo"],
        small_hi=out["small_hi"],
        matrix=out["matrix"],
        stream=out["stream"],
        source=f"measured ({device.type}, {str(dtype).removeprefix('torch.')}, {threads} threads)",
        seconds=time.perf_counter() - t_start,
    )


def _measure_cpu(dtype: torch.dtype, threads: int) -> dict[str, float]:
    dt = np.dtype(str(dtype).removeprefix("torch."))
    rng = np.random.default_rng(0)
    res: dict[str, float] = {}
    saved = torch.get_num_threads()
    torch.set_num_threads(1)
    pool = ThreadPoolExecutor(threads, thread_name_prefix="bait-rates") if threads > 1 else None
    try:
        with threadpool_limits(1, user_api="blas"):
            # Pool GEMM: each worker one (rows x d) @ (d x cols) product, the greedy step's shape.
            m, d, cols = 4096, 128, 256
            xs = [rng.standard_normal((cols, d)).astype(dt) for _ in range(threads)]
            ys = [rng.standard_normal((d, m)).astype(dt) for _ in range(threads)]
            outs = [np.empty((cols, m), dtype=dt) for _ in range(threads)]

            def gemm(i: int) -> None:
                np.matmul(xs[i], ys[i], out=outs[i])

            run = _parallel(pool, threads, gemm)
            res["gemm"] = threads * m * d * cols / _best(run, 5, lambda: None)
            # The compiled step at two rc, one tile run per worker.
            for name, rc in (("small_lo", SMALL_RC[0]), ("small_hi", SMALL_RC[1])):
                r = rc
                lanes = fused.lanes_for(rc)
                # ~2e7 multiply-adds per worker (a few ms), whole tiles, at least two.
                n = lanes * max(2, min(4096, int(2e7 / small_flops(r, rc))) // lanes)
                tiles = n // lanes
                bufs = []
                for _ in range(threads):
                    t = (rng.standard_normal((r * 2 * rc, n)) * 1e-3).astype(dt)
                    et = rng.standard_normal((tiles, rc, r, lanes)).astype(dt)
                    g = np.zeros((tiles, rc, rc, lanes), dtype=dt)
                    h = np.zeros((tiles, rc, rc, lanes), dtype=dt)
                    sc = np.zeros(n, dtype=dt)
                    bufs.append((t, et, g, h, sc, np.empty((6, rc, rc, lanes), dt), np.empty((4, lanes), dt)))

                def step(i: int, bufs: list[Any] = bufs) -> None:
                    t, et, g, h, sc, s1, s2 = bufs[i]
                    fused.fused_step(t, et, g, h, sc, 1.0, s1, s2)

                run = _parallel(pool, threads, step)
                res[name] = threads * n * small_flops(r, rc) / _best(run, 5, lambda: None)
            # D x D rank updates (float64, row blocks on the workers) and block matvecs.
            big_d, rc = 1536, 24
            p = rng.standard_normal((big_d, big_d))
            u = rng.standard_normal((big_d, rc))
            ut = np.ascontiguousarray(u.T)
            xv = rng.standard_normal(64)
            pt = torch.from_numpy(p)
            blocks = [(lo, min(big_d, lo + 128)) for lo in range(0, big_d, 128)]

            def upd(i: int) -> None:
                for lo, hi in blocks[i::threads]:
                    p[lo:hi] -= u[lo:hi] @ ut

            def mv(i: int) -> None:
                for lo, hi in blocks[i::threads]:
                    block_matvec(pt[lo:hi], torch.from_numpy(xv))

            res["matrix"] = big_d * big_d * rc / _best(_parallel(pool, threads, upd), 3, lambda: None)
            res["stream"] = big_d * big_d * 8 / _best(_parallel(pool, threads, mv), 3, lambda: None)
    finally:
        if pool is not None:
            pool.shutdown()
        torch.set_num_threads(saved)
    return res


def _measure_torch(device: torch.device, dtype: torch.dtype) -> dict[str, float]:
    """The same four rates with torch ops on an accelerator (the engine's non-CPU path)."""
    gen = torch.Generator(device="cpu").manual_seed(0)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def rand(*shape: int, dt: torch.dtype = dtype) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=dt).to(device)

    res: dict[str, float] = {}
    m, d, cols = 65536, 256, 512
    a, b = rand(m, d), rand(d, cols)
    res["gemm"] = m * d * cols / _best(lambda: a @ b, 3, sync)
    for name, rc in (("small_lo", SMALL_RC[0]), ("small_hi", SMALL_RC[1])):
        n = 32768
        et, t = rand(n, rc, rc), rand(n, rc, 2 * rc)
        g = torch.eye(rc, dtype=dtype, device=device).expand(n, rc, rc).contiguous()

        def step(et: torch.Tensor = et, t: torch.Tensor = t, g: torch.Tensor = g, rc: int = rc) -> None:
            wz = torch.bmm(et, t)
            w = wz[:, :, :rc]
            gg = g + 1e-6 * torch.bmm(w, w.transpose(1, 2))
            hh = torch.bmm(w, wz[:, :, rc:].transpose(1, 2))
            trace_solve_scores(gg, hh, 1.0, half_h=True)

        res[name] = n * small_flops(rc, rc) / _best(step, 3, sync)
    big_d, rc = 4096, 32
    p, u = rand(big_d, big_d, dt=torch.float64), rand(big_d, rc, dt=torch.float64)
    res["matrix"] = big_d * big_d * rc / _best(lambda: p.addmm_(u, u.T, alpha=-1e-9), 3, sync)
    xv = rand(64, dt=torch.float64)
    res["stream"] = big_d * big_d * 8 / _best(lambda: block_matvec(p, xv), 3, sync)
    return res

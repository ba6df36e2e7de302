"""Rates of the BAIT cost model on the machine it runs on: a quick microbenchmark, cached per process.

The auto plan (:func:`selection.bait.plan._plan`) turns multiply-add counts into seconds with four rates:

* ``gemm``: multiply-adds per second of pool-sized GEMMs in the pool dtype (the setup's ``F``, ``g``,
  ``h`` and the greedy step's ``[U~ | R^]^T X^T``), run the way the engine runs them (on CPU: one
  OpenBLAS thread per worker thread, ``threads`` workers at once);
* ``small``: multiply-adds per second of the per-candidate ``rc x rc`` algebra of a greedy step (on
  CPU the compiled kernel of :mod:`selection.fused`; elsewhere torch's batched ops), measured at a small
  and a large ``rc`` (small matrices run at a lower rate) and interpolated in ``log rc``;
* ``matrix``: float64 multiply-adds per second of the ``D x D`` rank updates of ``P`` and ``Q``;
* ``stream``: bytes per second of the ``D x D`` block matrix-vector passes (and of the setup's
  elementwise passes over ``r x r x d`` row blocks, which are bound by memory at small ``d``);
* ``rank1``: bytes of ``X`` per second read by a rank-one greedy step (regression, binary: a GEMV and a
  few float64 vector passes, :func:`selection.linalg.rank_one_update`), run the way the engine runs it
  (row chunks on ``threads`` workers) over a pool larger than the caches: such a step is bound by reading
  ``X`` from memory, at a rate far below ``stream``'s cache-resident ``D x D`` passes (10^5 x 768 float32:
  ~5.6 GB/s against ~25 GB/s, so a model built on ``stream`` was 4x short);
* ``dense``: float64 multiply-adds per second of the setup's one-off ``D^3`` factorisations (Cholesky
  and its inverse, ``Q_0 = P_0 F P_0``), run as the setup runs them: on the calling thread at torch's
  intra-op thread count. On a loaded CPU they fall far below ``matrix`` (OpenMP threads wait on each
  other: 1 GFLOP/s at 2 threads against 7 at 1 thread, load 8 on 2 cores, D = 792).

:func:`machine_rates` measures them once per process and key ``(device, dtype, threads)``. The
measurement is bounded: its stages (GEMM, dense, stream, the compiled step at two ``rc``, the
D x D updates) stop when :data:`CAP_S` (or a tenth of the caller's time budget, when smaller) has
passed, and the rates not measured are the table's scaled by what the measured ones found (``partial``
in the source). The compiled kernel's first load (numba's cache, ~0.2 s quiet, ~1 s at load 8) is
not part of the cap. A partial measurement is redone, once, by the first later call whose budget
allows the whole measurement. ``BAIT_RATES=table`` uses :data:`TABLE` instead (deterministic plans,
e.g. for tests that pin one): rates measured on the 2-core AMD EPYC benchmark machine after the
compiled step (issue 15), and round figures for CUDA. :func:`warm` measures ahead of the first call
(a worker's start).

The measurement sees the machine as it is (other processes included): on a loaded box the rates, and
so the plans, are slower ones. That is the point: the budget is a promise about this machine. Load
changes after the measurement; :func:`observe` folds each call's measured setup and greedy times into
correction factors (a geometric running mean of measured/estimated), so a long-lived process follows its
machine. The factors are kept per phase and per **step kind** (:func:`step_kind`: rank one, all classes,
class approximations), because the model's error differs between kinds: one factor shared by all made a
run of over-estimated approximate plans halve the next exact plan's estimate (k = 10, n = 10^5: 8.0 s
estimated, 15.1 s measured).
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from selection import fused
from selection.linalg import block_matvec, rank_one_chunk, rank_one_update, trace_solve_scores

__all__ = [
    "TABLE",
    "Rates",
    "factor",
    "machine_rates",
    "measure",
    "observe",
    "rank1_rate",
    "small_flops",
    "step_kind",
    "warm",
]


@dataclass(frozen=True)
class Rates:
    """Rates of one ``(device, dtype, threads)``; see the module docstring."""

    gemm: float
    small_lo: float  # at rc = SMALL_RC[0]
    small_hi: float  # at rc = SMALL_RC[1]
    matrix: float
    stream: float
    dense: float = 0.0  # 0: ``matrix`` (rates built before the dense rate existed)
    rank1: float = 0.0  # bytes of X per second of a rank-one step (0: ``stream``)
    source: str = "table"
    seconds: float = 0.0  # time the measurement took
    dense_threads: int = 0  # torch threads of the setup's factorisations (0: torch's own)
    complete: bool = True  # every rate measured (False: some scaled from the table, see CAP_S)

    @property
    def dense_rate(self) -> float:
        return self.dense if self.dense > 0 else self.matrix

    @property
    def rank1_rate(self) -> float:
        return self.rank1 if self.rank1 > 0 else self.stream

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
            "dense": float(f"{self.dense_rate:.3g}"),
            "rank1": float(f"{self.rank1_rate:.3g}"),
            "dense_threads": self.dense_threads,
            "seconds": float(f"{self.seconds:.3g}"),
        }


#: ``rc`` at which the per-candidate rate is measured.
SMALL_RC = (8, 24)

#: ``rank1`` of the table on CPU (bytes of X per second, 2 threads, 2-core AMD EPYC box).
RANK1_TABLE_CPU = 8e9
#: Bytes of ``X`` the ``rank1`` stage reads per pass (more than the box's last-level cache), at ``RANK1_D``.
RANK1_BYTES = 48 * 2**20
RANK1_D = 128

#: Fallback rates per (device type, dtype) for 2 threads: measured on the 2-core AMD EPYC benchmark
#: machine (load ~1) with the compiled step; CUDA figures are round guesses for a datacenter GPU (never
#: measured here: no GPU was available), used only when ``BAIT_RATES=table``.
#: ``dense`` is the 2-thread Cholesky + inverse rate of a quiet 2-core box (D = 792: ~1.5e10).
TABLE: dict[tuple[str, torch.dtype], Rates] = {
    ("cpu", torch.float32): Rates(
        gemm=6e10, small_lo=2.5e9, small_hi=6e9, matrix=2e10, stream=1.5e10, dense=1.5e10, rank1=RANK1_TABLE_CPU
    ),
    ("cpu", torch.float64): Rates(
        gemm=3e10, small_lo=1.5e9, small_hi=3.5e9, matrix=2e10, stream=1.5e10, dense=1.5e10, rank1=RANK1_TABLE_CPU
    ),
    ("cuda", torch.float32): Rates(
        gemm=2e13, small_lo=2e11, small_hi=1e12, matrix=2e12, stream=1e12, dense=5e11, rank1=5e11
    ),
    ("cuda", torch.float64): Rates(
        gemm=1e12, small_lo=1e11, small_hi=4e11, matrix=1e12, stream=1e12, dense=3e11, rank1=5e11
    ),
}

#: Wall-clock cap of one measurement (seconds, the kernel's first load excluded): the stages not
#: reached by then are scaled from the table. Quiet 2-core box: all stages in ~0.1 s.
CAP_S = 0.2
#: Fraction of the caller's time budget a measurement may take, when that is less than CAP_S.
CAP_BUDGET_FRACTION = 0.1
#: Weight of the newest observation in the correction factors (see observe), and their bounds.
OBSERVE_WEIGHT = 0.5
FACTOR_BOUNDS = (0.2, 20.0)
#: Phases shorter than this (seconds, measured) are not observed: there the fixed costs, not the rates, set the
#: time (a 0.08 s greedy of a 10^4-row binary pool, estimated at 0.02 s, doubled the next 10^5-row estimate).
OBSERVE_MIN_S = 0.5

_RATE_NAMES = ("gemm", "dense", "stream", "rank1", "small_lo", "small_hi", "matrix")

_CACHE: dict[tuple[str, int | None, torch.dtype, int], Rates] = {}
#: Correction factors per (rates key, phase, step kind); see :func:`observe`.
_FACTORS: dict[tuple[tuple[str, int | None, torch.dtype, int], str, str], float] = {}
STEP_KINDS = ("rank1", "full", "classes")
_LOCK = threading.Lock()
#: Clock of the measurement's cap (tests replace it).
_CLOCK: Callable[[], float] = time.perf_counter


def small_flops(r: int, rc: int, cols: int = 2) -> float:
    """Multiply-adds per candidate of one greedy step's small algebra: ``[W | Z] = E^T T``, the
    ``g``/``h`` updates and the elimination score (the counts the rates are measured in)."""
    return cols * r * rc * rc + 1.5 * rc**3 + (2.0 / 3.0) * rc**3


def table_rates(device: torch.device, dtype: torch.dtype) -> Rates:
    return TABLE.get((device.type, dtype), TABLE[("cpu", torch.float64)])


def _key(device: torch.device, dtype: torch.dtype, threads: int) -> tuple[str, int | None, torch.dtype, int]:
    return (device.type, device.index, dtype, int(threads))


def machine_rates(device: torch.device, dtype: torch.dtype, threads: int, *, budget_s: float | None = None) -> Rates:
    """The rates of ``(device, dtype, threads)``: measured once per process (cached), or :data:`TABLE`
    with ``BAIT_RATES=table``.

    ``budget_s`` (the caller's time budget) bounds a measurement made now to
    ``min(CAP_S, CAP_BUDGET_FRACTION * budget_s)``; a partial one is redone once, by the first later
    call with a ``budget_s`` that allows :data:`CAP_S` (calls without one use the cache as it is).
    """
    if os.environ.get("BAIT_RATES", "").strip() == "table":
        return table_rates(device, dtype)
    cap = CAP_S if budget_s is None else min(CAP_S, CAP_BUDGET_FRACTION * budget_s)
    key = _key(device, dtype, threads)
    with _LOCK:
        hit = _CACHE.get(key)
        redo = (
            hit is not None
            and budget_s is not None
            and not hit.complete
            and cap >= CAP_S
            and "redone" not in hit.source
        )
        if hit is None or redo:
            try:
                fresh = measure(device, dtype, threads, cap_s=cap)
            except Exception:  # a failed microbenchmark must not fail a selection: fall back to the table
                fresh = table_rates(device, dtype)
            if redo and hit is not None:
                fresh = replace(fresh, source=fresh.source + (" (redone)" if not fresh.complete else ""))
            hit = fresh
            _CACHE[key] = hit
        return hit


def dense_threads(device: torch.device, dtype: torch.dtype, threads: int) -> int:
    """Torch threads for the setup's ``D^3`` factorisations: the faster measured, else torch's own."""
    if device.type != "cpu" or os.environ.get("BAIT_RATES", "").strip() == "table":
        return torch.get_num_threads()
    with _LOCK:
        hit = _CACHE.get(_key(device, dtype, threads))
    return hit.dense_threads if hit is not None and hit.dense_threads > 0 else torch.get_num_threads()


def cached(device: torch.device, dtype: torch.dtype, threads: int) -> bool:
    """Whether a call now would use rates without measuring (table mode, or measured before)."""
    if os.environ.get("BAIT_RATES", "").strip() == "table":
        return True
    with _LOCK:
        return _key(device, dtype, threads) in _CACHE


def warm(device: torch.device, dtype: torch.dtype, threads: int) -> Rates:
    """Measure the rates (whole, :data:`CAP_S`) and load the compiled kernel now, e.g. when a worker starts."""
    return machine_rates(device, dtype, threads)


_RANK1: dict[tuple[tuple[str, int | None, torch.dtype, int], int], float] = {}


def rank1_rate(device: torch.device, dtype: torch.dtype, threads: int, d: int) -> float:
    """Bytes of ``X`` per second of the rank-one step at dimension ``d``, measured once per process and ``d``
    (about :data:`RANK1_BYTES` of rows, the engine's chunks on ``threads`` workers; ~0.1 s), or the table's with
    ``BAIT_RATES=table``. The rate depends on ``d`` in no simple way (the GEMV's kernel changes with the
    shape: 6.3 GB/s at d = 128 against 11 GB/s at d = 64 and d = 768 on the quiet 2-core box), so a rank-one
    plan is costed at its own ``d``, not at the ``rank1`` stage's."""
    if os.environ.get("BAIT_RATES", "").strip() == "table":
        return table_rates(device, dtype).rank1_rate
    key = (_key(device, dtype, threads), int(d))
    with _LOCK:
        hit = _RANK1.get(key)
    if hit is not None:
        return hit
    try:
        rate = _rank1_measure(device, dtype, max(1, threads), max(1, int(d)))
    except Exception:  # a failed microbenchmark must not fail a selection
        rate = table_rates(device, dtype).rank1_rate
    with _LOCK:
        _RANK1[key] = rate
    return rate


def _rank1_measure(device: torch.device, dtype: torch.dtype, threads: int, d: int) -> float:
    itemsize = torch.finfo(dtype).bits // 8
    rows = max(1024, RANK1_BYTES // (d * itemsize))
    x = torch.full((rows, d), 1e-3, dtype=dtype, device=device)
    et = torch.full((rows, 1, 1), 1e-3, dtype=torch.float64, device=device)
    g = torch.ones((rows, 1, 1), dtype=torch.float64, device=device)
    h = torch.ones((rows, 1, 1), dtype=torch.float64, device=device)
    b = torch.full((d, 2), 1e-3, dtype=torch.float64, device=device)
    if device.type != "cpu":

        def sync() -> None:
            torch.cuda.synchronize(device)

        def whole() -> None:
            rank_one_update(x, et, g, h, b, 1.0)
            trace_solve_scores(g, h, 1.0)

        return rows * d * itemsize / _best(whole, 3, sync)
    cs = rank_one_chunk(rows, threads, 2**18)
    chunks = [(lo, min(rows, lo + cs)) for lo in range(0, rows, cs)]
    saved = torch.get_num_threads()
    pool = ThreadPoolExecutor(threads, thread_name_prefix="bait-rank1") if threads > 1 else None

    def step(i: int) -> None:
        for lo, hi in chunks[i::threads]:
            rank_one_update(x[lo:hi], et[lo:hi], g[lo:hi], h[lo:hi], b, 1.0)
            trace_solve_scores(g[lo:hi], h[lo:hi], 1.0)

    torch.set_num_threads(1)
    try:
        with threadpool_limits(1, user_api="blas"):
            return rows * d * itemsize / _best(_parallel(pool, threads, step), 3, lambda: None)
    finally:
        torch.set_num_threads(saved)
        if pool is not None:
            pool.shutdown()


def step_kind(r: int, rc: int) -> str:
    """The kind of greedy step a plan runs, for :func:`observe`'s factors: ``"rank1"`` (regression, binary),
    ``"full"`` (every class: ``rc == r``) or ``"classes"`` (top-c and sampled class approximations)."""
    if r == 1:
        return "rank1"
    return "full" if rc == r else "classes"


def factor(device: torch.device, dtype: torch.dtype, threads: int, *, phase: str, kind: str) -> float:
    """The correction factor in force for ``phase`` of ``kind`` plans (1 until :func:`observe` saw one)."""
    if os.environ.get("BAIT_RATES", "").strip() == "table":
        return 1.0
    with _LOCK:
        return _FACTORS.get((_key(device, dtype, threads), phase, kind), 1.0)


def factors(device: torch.device, dtype: torch.dtype, threads: int) -> dict[str, dict[str, float]]:
    """The factors in force, ``{phase: {kind: factor}}`` (those observed), for diagnostics."""
    key = _key(device, dtype, threads)
    out: dict[str, dict[str, float]] = {}
    with _LOCK:
        for (k, phase, kind), val in _FACTORS.items():
            if k == key:
                out.setdefault(phase, {})[kind] = float(f"{val:.3g}")
    return out


def observe(
    device: torch.device,
    dtype: torch.dtype,
    threads: int,
    *,
    phase: str,
    estimated: float,
    measured: float,
    kind: str = "full",
) -> None:
    """Fold one call's measured time of ``phase`` (``"setup"`` or ``"greedy"``) of a ``kind`` plan
    (:func:`step_kind`) into that kind's correction factor.

    ``estimated`` is the estimate made with the factor in force; the factor moves towards
    ``measured / (estimated / factor)`` by :data:`OBSERVE_WEIGHT` (geometric), within
    :data:`FACTOR_BOUNDS`. Table rates (``BAIT_RATES=table``), rates not measured yet in this process and
    short phases are not observed.
    """
    if phase not in ("setup", "greedy"):
        raise ValueError(f"unknown phase {phase!r}")
    if kind not in STEP_KINDS:
        raise ValueError(f"unknown step kind {kind!r}")
    if os.environ.get("BAIT_RATES", "").strip() == "table" or measured < OBSERVE_MIN_S or estimated <= 0:
        return
    key = _key(device, dtype, threads)
    with _LOCK:
        if key not in _CACHE:
            return
        old = _FACTORS.get((key, phase, kind), 1.0)
        ratio = measured / (estimated / old)
        new = math.exp((1 - OBSERVE_WEIGHT) * math.log(old) + OBSERVE_WEIGHT * math.log(ratio))
        _FACTORS[(key, phase, kind)] = min(FACTOR_BOUNDS[1], max(FACTOR_BOUNDS[0], new))


def clear_cache() -> None:
    """Forget measured rates (the next plan measures again)."""
    with _LOCK:
        _CACHE.clear()
        _FACTORS.clear()
        _RANK1.clear()


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


def measure(device: torch.device, dtype: torch.dtype, threads: int, *, cap_s: float = CAP_S) -> Rates:
    """Microbenchmark of the rates on ``device`` (see the module docstring), stopped after ``cap_s``."""
    t_start = time.perf_counter()
    extra: dict[str, int] = {}
    stages = _stages_cpu(dtype, max(1, threads), extra) if device.type == "cpu" else _stages_torch(device, dtype)
    res: dict[str, float] = {}
    with stages as run:
        t_cap = _CLOCK()  # after the kernel's first load (the stages' context entry)
        for name in _RATE_NAMES:
            if res and _CLOCK() - t_cap > cap_s:
                break
            res[name] = run(name)
    table = table_rates(device, dtype)
    n_measured = len(res)
    complete = n_measured == len(_RATE_NAMES)
    if not complete:
        # The rates not reached: the table's, scaled by the geometric mean of measured / table so far.
        scale = math.exp(sum(math.log(v / _table_value(table, k)) for k, v in res.items()) / len(res))
        for name in _RATE_NAMES:
            res.setdefault(name, scale * _table_value(table, name))
    how = (
        "measured" if complete else f"measured, partial ({n_measured} of {len(_RATE_NAMES)} stages, cap {cap_s:.2g} s)"
    )
    return Rates(
        gemm=res["gemm"],
        small_lo=res["small_lo"],
        small_hi=res["small_hi"],
        matrix=res["matrix"],
        stream=res["stream"],
        dense=res["dense"],
        rank1=res["rank1"],
        dense_threads=extra.get("dense_threads", 0),
        source=f"{how} ({device.type}, {str(dtype).removeprefix('torch.')}, {threads} threads)",
        seconds=time.perf_counter() - t_start,
        complete=complete,
    )


def _table_value(table: Rates, name: str) -> float:
    if name == "dense":
        return table.dense_rate
    if name == "rank1":
        return table.rank1_rate
    return float(getattr(table, name))


class _Stages:
    """Context whose value runs one named stage and returns its rate; cleanup on exit."""

    def __init__(self, run: Callable[[str], float], close: Callable[[], None]) -> None:
        self._run = run
        self._close = close

    def __enter__(self) -> Callable[[str], float]:
        return self._run

    def __exit__(self, *exc: object) -> None:
        self._close()


def _dense_rate(make: Callable[[int], torch.Tensor], sync: Callable[[], None], big_d: int) -> float:
    """Cholesky and its inverse of a ``big_d`` SPD matrix plus one ``big_d^3`` product, at torch's threads."""
    m = make(big_d)

    def run() -> None:
        chol = torch.linalg.cholesky(m)
        p = torch.cholesky_inverse(chol)
        torch.mm(p, m)

    # Cholesky D^3/3, its inverse 2 D^3/3 (the setup's counts), the product D^3.
    return 2 * big_d**3 / _best(run, 3, sync)


def _stages_cpu(dtype: torch.dtype, threads: int, stages_extra: dict[str, int]) -> _Stages:
    dt = np.dtype(str(dtype).removeprefix("torch."))
    rng = np.random.default_rng(0)
    saved = torch.get_num_threads()
    extra = stages_extra
    pool = ThreadPoolExecutor(threads, thread_name_prefix="bait-rates") if threads > 1 else None
    # The compiled kernel's first load (numba's cache) before the cap's clock starts.
    lanes0 = fused.lanes_for(SMALL_RC[0])
    rc0 = SMALL_RC[0]
    fused.fused_step(
        np.zeros((rc0 * 2 * rc0, lanes0), dt),
        np.zeros((1, rc0, rc0, lanes0), dt),
        np.zeros((1, rc0, rc0, lanes0), dt),
        np.zeros((1, rc0, rc0, lanes0), dt),
        np.zeros(lanes0, dt),
        1.0,
        np.empty((6, rc0, rc0, lanes0), dt),
        np.empty((4, lanes0), dt),
    )

    def spd(big_d: int) -> torch.Tensor:
        a = torch.from_numpy(rng.standard_normal((big_d, 64)))
        m = a @ a.T
        m.diagonal().add_(float(big_d))
        return m

    def gemm() -> float:
        # Each worker one (cols x d) @ (d x rows) product, the greedy step's shape.
        m, d, cols = 2048, 128, 128
        xs = [rng.standard_normal((cols, d)).astype(dt) for _ in range(threads)]
        ys = [rng.standard_normal((d, m)).astype(dt) for _ in range(threads)]
        outs = [np.empty((cols, m), dtype=dt) for _ in range(threads)]

        def one(i: int) -> None:
            np.matmul(xs[i], ys[i], out=outs[i])

        return threads * m * d * cols / _best(_parallel(pool, threads, one), 3, lambda: None)

    def small(rc: int) -> float:
        r = rc
        lanes = fused.lanes_for(rc)
        # ~5e6 multiply-adds per worker (a few ms), whole tiles, at least two.
        n = lanes * max(2, min(2048, int(5e6 / small_flops(r, rc))) // lanes)
        tiles = n // lanes
        bufs = []
        for _ in range(threads):
            t = (rng.standard_normal((r * 2 * rc, n)) * 1e-3).astype(dt)
            et = rng.standard_normal((tiles, rc, r, lanes)).astype(dt)
            g = np.zeros((tiles, rc, rc, lanes), dtype=dt)
            h = np.zeros((tiles, rc, rc, lanes), dtype=dt)
            sc = np.zeros(n, dtype=dt)
            bufs.append((t, et, g, h, sc, np.empty((6, rc, rc, lanes), dt), np.empty((4, lanes), dt)))

        def step(i: int) -> None:
            t, et, g, h, sc, s1, s2 = bufs[i]
            fused.fused_step(t, et, g, h, sc, 1.0, s1, s2)

        return threads * n * small_flops(r, rc) / _best(_parallel(pool, threads, step), 3, lambda: None)

    big_d, rc = 1024, 24
    blocks = [(lo, min(big_d, lo + 128)) for lo in range(0, big_d, 128)]
    mats: dict[str, Any] = {}

    def dd() -> tuple[np.ndarray[Any, Any], torch.Tensor]:
        if "p" not in mats:
            p = np.full((big_d, big_d), 1e-3)
            mats["p"], mats["pt"] = p, torch.from_numpy(p)
        return mats["p"], mats["pt"]

    def matrix() -> float:
        p, _ = dd()
        u = rng.standard_normal((big_d, rc)) * 1e-3
        ut = np.ascontiguousarray(u.T)

        def upd(i: int) -> None:
            for lo, hi in blocks[i::threads]:
                p[lo:hi] -= u[lo:hi] @ ut

        return big_d * big_d * rc / _best(_parallel(pool, threads, upd), 3, lambda: None)

    def stream() -> float:
        _, pt = dd()
        xv = torch.from_numpy(rng.standard_normal(64))

        def mv(i: int) -> None:
            for lo, hi in blocks[i::threads]:
                block_matvec(pt[lo:hi], xv)

        return big_d * big_d * 8 / _best(_parallel(pool, threads, mv), 3, lambda: None)

    def rank1() -> float:
        # The engine's rank-one step over RANK1_BYTES of X, in its row chunks on the worker threads (the
        # values do not matter to the time: a constant fill is quicker to make than random numbers).
        rows = max(1, RANK1_BYTES // (RANK1_D * dt.itemsize))
        x = torch.full((rows, RANK1_D), 1e-3, dtype=dtype)
        et = torch.full((rows, 1, 1), 1e-3, dtype=torch.float64)
        g = torch.ones((rows, 1, 1), dtype=torch.float64)
        h = torch.ones((rows, 1, 1), dtype=torch.float64)
        b = torch.full((RANK1_D, 2), 1e-3, dtype=torch.float64)
        cs = rank_one_chunk(rows, threads, 2**18)
        chunks = [(lo, min(rows, lo + cs)) for lo in range(0, rows, cs)]

        def step(i: int) -> None:
            for lo, hi in chunks[i::threads]:
                rank_one_update(x[lo:hi], et[lo:hi], g[lo:hi], h[lo:hi], b, 1.0)
                trace_solve_scores(g[lo:hi], h[lo:hi], 1.0)

        return rows * RANK1_D * dt.itemsize / _best(_parallel(pool, threads, step), 3, lambda: None)

    def run(name: str) -> float:
        if name == "dense":
            # On the calling thread, at torch's thread count and at one thread: the setup runs its
            # factorisations at the faster (dense_threads).
            own = _dense_rate(spd, lambda: None, 256)
            if saved <= 1:
                return own
            torch.set_num_threads(1)
            try:
                one = _dense_rate(spd, lambda: None, 256)
            finally:
                torch.set_num_threads(saved)
            extra["dense_threads"] = 1 if one > own else saved
            return max(one, own)
        torch.set_num_threads(1)
        try:
            with threadpool_limits(1, user_api="blas"):
                if name == "gemm":
                    return gemm()
                if name == "small_lo":
                    return small(SMALL_RC[0])
                if name == "small_hi":
                    return small(SMALL_RC[1])
                if name == "matrix":
                    return matrix()
                if name == "rank1":
                    return rank1()
                return stream()
        finally:
            torch.set_num_threads(saved)

    def close() -> None:
        if pool is not None:
            pool.shutdown()
        torch.set_num_threads(saved)

    return _Stages(run, close)


def _stages_torch(device: torch.device, dtype: torch.dtype) -> _Stages:
    """The same rates with torch ops on an accelerator (the engine's non-CPU path)."""
    gen = torch.Generator(device="cpu").manual_seed(0)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def rand(*shape: int, dt: torch.dtype = dtype) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=dt).to(device)

    def spd(big_d: int) -> torch.Tensor:
        a = rand(big_d, 64, dt=torch.float64)
        m = a @ a.T
        m.diagonal().add_(float(big_d))
        return m

    def small(rc: int) -> float:
        n = 32768
        et, t = rand(n, rc, rc), rand(n, rc, 2 * rc)
        g = torch.eye(rc, dtype=dtype, device=device).expand(n, rc, rc).contiguous()

        def step() -> None:
            wz = torch.bmm(et, t)
            w = wz[:, :, :rc]
            gg = g + 1e-6 * torch.bmm(w, w.transpose(1, 2))
            hh = torch.bmm(w, wz[:, :, rc:].transpose(1, 2))
            trace_solve_scores(gg, hh, 1.0, half_h=True)

        return n * small_flops(rc, rc) / _best(step, 3, sync)

    mats: dict[str, torch.Tensor] = {}

    def pmat() -> torch.Tensor:
        if "p" not in mats:
            mats["p"] = rand(4096, 4096, dt=torch.float64)
        return mats["p"]

    def run(name: str) -> float:
        if name == "gemm":
            m, d, cols = 65536, 256, 512
            a, b = rand(m, d), rand(d, cols)
            return m * d * cols / _best(lambda: a @ b, 3, sync)
        if name == "dense":
            return _dense_rate(spd, sync, 2048)
        if name == "small_lo":
            return small(SMALL_RC[0])
        if name == "small_hi":
            return small(SMALL_RC[1])
        if name == "rank1":
            rows = max(1, 4 * RANK1_BYTES // (RANK1_D * torch.finfo(dtype).bits // 8))
            x = rand(rows, RANK1_D)
            one = torch.ones((rows, 1, 1), dtype=torch.float64, device=device)
            g, h = one.clone(), one.clone()
            b = rand(RANK1_D, 2, dt=torch.float64)

            def step() -> None:
                rank_one_update(x, one, g, h, b, 1e-9)
                trace_solve_scores(g, h, 1.0)

            return rows * RANK1_D * torch.finfo(dtype).bits // 8 / _best(step, 3, sync)
        p = pmat()
        if name == "matrix":
            u = rand(4096, 32, dt=torch.float64)
            return 4096 * 4096 * 32 / _best(lambda: p.addmm_(u, u.T, alpha=-1e-9), 3, sync)
        xv = rand(64, dt=torch.float64)
        return 4096 * 4096 * 8 / _best(lambda: block_matvec(p, xv), 3, sync)

    return _Stages(run, lambda: None)

"""The plan of a BAIT call: what to run within the time and memory budgets, and what it costs.

**Cost model.** :func:`estimate_phases` counts multiply-adds (and bytes, for streaming work) of the
structured engine's setup, forward and backward steps and divides by the rates of this machine
(:func:`selection.calibrate.machine_rates`: a microbenchmark per device, dtype and thread count, cached
per process; ``BAIT_RATES=table`` for the committed table); memory is :func:`estimate_bytes`.

**The plan.** ``approx=None`` ("auto", :func:`_plan`) keeps exact BAIT whenever it fits the time and
memory budgets, and otherwise runs the plan of smallest estimated gap that fits, over pre-filtering,
PCA dimensions, class approximations (top-``c``; top-``c`` plus sampled pseudo-labels: the factors of
:mod:`selection.bait.approx`) and forward-only picking (docs/algorithm-many-classes.md). Forced kinds
(``approx="exact"``, ``"pca"``, ...) run as asked. The plan, what it gave up and its estimate are recorded
in the diagnostics (:meth:`_Plan.describe`).
"""

from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from selection.bait.approx import Prefilter, auto_classes, class_fisher_kept_many
from selection.bait.engine import Mode
from selection.bait.threads import resolve_threads
from selection.calibrate import Rates, factor, machine_rates, rank1_rate, small_flops, step_kind
from selection.errors import MemoryBudgetError, ParameterError
from selection.fisher import kron_sum, reduced_rank
from selection.problem import Problem

Tensor = torch.Tensor

APPROXIMATIONS = ("pca", "topc", "pca+topc", "sampled", "pca+sampled")
#: Values of ``approx``: ``None``/``"auto"`` (exact when it fits ``time_budget_s`` and ``max_memory_gb``,
#: else the cheapest plan of this module that does), ``"exact"``/``"none"`` (forced), or a forced
#: approximation.
APPROX_CHOICES = (None, "auto", "exact", "none", *APPROXIMATIONS)
#: Default ``time_budget_s`` of the cost model (seconds, estimated by :func:`estimate_phases`). The model's
#: rates are a quiet machine's: on the 2 shared benchmark cores runs took 1.5-3x its estimates, so 60 s
#: keeps the default plan of the issue's large shapes (k = 100, d = 512, n = 20,000; 10^6 x 768) within
#: minutes, while exact BAIT stays the plan of every shape the README's speed rows use up to n = 10^5,
#: d = 128 (600 s let k = 100 plans run for 10-20 minutes).
DEFAULT_TIME_BUDGET_S = 60.0
#: The auto plan prefers exact BAIT on a pre-filtered pool and/or top-c classes over a PCA projection
#: while their estimate is at most this factor over ``time_budget_s`` (see :func:`_plan`).
PCA_TIME_SLACK = 1.2


_GB = 1e9
#: Auto pre-filtering is considered only for more candidates than this.
PREFILTER_MIN_CANDIDATES = 50_000
#: Auto pre-filtering keeps at least this many candidates (top + random).
PREFILTER_MIN_KEEP = 10_000
#: Fraction of the kept candidates taken by score under auto pre-filtering (the rest is random).
PREFILTER_TOP_FRACTION = 0.75
#: Seconds per Python-level torch op of the setup (block rows, block copies) and fixed seconds of a
#: setup (thread pools, class factors, small allocations), on the 2-core benchmark machine.
SETUP_OP_S = 3e-5
SETUP_FIXED_S = 0.02
#: Smallest PCA dimension the auto ladder goes down to.
PCA_MIN_DIM = 8


def check_time_budget(value: Any) -> float:
    """``time_budget_s`` as a float; :class:`ParameterError` unless a finite number > 0."""
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value <= 0:
        raise ParameterError(f"time_budget_s must be a finite number > 0, got {value!r}")
    return float(value)


def check_memory_budget(max_memory_gb: float) -> float:
    """``max_memory_gb`` as a float; :class:`ParameterError` unless a finite number > 0."""
    ok = isinstance(max_memory_gb, int | float) and not isinstance(max_memory_gb, bool)
    if not ok or not math.isfinite(max_memory_gb) or max_memory_gb <= 0:
        raise ParameterError(f"max_memory_gb must be a finite number > 0, got {max_memory_gb!r}")
    return float(max_memory_gb)


def estimate_bytes(
    *,
    n_cand: int,
    d: int,
    r: int,
    matrix_dtype: torch.dtype,
    state_dtype: torch.dtype,
    mode: Mode,
    rc: int | None = None,
) -> int:
    """Peak bytes of the exact method: ``D x D`` matrices plus the per-candidate state.

    Setup holds ``F``, ``P``, ``Q`` and one ``D x D`` temporary (Cholesky or product); with a state
    dtype narrower than the matrix dtype, casts of ``P`` and ``Q`` are held while forming ``g``/``h``.
    """
    big_d = r * d
    mb = torch.finfo(matrix_dtype).bits // 8
    sb = torch.finfo(state_dtype).bits // 8
    n_mats = 2 if mode == "logdet" else 4
    mats = n_mats * big_d * big_d * mb
    if sb != mb:
        mats += (1 if mode == "logdet" else 2) * big_d * big_d * sb
    rc = r if rc is None else rc
    per_cand = (d + r * rc + (1 if mode == "logdet" else 2) * rc * rc) * sb
    if r == 1:
        per_cand += 3 * 8  # float64 state (rank one)
    return int(mats + n_cand * per_cand)


def _choose_matrix_dtype(
    problem: Problem, x_dim: int, r: int, mode: Mode, budget_gb: float, *, rc: int | None = None
) -> torch.dtype:
    """float64 for the ``D x D`` matrices when they fit the budget, else the input dtype, else raise."""
    n_cand = int(problem.candidates.numel())
    options = [torch.float64] if problem.dtype == torch.float64 else [torch.float64, problem.dtype]
    need = 0
    for dt in options:
        need = estimate_bytes(n_cand=n_cand, d=x_dim, r=r, matrix_dtype=dt, state_dtype=problem.dtype, mode=mode, rc=rc)
        if need <= budget_gb * _GB:
            return dt
    # Largest projected dimension that would fit (float matrices of the input dtype).
    fit = 0
    for dim in range(x_dim, 0, -1):
        est = estimate_bytes(
            n_cand=n_cand, d=dim, r=r, matrix_dtype=options[-1], state_dtype=problem.dtype, mode=mode, rc=rc
        )
        if est <= budget_gb * _GB:
            fit = dim
            break
    hint = (
        f"use the approximation approx='pca' with approx_dim <= {fit}"
        if fit > 0
        else "the per-candidate state alone exceeds the budget; use approx='pca' with a small approx_dim "
        "or a smaller pool"
    )
    raise MemoryBudgetError(
        f"exact BAIT needs about {need / _GB:.1f} GB for its {r * x_dim} x {r * x_dim} matrices "
        f"(k-1={r}, d={x_dim}) and per-candidate state, more than max_memory_gb={budget_gb:g}; "
        f"{hint}, or raise max_memory_gb."
    )


# --------------------------------------------------------------------------------------------------
# Cost model
# --------------------------------------------------------------------------------------------------


def estimate_phases(
    *,
    n_rows: int,
    n_cand: int,
    d: int,
    r: int,
    rc: int,
    n_forward: int,
    n_backward: int,
    n_design: int,
    mode: str,
    device: torch.device,
    dtype: torch.dtype,
    pca_from: int | None = None,
    n_pool: int | None = None,
    objective: bool = False,
    threads: int | None = None,
    rates: Rates | None = None,
) -> dict[str, float]:
    """Estimated seconds per phase of the structured engine: multiply-add counts over measured rates.

    Args:
        n_rows: rows of the pool Fisher (all rows, or the design plus kept rows when pre-filtered).
        n_cand: candidates.
        d: embedding dimension the engine sees (after any projection).
        r: reduced class count (``k - 1``, 1 for regression).
        rc: columns of each candidate's factor (``c + s`` under a class approximation, else ``r``).
        n_forward: forward steps.
        n_backward: backward steps.
        n_design: labeled + reserved rows.
        mode: ``"fisher"``, ``"identity"`` or ``"logdet"``.
        device: where it runs.
        dtype: dtype of the pool-sized work.
        pca_from: original dimension when projecting (adds the PCA pass over ``n_pool`` rows).
        n_pool: rows of the whole pool (default ``n_rows``).
        objective: add the exact objective of the final set over the whole pool (approximate plans).
        threads: worker threads on CPU (default :func:`selection.bait.threads.resolve_threads`).
        rates: the rates (default :func:`selection.calibrate.machine_rates` of the device, dtype, threads).

    Returns:
        ``{"setup", "forward", "backward", "objective"}`` seconds.
    """
    n_threads = resolve_threads(device) if threads is None else max(1, threads)
    if device.type != "cpu":
        n_threads = 1
    rt = rates if rates is not None else machine_rates(device, dtype, n_threads)
    gemm = rt.gemm
    small = rt.small(rc)
    mat = rt.matrix
    n_pool = n_rows if n_pool is None else n_pool
    big_d = r * d
    half = big_d * big_d * (r + 1) / (2 * r)  # quadratic forms over the upper block triangle
    itemsize = torch.finfo(dtype).bits // 8 if r > 1 else 8
    # Rows whose r x r blocks of x x^T the setup forms: F's (n_rows), M_0's (the design, dense path),
    # h's and (dense P_0) g's (n_cand each).
    setup = 0.0
    kron_rows = 0
    if mode == "fisher":
        setup += n_rows * half  # F
        kron_rows += n_rows
    if mode != "logdet":
        setup += n_cand * half  # h
        kron_rows += n_cand
    big = 0.0  # D^3 work of the setup (float64, on the calling thread)
    if n_design > 0:
        m_prime = n_design * r
        if 2 * m_prime < big_d:
            setup += big_d * big_d * m_prime * 2 + n_cand * (n_design * d + n_design**2 * r * (r + 1) / 2)
        else:
            # M_0 over the design rows, its Cholesky (D^3/3), inverse (2 D^3/3) and Q_0 = P_0 F P_0
            # (two D x D GEMMs, 2 D^3).
            setup += n_design * half
            kron_rows += n_design
            big += (3 if mode == "fisher" else 1) * big_d**3
            g_dense = half <= n_design * d + n_design**2 * r * (r + 1) / 2
            setup += n_cand * (half if g_dense else n_design * d + n_design**2 * r * (r + 1) / 2)
            kron_rows += n_cand if g_dense else 0
    if pca_from is not None:
        setup += n_pool * pca_from * (pca_from + d)
    # E^T G E for g and h: batched small products (r x r by r x rc), at a quarter of the GEMM rate.
    setup_small = n_cand * 2 * (r * r * rc + r * rc * rc) * (1 if mode == "logdet" else 2)
    # The block forms are bound by memory at small d: per row, r(r+1)/2 blocks of d values are written,
    # read, multiplied and reduced (~4 passes; d = 8, k = 100: 10x the GEMM time at the measured rates).
    setup_bytes = kron_rows * (r * (r + 1) / 2) * d * 4 * itemsize + 3 * big_d * big_d * 8
    # Python-level ops: r block rows per cache-sized sub-block of rows (F, h, g), r^2/2 block copies.
    sub_blocks = math.ceil(kron_rows * big_d * itemsize / 2**24) + 3
    setup_ops = r * sub_blocks + r * r / 2
    setup_s = setup / gemm + big / rt.dense_rate + 4 * setup_small / gemm + setup_bytes / rt.stream
    kind = step_kind(r, rc)
    setup_f = 1.0 if rates is not None else factor(device, dtype, n_threads, phase="setup", kind=kind)
    greedy_f = 1.0 if rates is not None else factor(device, dtype, n_threads, phase="greedy", kind=kind)
    setup_s = (setup_s + setup_ops * SETUP_OP_S + SETUP_FIXED_S) * setup_f
    cols = 2 if mode != "logdet" else 1
    mb = 8.0  # D x D matrices in float64 when they fit (the usual case)
    step_gemm = n_cand * d * r * cols * rc
    step_small = n_cand * small_flops(r, rc, cols)
    # D x D work of a step: block matvecs of P (and Q), one streaming read each, and the rank-rc (P)
    # and rank-2rc (Q) corrections.
    step_mats = cols * big_d * big_d * mb / rt.stream + (1 + 2 * (cols - 1)) * big_d * big_d * rc / mat
    step_fixed = 1e-3  # per-step Python and thread hand-offs
    per_step = step_gemm / gemm + step_small / small + step_mats + step_fixed
    if r == 1:
        # Rank one (regression, binary): a step is a GEMV over the candidates' rows and a few float64
        # vector passes, bound by reading X from memory, not by multiply-adds: the measured rank1 rate
        # (bytes of X per second of that very step; 10^6 x 64 float32: ~30 ms a step, one core busy).
        r1 = rt.rank1_rate if rates is not None else rank1_rate(device, dtype, n_threads, d)
        per_step = n_cand * d * (torch.finfo(dtype).bits // 8) / r1 + step_mats + step_fixed
    per_step *= greedy_f
    fwd = n_forward * per_step
    bwd = 0.0
    if n_backward > 0:
        m = n_forward
        span = m * rc
        if span < big_d and mode != "logdet":
            # Pruning in the picks' span: two Gram matrices, then 3 span^2 rc per removal.
            bwd = 2 * (big_d * big_d * m + big_d * m * span) / gemm + n_backward * (3 * span * span * rc / mat)
        else:
            bwd = n_backward * (m * (d * r * cols * rc + small_flops(r, rc, cols)) / small + step_mats)
        bwd += n_backward * step_fixed
    obj = 0.0
    if objective:
        obj = n_pool * half / gemm + 2 * big_d**3 / mat
    return {"setup": setup_s, "forward": fwd, "backward": bwd, "objective": obj}


def estimate_seconds(**kwargs: Any) -> float:
    """Total of :func:`estimate_phases` (same arguments)."""
    return float(sum(estimate_phases(**kwargs).values()))


def ladder_dims(d: int) -> list[int]:
    """PCA dimensions the auto plan tries, largest first: ``d/2, d/4, ...`` down to :data:`PCA_MIN_DIM`."""
    out = []
    dim = d // 2
    while dim >= PCA_MIN_DIM:
        out.append(dim)
        dim //= 2
    if not out and d > 1:
        out.append(max(1, d // 2))
    return out


def ladder_prefilter(n_cand: int) -> list[int]:
    """Kept-candidate counts the auto plan tries: ``n_C/2, n_C/4, ...`` down to :data:`PREFILTER_MIN_KEEP`."""
    out = []
    keep = n_cand // 2
    while keep >= PREFILTER_MIN_KEEP:
        out.append(keep)
        keep //= 2
    if not out or out[-1] > PREFILTER_MIN_KEEP:
        out.append(min(PREFILTER_MIN_KEEP, n_cand))
    return out


#: Pool rows on which the exact objective's pass is timed before it is run over a larger pool.
OBJECTIVE_PILOT_ROWS = 1024
#: The pilot runs only on pools of more than this many times OBJECTIVE_PILOT_ROWS (it costs that fraction of
#: the whole pass; on smaller pools the multiply-add model alone decides).
OBJECTIVE_PILOT_MIN_FACTOR = 16


def _objective_seconds(problem: Problem, r: int, mode: Mode, within: float | None = None) -> float:
    """Estimated seconds of :func:`selection.fisher.exact_objective` over the whole pool.

    The cost model counts the pass's multiply-adds, but the pass is bound by memory traffic and per-block
    work well above that count (10^6 x 64, k = 10 on the 2-core box: 159 s where the model said ~6 s). So,
    unless the model alone already rules the pass out (more than ``within`` seconds) or the pool is small,
    the pass is also timed on its first :data:`OBJECTIVE_PILOT_ROWS` rows and scaled to the pool; the
    larger of the two is returned (the pilot costs ``OBJECTIVE_PILOT_ROWS / n`` of the whole pass).
    """
    model = _modelled_objective_seconds(problem, r, mode)
    if (
        mode == "identity"
        or problem.n <= OBJECTIVE_PILOT_MIN_FACTOR * OBJECTIVE_PILOT_ROWS  # the pilot would be a large part
        or (within is not None and (model > within or math.isinf(within)))  # ruled out, or anything goes
    ):
        return model
    rows = slice(0, OBJECTIVE_PILOT_ROWS)
    t0 = time.perf_counter()
    kron_sum(
        problem.X[rows],
        None if problem.probs is None else problem.probs[rows],
        None,
        out_dtype=torch.float64,
        chunk_size=problem.chunk_size,
    )
    pilot = (time.perf_counter() - t0) * problem.n / OBJECTIVE_PILOT_ROWS
    return max(model, pilot)


def _modelled_objective_seconds(problem: Problem, r: int, mode: Mode) -> float:
    """:func:`_objective_seconds` from the cost model alone."""
    return estimate_phases(
        n_rows=problem.n,
        n_cand=0,
        d=problem.d,
        r=r,
        rc=r,
        n_forward=0,
        n_backward=0,
        n_design=0,
        mode=mode,
        device=problem.device,
        # The pool dtype's rates (no second microbenchmark): kron_sum runs its GEMMs in float64 at
        # about half the float32 rate, counted below.
        dtype=problem.dtype,
        objective=True,
        threads=resolve_threads(problem.device),
    )["objective"] * (2.0 if problem.dtype == torch.float32 else 1.0)


# --------------------------------------------------------------------------------------------------
# The plan
# --------------------------------------------------------------------------------------------------


@dataclass
class _Plan:
    """What the driver runs: exact, or an approximation, on the whole pool or a pre-filtered one."""

    kind: str  # "exact", "pca", "topc", "pca+topc"
    dim: int | None = None  # PCA dimension (None: no projection)
    classes: int | None = None  # top-c classes (None: all)
    prefilter: Prefilter | None = None
    reason: str = ""
    estimated_s: float = 0.0
    estimated_bytes: int = 0
    samples: int = 0  # pseudo-labels drawn from the rest per candidate (with classes; 0: plain top-c)
    oversample: float | None = None  # forward picks per batch slot when the plan changes it (auto: 1)
    objective: bool = False  # compute the exact objective of the set afterwards (approximate plans)
    estimated_gap: float | None = None  # the gap model's estimate (auto plans)
    gave_up: list[str] = field(default_factory=list)
    estimated_setup_s: float = 0.0  # the setup's part of estimated_s (with the PCA projection)
    estimated_greedy_s: float = 0.0  # the greedy passes' part (the rest: the exact objective)
    step_kind: str = "full"  # selection.calibrate.step_kind of the plan's greedy step

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind}
        if self.dim is not None:
            out["pca_dim"] = self.dim
        if self.classes is not None:
            out["classes"] = self.classes
            if self.samples:
                out["samples"] = self.samples
        if self.prefilter is not None:
            out["prefilter"] = self.prefilter.describe()
        if self.oversample is not None:
            out["oversample"] = self.oversample
        out["reason"] = self.reason
        if self.estimated_gap is not None:
            out["estimated_gap"] = float(f"{self.estimated_gap:.3g}")
            out["gave_up"] = list(self.gave_up)
        out["estimated_seconds"] = float(f"{self.estimated_s:.3g}")
        out["estimated_setup_seconds"] = float(f"{self.estimated_setup_s:.3g}")
        out["estimated_gb"] = float(f"{self.estimated_bytes / _GB:.3g}")
        return out


def _check_approx(
    approx: str | None,
    approx_dim: int | None,
    approx_classes: int | None,
    problem: Problem,
    approx_samples: int | None = None,
) -> str:
    """The requested approximation kind: ``"auto"``, ``"exact"`` or one of :data:`APPROXIMATIONS`."""
    if approx is None or approx == "auto":
        kind = "auto"
    elif approx in ("exact", "none"):
        kind = "exact"
    elif approx in APPROXIMATIONS:
        kind = str(approx)
    else:
        raise ParameterError(f"unknown approx {approx!r}; expected one of {APPROX_CHOICES}")
    d = problem.d
    if approx_dim is not None:
        if kind not in ("auto", "pca", "pca+topc", "pca+sampled"):
            raise ParameterError("approx_dim is only used with approx='pca', 'pca+topc' or 'pca+sampled' (or auto)")
        if isinstance(approx_dim, bool) or not isinstance(approx_dim, int) or not 1 <= approx_dim <= d:
            raise ParameterError(f"approx_dim must be an integer in [1, d={d}], got {approx_dim!r}")
    if approx_classes is not None:
        if kind not in ("auto", "topc", "pca+topc", "sampled", "pca+sampled"):
            raise ParameterError("approx_classes is only used with approx='topc' or 'pca+topc' (or auto)")
        if problem.probs is None:
            raise ParameterError("approx_classes needs class probabilities (classification)")
        k = problem.k
        low = 0 if kind in ("sampled", "pca+sampled") else 1
        bad = isinstance(approx_classes, bool) or not isinstance(approx_classes, int)
        if bad or not low <= approx_classes < k:
            raise ParameterError(f"approx_classes must be an integer in [{low}, k-1={k - 1}], got {approx_classes!r}")
    if approx_samples is not None:
        if kind not in ("sampled", "pca+sampled"):
            raise ParameterError("approx_samples is only used with approx='sampled' or 'pca+sampled'")
        if problem.probs is None:
            raise ParameterError("approx_samples needs class probabilities (classification)")
        bad = isinstance(approx_samples, bool) or not isinstance(approx_samples, int)
        if bad or not 1 <= approx_samples < problem.k:
            raise ParameterError(
                f"approx_samples must be an integer in [1, k-1={problem.k - 1}], got {approx_samples!r}"
            )
    if kind in ("topc", "pca+topc", "sampled", "pca+sampled") and problem.probs is None:
        raise ParameterError(f"approx={kind!r} truncates classes and needs class probabilities (classification)")
    return kind


#: Rough objective gaps per unit of what a plan gives up, to rank plans (the estimated gap in the
#: diagnostics): measured on synthetic pools at lam = 0.01 (docs/algorithm-many-classes.md). A halving
#: of the candidates by the pre-filter (below PREFILTER_MIN_KEEP or on pools under
#: PREFILTER_MIN_CANDIDATES; above, pre-filtering is free: 10^6 -> 10^4 rows cost 1.3 %), the
#: fraction of the Fisher-weighted embedding variance a projection drops, the fraction of the class
#: Fisher's trace outside the top rc classes of a candidate (k = 100, flat head: 50 / 35 / 21 / 9 %
#: outside the top 4 / 8 / 16 / 32 gave gaps of 15 / 10 / 5 / 0.5-3.5 %), and forward-only picking.
GAP_PER_PREFILTER_HALVING = 0.004
GAP_PER_PCA_VARIANCE = 1.0
GAP_PER_CLASS_FISHER = 0.3
GAP_FORWARD_ONLY = 0.01
#: Per-candidate ranks (top + sampled columns) the auto plan tries when the top-c mass rule keeps more.
SAMPLED_RANKS = (48, 32, 24, 16, 12, 8, 6, 4)
#: Default rank of approx="sampled" / "pca+sampled" when approx_classes / approx_samples are not given.
SAMPLED_DEFAULT_RANK = 16
#: The auto plan's hard guard: the greedy passes stop (and the batch is completed cheaply) so that the
#: call returns by this factor times time_budget_s (the promise is 1.5x; the rest is the fill and return).
GUARD_FACTOR = 1.35
#: Smallest candidate count the auto pre-filter goes down to on pools below PREFILTER_MIN_CANDIDATES
#: (times the forward picks, at least).
PREFILTER_FLOOR = 256


def _sampled_split(rank: int, r: int) -> tuple[int, int]:
    """``(top, sampled)`` columns for a per-candidate rank: three quarters exact top classes, the rest sampled."""
    top = min(r - 1, (3 * rank) // 4)
    return top, max(1, min(rank, r) - top)


class _Planner:
    """What every candidate plan of one call shares, and the estimate of one plan (:meth:`make`)."""

    def __init__(
        self,
        problem: Problem,
        *,
        mode: Mode,
        oversample: float,
        backward: bool,
        budget_gb: float,
        time_budget_s: float,
    ) -> None:
        self.problem = problem
        self.mode: Mode = mode
        self.oversample = oversample
        self.backward = backward
        self.budget_gb = budget_gb
        self.time_budget_s = time_budget_s
        self.r = reduced_rank(problem.probs)
        self.b = problem.batch_size
        self.n_design = int(problem.in_design.numel())
        self.n_cand_all = int(problem.candidates.numel())
        self.d = problem.d
        self.dtypes = [torch.float64] if problem.dtype == torch.float64 else [torch.float64, problem.dtype]
        self.threads = resolve_threads(problem.device)

    @functools.cached_property
    def objective_ok(self) -> bool:
        """Whether the exact objective of an approximate plan's set is computed afterwards: when it fits memory
        and a quarter of the time budget (else the approximate one is reported). Asked only once an approximate
        plan is costed: an exact plan that fits never pays for the estimate (its pilot pass over 1,024 rows took
        3.3 s of a 9.4 s k = 26 call, n = 5,000, where the whole call took 6.2 s before it)."""
        if self.mode == "logdet":
            return False
        mem = (
            estimate_bytes(
                n_cand=0, d=self.d, r=self.r, matrix_dtype=torch.float64, state_dtype=torch.float64, mode=self.mode
            )
            <= self.budget_gb * _GB
        )
        if not mem:
            return False
        within = 0.25 * self.time_budget_s
        return _objective_seconds(self.problem, self.r, self.mode, within=within) <= within

    def cost(
        self, n_keep: int, rows: int, dim: int, rc: int, ov: float, approximate: bool
    ) -> tuple[dict[str, float], int, bool]:
        """``(seconds per phase, bytes, exact objective afterwards)`` of a plan on ``n_keep`` candidates, ``rows``
        rows (phases: :func:`estimate_phases`)."""
        problem, b = self.problem, self.b
        n_fwd = b if not self.backward else min(n_keep, max(b, math.floor(ov * b + 1e-9)))
        obj = approximate and self.objective_ok
        phases = estimate_phases(
            n_rows=rows,
            n_cand=n_keep,
            d=dim,
            r=self.r,
            rc=rc,
            n_forward=n_fwd,
            n_backward=(n_fwd - b) if self.backward else 0,
            n_design=self.n_design,
            mode=self.mode,
            device=problem.device,
            dtype=problem.dtype,
            pca_from=self.d if dim != self.d else None,
            n_pool=problem.n,
            objective=obj,
            threads=self.threads,
        )
        mem = min(
            estimate_bytes(
                n_cand=n_keep, d=dim, r=self.r, matrix_dtype=dt, state_dtype=problem.dtype, mode=self.mode, rc=rc
            )
            for dt in self.dtypes
        )
        return phases, mem, obj

    def make(
        self,
        kind: str,
        dim: int | None,
        classes: int | None,
        pf: Prefilter | None,
        reason: str,
        samples: int = 0,
        ov: float | None = None,
    ) -> _Plan:
        """A plan with its estimate (``dim``/``classes``/``pf``/``ov`` ``None``: that knob untouched)."""
        n_keep = self.n_cand_all if pf is None else min(self.n_cand_all, pf.top + pf.random)
        rows = self.problem.n if pf is None else self.n_design + n_keep
        rc = self.r if classes is None else classes + samples
        approximate = dim is not None or classes is not None or pf is not None
        ov_run = self.oversample if ov is None else ov
        phases, mem, obj = self.cost(n_keep, rows, self.d if dim is None else dim, rc, ov_run, approximate)
        plan = _Plan(kind, dim, classes, pf, reason, float(sum(phases.values())), mem, samples=samples)
        plan.estimated_setup_s = phases["setup"]
        plan.estimated_greedy_s = phases["forward"] + phases["backward"]
        plan.step_kind = step_kind(self.r, rc)
        plan.oversample = ov
        plan.objective = obj
        return plan

    def in_memory(self, p: _Plan) -> bool:
        return p.estimated_bytes <= self.budget_gb * _GB

    def fits(self, p: _Plan) -> bool:
        return self.in_memory(p) and p.estimated_s <= self.time_budget_s


def _plan(
    problem: Problem,
    *,
    kind: str,
    approx_dim: int | None,
    approx_classes: int | None,
    prefilter: Prefilter | str | None,
    mode: Mode,
    oversample: float,
    backward: bool,
    budget_gb: float,
    time_budget_s: float,
    lam: float,
    approx_samples: int | None = None,
) -> _Plan:
    """Choose what to run: forced kinds as asked (:func:`_forced_plan`), auto by cost (:func:`_auto_plan`).

    Args:
        problem: the validated pool (``X`` is ``(n, d)``, ``probs`` ``(n, k)`` or ``None``).
        kind: ``"auto"``, ``"exact"`` or one of :data:`APPROXIMATIONS` (from :func:`_check_approx`).
        approx_dim: the PCA dimension asked for, or ``None``.
        approx_classes: the top classes asked for, or ``None``.
        prefilter: a :class:`Prefilter` (forced), ``"auto"`` or ``None`` (from
            :func:`selection.bait.approx.parse_prefilter`).
        mode: ``"fisher"``, ``"identity"`` or ``"logdet"``.
        oversample: forward picks per batch slot.
        backward: whether the run prunes backward.
        budget_gb: ``max_memory_gb``.
        time_budget_s: seconds the plan's estimate must fit.
        lam: the ridge (the auto top-c rule depends on it).
        approx_samples: pseudo-labels per candidate asked for, or ``None``.

    Returns:
        The plan; auto plans carry their estimated gap and what they gave up.

    Raises:
        ParameterError: a forced pre-filter keeps fewer candidates than the batch, or a forced class
            approximation asks for more columns than ``k - 1``.
        MemoryBudgetError: no auto plan fits ``budget_gb``.
    """
    planner = _Planner(
        problem, mode=mode, oversample=oversample, backward=backward, budget_gb=budget_gb, time_budget_s=time_budget_s
    )
    explicit = prefilter if isinstance(prefilter, Prefilter) else None
    n_cand_all, b = planner.n_cand_all, planner.b
    if explicit is not None and min(n_cand_all, explicit.top + explicit.random) < b:
        raise ParameterError(
            f"prefilter keeps {min(n_cand_all, explicit.top + explicit.random)} candidates, fewer than "
            f"batch_size={b}; raise 'top' or 'random'"
        )
    if kind == "exact":
        return planner.make("exact", None, None, explicit, "forced (approx='exact')")
    if kind in ("pca", "pca+topc", "topc", "sampled", "pca+sampled"):
        return _forced_plan(planner, kind, explicit, approx_dim, approx_classes, approx_samples, lam)
    return _auto_plan(planner, explicit, prefilter == "auto", approx_dim, approx_classes, lam)


def _forced_plan(
    planner: _Planner,
    kind: str,
    explicit: Prefilter | None,
    approx_dim: int | None,
    approx_classes: int | None,
    approx_samples: int | None,
    lam: float,
) -> _Plan:
    """A forced approximation: its classes (top-c by the mass rule, or top + sampled) and PCA dimension."""
    probs, r, d = planner.problem.probs, planner.r, planner.d
    classes = None
    samples = 0
    if kind in ("topc", "pca+topc") and probs is not None:
        classes = approx_classes if approx_classes is not None else auto_classes(probs, lam=lam)
    if kind in ("sampled", "pca+sampled"):
        top, samples = _sampled_split(min(SAMPLED_DEFAULT_RANK, r), r)
        classes = approx_classes if approx_classes is not None else top
        if approx_samples is not None:
            samples = approx_samples
        elif classes + samples > r:
            samples = max(1, r - classes)
        if classes + samples > r or samples < 1:
            raise ParameterError(
                f"approx_classes + approx_samples must be at most k-1={r} (with approx_samples >= 1), "
                f"got {classes} + {samples}"
            )
    dim = None
    if kind.startswith("pca"):
        if approx_dim is None:
            # Default d // 4, shrunk until the exact method on the projection fits the memory budget.
            dim = max(1, d // 4)
            while dim > 1 and not planner.in_memory(planner.make(kind, dim, classes, explicit, "", samples)):
                dim -= 1
        else:
            dim = approx_dim
    return planner.make(kind, dim, classes, explicit, f"forced (approx={kind!r})", samples)


@dataclass
class _Knobs:
    """The auto plan's options per knob, each with its estimated gap (and why, for the pre-filter)."""

    prefilters: list[tuple[Prefilter | None, float, str]]
    dims: list[tuple[int, float]]
    classes: list[tuple[int | None, int, float]]  # (top classes, samples, gap)
    oversamples: list[tuple[float, float]]
    variance_kept: dict[int, float]  # per PCA dimension
    class_kept: dict[int, float]  # per per-candidate rank


def _auto_knobs(
    planner: _Planner,
    explicit: Prefilter | None,
    auto_prefilter: bool,
    approx_dim: int | None,
    approx_classes: int | None,
    lam: float,
) -> _Knobs:
    """The pre-filters, PCA dimensions, class approximations and oversampling the auto plan combines."""
    problem, r, d, b = planner.problem, planner.r, planner.d, planner.b
    n_cand_all, oversample = planner.n_cand_all, planner.oversample
    pf_opts: list[tuple[Prefilter | None, float, str]] = [(explicit, 0.0, "")]
    n_fwd_max = min(n_cand_all, max(b, math.floor(oversample * b + 1e-9)))
    if auto_prefilter:
        big_pool = n_cand_all > PREFILTER_MIN_CANDIDATES
        keeps = ladder_prefilter(n_cand_all) if big_pool else []
        floor = max(PREFILTER_FLOOR, 4 * n_fwd_max)
        keep = (keeps[-1] if keeps else n_cand_all) // 2
        while keep >= floor:
            keeps.append(keep)
            keep //= 2
        for i, keep in enumerate(keeps):
            halvings = math.log2(n_cand_all / keep)
            free = big_pool and keep >= PREFILTER_MIN_KEEP
            # Free halvings still rank below no pre-filter, larger keeps first.
            gap = 1e-6 * (i + 1) if free else GAP_PER_PREFILTER_HALVING * halvings
            n_top = round(PREFILTER_TOP_FRACTION * keep)
            pf_opts.append(
                (Prefilter(top=n_top, random=keep - n_top, score="gradnorm"), gap, f"pre-filtered to {keep} candidates")
            )
    dims = [d, *(ladder_dims(d) if approx_dim is None else [approx_dim])]
    kept = _variance_kept(problem, dims) if len(dims) > 1 else {d: 1.0}
    dim_opts = [(dim, GAP_PER_PCA_VARIANCE * (1.0 - kept[dim])) for dim in dims]
    cls_opts: list[tuple[int | None, int, float]] = [(None, 0, 0.0)]
    cls_kept: dict[int, float] = {}
    if problem.probs is not None and r > 2:
        c_auto = approx_classes if approx_classes is not None else auto_classes(problem.probs, lam=lam)
        ranks = [rank for rank in SAMPLED_RANKS if rank < min(c_auto, r)]
        cls_kept.update(class_fisher_kept_many(problem.probs, [c_auto, *ranks]))
        if c_auto < r:
            cls_opts.append((c_auto, 0, GAP_PER_CLASS_FISHER * (1 - cls_kept[c_auto])))
        for rank in ranks:
            n_top, n_smp = _sampled_split(rank, r)
            cls_opts.append((n_top, n_smp, GAP_PER_CLASS_FISHER * (1 - cls_kept[rank])))
    ov_opts = [(oversample, 0.0)]
    if planner.backward and oversample > 1:
        ov_opts.append((1.0, GAP_FORWARD_ONLY))
    return _Knobs(pf_opts, dim_opts, cls_opts, ov_opts, kept, cls_kept)


def _auto_plan(
    planner: _Planner,
    explicit: Prefilter | None,
    auto_prefilter: bool,
    approx_dim: int | None,
    approx_classes: int | None,
    lam: float,
) -> _Plan:
    """Exact when its estimate fits both budgets; else the plan of smallest estimated gap that does.

    The candidates combine a pre-filter, a PCA dimension, a class approximation (top-c by the mass rule,
    or top + sampled columns) and forward-only picking (ties: the faster). With none inside the time
    budget, the fastest that fits memory.
    """
    exact = planner.make("exact", None, None, explicit, "fits the budgets")
    exact.estimated_gap = 0.0
    if planner.fits(exact):
        return exact
    budget_gb, time_budget_s = planner.budget_gb, planner.time_budget_s
    over = (
        f"exact needs ~{exact.estimated_s:.0f} s and {exact.estimated_bytes / _GB:.2f} GB "
        f"(budgets {time_budget_s:g} s, {budget_gb:g} GB)"
    )
    knobs = _auto_knobs(planner, explicit, auto_prefilter, approx_dim, approx_classes, lam)
    d, oversample = planner.d, planner.oversample
    plans: list[_Plan] = []
    for pf_opt, g_pf, why_pf in knobs.prefilters:
        for dim, g_dim in knobs.dims:
            for c_top, smp, g_cls in knobs.classes:
                for ov, g_ov in knobs.oversamples:
                    if pf_opt is explicit and dim == d and c_top is None and ov == oversample:
                        plans.append(exact)
                        continue
                    kind_ = "exact" if c_top is None else ("sampled" if smp else "topc")
                    if dim != d:
                        kind_ = "pca" if c_top is None else f"pca+{kind_}"
                    ov_plan = None if ov == oversample else ov
                    plan = planner.make(kind_, None if dim == d else dim, c_top, pf_opt, "", smp, ov_plan)
                    plan.estimated_gap = g_pf + g_dim + g_cls + g_ov
                    plan.reason = "; ".join(x for x in (over, why_pf) if x)
                    plans.append(plan)
    in_memory = [p for p in plans if planner.in_memory(p)]
    if not in_memory:
        cheapest = min(plans, key=lambda p: p.estimated_bytes)
        raise MemoryBudgetError(
            f"no BAIT plan fits max_memory_gb={budget_gb:g}: {over}; the smallest plan tried "
            f"({cheapest.describe()}) needs {cheapest.estimated_bytes / _GB:.2f} GB. Raise max_memory_gb, force an "
            "approximation (approx='pca' with a small approx_dim, approx='topc' with approx_classes), or "
            "pre-filter the pool (prefilter={'top': N, 'random': M})."
        )
    return _gave_up(_choose(in_memory, time_budget_s), planner, explicit, knobs)


def _choose(in_memory: list[_Plan], time_budget_s: float) -> _Plan:
    """The auto plan among those that fit memory: smallest gap within the time budget, PCA as a last resort."""
    fitting = [p for p in in_memory if p.estimated_s <= time_budget_s]
    best = min(fitting, key=lambda p: (p.estimated_gap or 0.0, p.estimated_s)) if fitting else None
    if best is None or best.dim is not None:
        # A projection is a coarse loss: a plan without one, better by the gap model and within
        # PCA_TIME_SLACK of the budget, runs instead (the guard holds the time).
        no_pca = [
            p
            for p in in_memory
            if p.dim is None
            and (best is None or (p.estimated_gap or 0.0) < (best.estimated_gap or 0.0))
            and p.estimated_s <= PCA_TIME_SLACK * time_budget_s
        ]
        if no_pca:
            alt = min(no_pca, key=lambda p: (p.estimated_gap or 0.0, p.estimated_s))
            alt.reason = (
                f"{alt.reason}; est. {alt.estimated_s:.0f} s, within {PCA_TIME_SLACK:g}x the time budget: "
                "no PCA projection"
            )
            return alt
    if best is None:
        best = min(in_memory, key=lambda p: (p.estimated_s, p.estimated_gap or 0.0))
        best.reason = (
            f"{best.reason}; no plan fits the time budget: the fastest that fits memory (the guard holds the time)"
        )
    return best


def _gave_up(p: _Plan, planner: _Planner, explicit: Prefilter | None, knobs: _Knobs) -> _Plan:
    """Record in ``p.gave_up`` what the auto plan gave up against exact BAIT on the whole pool."""
    n_cand_all, d, r = planner.n_cand_all, planner.d, planner.r
    if p.prefilter is not None and p.prefilter is not explicit:
        keep = p.prefilter.top + p.prefilter.random
        p.gave_up.append(f"candidates: pre-filtered to {keep} of {n_cand_all}")
    if p.dim is not None:
        p.gave_up.append(
            f"dimensions: PCA to {p.dim} of {d} ({100 * (1 - knobs.variance_kept[p.dim]):.1f} % of the "
            "Fisher-weighted embedding variance dropped)"
        )
    if p.classes is not None:
        rank = p.classes + p.samples
        how = f"top {p.classes}" + (f" + {p.samples} sampled pseudo-labels" if p.samples else " (rest merged)")
        outside = 1 - knobs.class_kept.get(rank, 1.0)
        p.gave_up.append(
            f"classes: {how} per candidate instead of {r} ({100 * outside:.1f} % of the class Fisher "
            f"outside the top {rank} classes)"
        )
    if p.oversample is not None:
        p.gave_up.append(f"oversampling: {p.oversample:g}x forward picks instead of {planner.oversample:g}x")
    return p


def _variance_kept(problem: Problem, dims: list[int], sample: int = 4096) -> dict[int, float]:
    """Fraction of the Fisher-weighted embedding variance each PCA dimension keeps (a row subsample)."""
    step = max(1, problem.n // sample)
    x = problem.X[::step].to(torch.float64)
    w = torch.ones(x.shape[0], dtype=torch.float64, device=x.device)
    if problem.probs is not None:
        p = problem.probs[::step].to(torch.float64)
        w = 1.0 - (p * p).sum(1)
    evals = torch.linalg.eigvalsh(x.T @ (x * w[:, None])).flip(0).clamp_min(0)
    total = float(evals.sum())
    cum = evals.cumsum(0)
    return {dim: (float(cum[dim - 1]) / total if total > 0 else 1.0) for dim in dims}

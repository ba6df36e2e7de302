"""Exact BAIT (forward greedy + backward pruning) without the ``n x dk x k`` tensor, and its variants.

Implements exact fast BAIT as derived in docs/algorithm.md: per-candidate ``r x r`` matrices ``g_x = V_x^T P V_x`` and
``h_x = V_x^T Q V_x`` (``P = M^{-1}``, ``Q = P F P``) formed from ``d x d`` blocks, kept current by
symmetric square-root rank-``r`` updates with one pool GEMM per greedy step.

Conventions (pinned by tests/selection/test_bait.py):

* The last layer ``W`` is ``k x d``, vectorised class-major (index ``c * d + j``).
  ``I(x) = (diag p - p p^T) ⊗ x x^T = V_x V_x^T`` with column ``c`` of ``V_x`` equal to
  ``sqrt(p_c) (e_c - p) ⊗ x``. Regression (one output, squared loss): ``I(x) = x x^T``.
* ``F`` is the mean of ``I(x)`` over **all** ``n`` pool rows (or the ``fisher_weights``-weighted
  mean); ``bait_nofisher`` uses ``F = I``.
* ``n_L`` = number of labeled + reserved rows (:attr:`Problem.in_design`), ``B`` = batch size.
  ``M = lam I + w_L sum_{labeled+reserved} I(x) + w_S sum_{picked} I(x)`` with
  ``convention="reference"`` (the authors' code, default): ``w_L = 1/(n_L+B)``, ``w_S = B/(n_L+B)``;
  ``"paper"``: ``w_L = 1/n_L`` (0 if ``n_L = 0``), ``w_S = 1``; ``"sum"``: ``w_L = w_S = 1``.
* Forward: ``min(oversample * B, n_C)`` picks without repeats, each maximising
  ``tr(h_x (I + g_x)^{-1})`` with ``V_x`` scaled by ``sqrt(w_S)``; backward: while more than ``B``
  remain, remove the pick whose removal raises ``tr(M^{-1} F)`` least, ``tr(h_s (I - g_s)^{-1})``.
* Ties go to the lowest pool row index. Scores within ``rtol * max|score|`` of the best count as
  tied (``rtol = 1e-10`` for float64 state, ``1e-5`` for float32), so rows that are exact duplicates
  tie regardless of summation order. NaN scores lose (``-inf`` forward, ``+inf`` backward).
* The returned indices are the kept picks in forward order. ``objective`` is ``tr(M^{-1} F)`` of
  the final set in the full ``k d`` parameter space.

Work is done in the reduced class space (softmax null direction dropped, ``r = k - 1``,
``D = r d``; regression and binary classification become rank-one problems). The ``D x D`` matrices
``P`` and ``Q`` and the backward pass are float64 whenever they fit ``max_memory_gb``; pool-sized
GEMMs and the per-candidate state run in the dtype of ``problem.X``.

Planning (selection/scale.py, :func:`_plan`): ``approx=None`` ("auto") runs exact BAIT whenever a
cost model with this machine's measured rates says it fits ``time_budget_s`` and ``max_memory_gb``;
otherwise the plan of smallest estimated gap that fits, built from candidate pre-filtering, the
Fisher-weighted PCA projection, a class approximation of each candidate's Fisher (top-``c``, or
top-``c`` plus sampled pseudo-labels from the rest) and forward-only picking; a guard (:class:`_Guard`)
stops the greedy passes so the call returns within 1.5x ``time_budget_s``
(docs/algorithm-many-classes.md). ``approx="exact"`` forces exact. The plan, its reason and its estimate are
``diagnostics["approximation"]``; the objective reported for an approximate or pre-filtered run is
the exact one of its set whenever that fits the budgets (``diagnostics["objective_kind"]``).
"""

from __future__ import annotations

import functools
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from selection import fused, scale
from selection.calibrate import dense_threads, machine_rates, observe
from selection.errors import InputDataError, MemoryBudgetError, ParameterError
from selection.fisher import exact_objective, fisher_pca_basis, kron_sum, reduced_rank, row_factors
from selection.linalg import (
    accumulate_kron_upper,
    block_contract,
    block_matvec,
    block_quadratic_forms,
    logdet_scores,
    matmul,
    symmetrize_blocks,
    torch_threads,
    trace_solve_scores,
)
from selection.problem import Problem, StrategyOutput, register
from selection.scale import (
    PREFILTER_MIN_CANDIDATES,
    PREFILTER_TOP_FRACTION,
    Prefilter,
    auto_classes,
    check_time_budget,
    class_fisher_kept_many,
    estimate_phases,
    ladder_dims,
    ladder_prefilter,
    parse_prefilter,
    prefilter_candidates,
    rest_mass,
    sampled_class_factor,
)

Tensor = torch.Tensor
Mode = Literal["fisher", "identity", "logdet"]

CONVENTIONS = ("reference", "paper", "sum")
APPROXIMATIONS = ("pca", "topc", "pca+topc", "sampled", "pca+sampled")
#: Values of ``approx``: ``None``/``"auto"`` (exact when it fits ``time_budget_s`` and ``max_memory_gb``,
#: else the cheapest plan of selection/scale.py that does), ``"exact"``/``"none"`` (forced), or a forced
#: approximation.
APPROX_CHOICES = (None, "auto", "exact", "none", *APPROXIMATIONS)
#: Default ``time_budget_s`` of the cost model (seconds, estimated; see selection/scale.py). The model's
#: rates are a quiet machine's: on the 2 shared benchmark cores runs took 1.5-3x its estimates, so 60 s
#: keeps the default plan of the issue's large shapes (k = 100, d = 512, n = 20,000; 10^6 x 768) within
#: minutes, while exact BAIT stays the plan of every shape the README's speed rows use up to n = 10^5,
#: d = 128 (600 s let k = 100 plans run for 10-20 minutes).
DEFAULT_TIME_BUDGET_S = 60.0
#: The auto plan prefers exact BAIT on a pre-filtered pool and/or top-c classes over a PCA projection
#: while their estimate is at most this factor over ``time_budget_s`` (see :func:`_plan`).
PCA_TIME_SLACK = 1.2
_TIE_RTOL = {torch.float64: 1e-10, torch.float32: 1e-5}
_GB = 1e9
# Per-chunk state of the greedy step (CPU) is kept near this size. With the update in numpy
# (_update_rows_numpy) the chunk's temporaries must stay in cache: single-threaded, d = 128, k = 10,
# float32, the step cost 1,930 ns per candidate with 9,279-row chunks (16 MiB), 1,150-1,200 with
# 2,048-4,096 rows (the pool GEMM alone 883 against 412 ns).
_STEP_CHUNK_BYTES = 4 * 2**20
# The setup's Woodbury G (chunk rows x pairs x n_L temporary) keeps the earlier, larger size.
_SETUP_SUB_BYTES = 16 * 2**20
# On a GPU every op is a kernel launch costing about the same whatever its size, and at 16 MiB a
# step of n = 10^5, d = 768 was ~30 chunks of ~150 launches each: there the chunk is bounded by this
# (bench/device_agreement.py --cuda-chunk-mb compares sizes in one run).
_STEP_CHUNK_BYTES_CUDA = 1024 * 2**20
# Rows per block of the D x D work of a greedy step (block matvecs and rank updates of P and Q) on
# the worker threads; fixed, so the bits do not depend on the number of threads.
_DD_ROW_BLOCK = 128
# Number of partial sums the pool Fisher F is accumulated in (chunk i goes to partial i mod this),
# independent of the thread count so that F, and everything after it, is bitwise the same for any
# number of threads.
_F_PARTIALS = 2

#: Python threads over pool/candidate chunks on CPU: the setup's chunk loops (``F``, ``g``, ``h``)
#: and the forward greedy steps (``None``: the ``BAIT_THREADS`` environment variable if
#: set, else ``max(torch.get_num_threads(), min(2, os.cpu_count()))``). Each chunk is processed by
#: one thread exactly as it would be serially, so picks and state do not depend on the thread count.
#: While the threads run, torch's intra-op threads are set to 1 (restored afterwards): batched small
#: matrix ops were 3-4x slower with intra-op threads than with one thread per chunk.
THREADS: int | None = None


def resolve_threads(device: torch.device) -> int:
    """Number of Python worker threads the exact engine uses on ``device`` (1 off CPU)."""
    if device.type != "cpu":
        return 1
    if THREADS is not None:
        return max(1, int(THREADS))
    env = os.environ.get("BAIT_THREADS", "").strip()
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise ParameterError(f"BAIT_THREADS must be an integer, got {env!r}") from None
    return max(torch.get_num_threads(), min(2, os.cpu_count() or 1))


def _legacy_step() -> bool:
    """``BAIT_STEP=legacy``: the previous per-candidate update (torch.bmm), for same-run benchmarks."""
    return os.environ.get("BAIT_STEP", "").strip() == "legacy"


def _fused_step_enabled() -> bool:
    """The compiled forward step (:mod:`selection.fused`) unless ``BAIT_STEP`` names another one.

    ``BAIT_STEP=numpy`` keeps the batched numpy update and the torch elimination scores (the default
    before the compiled kernel), ``legacy`` the torch.bmm update before that: for same-run benchmarks.
    """
    return os.environ.get("BAIT_STEP", "").strip() not in ("numpy", "legacy")


def _span_backward(span: int, big_d: int) -> bool:
    """Prune in the picks' span (``span = 2B rc`` columns) rather than on ``P`` and ``Q`` (``D = big_d``)?

    When the span is smaller than ``D``: a removal then costs ``3 span^2 rc`` instead of ``~3 D^2 rc``
    (with ``span >= D``, e.g. B = 100 at k = 10, d = 128, the ``D x D`` updates are cheaper).
    """
    return span < big_d


def _small_bmm(a: Tensor, b: Tensor) -> Tensor:
    """Batched product of small matrices; on CPU through numpy's ``matmul``.

    Min-of-25 timings, 8192 products of 9 x 9 by 9 x 9 (second operand a transposed view), one thread:
    numpy 0.69 ms against torch.bmm 1.39 ms (float32), 0.95 against 1.69 ms (float64); 9 x 9 by
    9 x 18 in float64: 1.16 against 2.11 ms. numpy's loops release the GIL like torch's.
    """
    if a.device.type != "cpu" or a.requires_grad or b.requires_grad:
        return torch.bmm(a, b)
    return torch.from_numpy(np.matmul(a.numpy(), b.numpy()))


_SCRATCH = threading.local()


def _scratch(name: str, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray[Any, Any]:
    """A per-thread reusable buffer (``shape``, C-contiguous): big temporaries of the greedy step are
    not reallocated (and page-faulted in) at every chunk of every step."""
    store: dict[str, np.ndarray[Any, Any]] = getattr(_SCRATCH, "bufs", None) or {}
    _SCRATCH.bufs = store
    size = math.prod(shape)
    buf = store.get(name)
    if buf is None or buf.dtype != dtype or buf.size < size:
        buf = np.empty(size, dtype=dtype)
        store[name] = buf
    return buf[:size].reshape(shape)


def _update_rows_numpy(
    x: Tensor, et: Tensor, g: Tensor, h: Tensor | None, blocks: Tensor, sigma: float, *, half_h: bool
) -> None:
    """CPU form of :meth:`_Bait._update_rows` (``r > 1``) in numpy, every product BLAS-able.

    ``[W | Z] = E^T T`` (``T = X [U~ | R^]``, one OpenBLAS GEMM per chunk), then ``[W^T ; Z^T]`` as a
    contiguous copy so that ``W W^T`` and ``W Z^T`` are products of unit-stride operands: numpy's
    ``matmul`` calls BLAS only for those, and ran its own loop for the transposed views before
    (min-of-25 timings, 4096 rows, r = 9, one thread: 452 -> 310 ns per row in float32, 554 -> 450 in
    float64). Buffers are per-thread and reused.
    """
    m = int(x.shape[0])
    rc, r = int(et.shape[1]), int(et.shape[2])
    c = 1 if h is None else 2
    xn = x.to(blocks.dtype).numpy()
    bn = blocks.numpy()
    dt = bn.dtype
    t = _scratch("t", (m, bn.shape[1]), dt)
    np.matmul(xn, bn, out=t)
    wz = _scratch("wz", (m, rc, c * rc), dt)
    np.matmul(et.numpy(), t.reshape(m, r, c * rc), out=wz)  # [W | Z]
    w = wz[:, :, :rc]
    wt = _scratch("wt", (m, c * rc, rc), dt)
    wt[...] = wz.transpose(0, 2, 1)  # [W^T ; Z^T]
    o = _scratch("o", (m, rc, rc), dt)
    gn = g.numpy()
    op = np.subtract if sigma > 0 else np.add
    np.matmul(w, wt[:, :rc], out=o)  # W W^T
    op(gn, o, out=gn)
    if h is not None:
        hn = h.numpy()
        np.matmul(w, wt[:, rc:], out=o)  # W Z^T
        op(hn, o, out=hn)
        if not half_h:
            op(hn, o.transpose(0, 2, 1), out=hn)


class _Workers:
    """Run independent chunk jobs on ``n`` threads, with torch intra-op threads at 1 meanwhile.

    numpy's BLAS (OpenBLAS: the pool GEMMs of :func:`selection.linalg.matmul`) is held at one thread
    too, so ``n`` workers use ``n`` cores and each GEMM's result does not depend on the thread count.
    """

    def __init__(self, n: int) -> None:
        self.n = n
        self.saved = torch.get_num_threads()
        self.pool: ThreadPoolExecutor | None = None
        self.blas: threadpool_limits | None = None

    def __enter__(self) -> _Workers:
        if self.n > 1:
            torch.set_num_threads(1)
            self.blas = threadpool_limits(1, user_api="blas")
            self.pool = ThreadPoolExecutor(self.n, thread_name_prefix="bait")
        return self

    def __exit__(self, *exc: object) -> None:
        # BLAS first: threadpoolctl's restore also resets the OpenMP pool (torch's libgomp) to what it was
        # when the limit was taken (1), so restoring torch's threads before it left the caller at 1 thread.
        if self.blas is not None:
            self.blas.restore_original_limits()
            self.blas = None
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None
            torch.set_num_threads(self.saved)

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[Any]:
        """``fn`` over ``items`` (in order of ``items`` for the results); serial with one thread."""
        if self.pool is None:
            return map(fn, items)
        return self.pool.map(fn, items)


# --------------------------------------------------------------------------------------------------
# Parameters
# --------------------------------------------------------------------------------------------------


#: Default ridge of BAIT's ``M`` (``bait`` and ``bait_nofisher``). With the ``reference`` weights
#: the design terms are averages of ``I(x)``, so ``lam`` competes with them directly; experiment 5
#: (docs/results/conventions/) found ``0.01`` better than ``1`` with the reference convention on
#: linear and MLP heads, and ``lam = 1`` made BAIT worse than random on MNIST regression with an MLP
#: (hidden features of small norm: ``lam I`` swamps ``M`` and BAIT chases the top principal directions).
DEFAULT_LAM = 0.01


def design_weights(convention: str, n_design: int, batch_size: int) -> tuple[float, float]:
    """``(w_L, w_S)``: weights of labeled/reserved rows and of picked rows in ``M``.

    Args:
        convention: ``"reference"``, ``"paper"`` or ``"sum"``.
        n_design: number of labeled + reserved rows.
        batch_size: ``B``.

    Returns:
        The two weights.

    Raises:
        ParameterError: unknown convention.
    """
    if convention == "reference":
        total = n_design + batch_size
        return 1.0 / total, batch_size / total
    if convention == "paper":
        return (1.0 / n_design if n_design > 0 else 0.0), 1.0
    if convention == "sum":
        return 1.0, 1.0
    raise ParameterError(f"unknown convention {convention!r}; expected one of {CONVENTIONS}")


def _check_lam(lam: float) -> float:
    if isinstance(lam, bool) or not isinstance(lam, int | float) or not math.isfinite(lam) or lam <= 0:
        raise ParameterError(f"lam must be a finite number > 0, got {lam!r}")
    return float(lam)


def _check_budget(max_memory_gb: float) -> float:
    ok = isinstance(max_memory_gb, int | float) and not isinstance(max_memory_gb, bool)
    if not ok or not math.isfinite(max_memory_gb) or max_memory_gb <= 0:
        raise ParameterError(f"max_memory_gb must be a finite number > 0, got {max_memory_gb!r}")
    return float(max_memory_gb)


def _check_oversample(oversample: float) -> float:
    ok = isinstance(oversample, int | float) and not isinstance(oversample, bool)
    if not ok or not math.isfinite(oversample) or oversample < 1:
        raise ParameterError(f"oversample must be a number >= 1, got {oversample!r}")
    return float(oversample)


def _check_fisher_weights(weights: Any, problem: Problem) -> Tensor | None:
    if weights is None:
        return None
    try:
        if isinstance(weights, torch.Tensor):
            w = weights.detach().to(device=problem.device, dtype=torch.float64)
        else:
            w = torch.as_tensor(np.asarray(weights, dtype=np.float64)).to(problem.device)
    except (TypeError, ValueError) as exc:
        raise ParameterError(f"fisher_weights must be a numeric array of length n: {exc}") from exc
    if w.ndim != 1 or w.shape[0] != problem.n:
        raise ParameterError(f"fisher_weights must have shape ({problem.n},), got {tuple(w.shape)}")
    if not bool(torch.isfinite(w).all()) or bool((w < 0).any()) or float(w.sum()) <= 0:
        raise ParameterError("fisher_weights must be finite, nonnegative and not all zero")
    return w / w.sum()


# --------------------------------------------------------------------------------------------------
# Memory
# --------------------------------------------------------------------------------------------------


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
# The engine
# --------------------------------------------------------------------------------------------------


def _first_best(scores: Tensor, eligible: Tensor, *, maximize: bool, rtol: float) -> int:
    """Index of the best eligible score; near-ties (``rtol * max|score|``) go to the lowest index.

    NaN/inf scores lose against every finite one; if no eligible score is finite, the first eligible
    position is returned.
    """
    ok = torch.isfinite(scores)
    ok &= eligible
    if not bool(ok.any()):
        return int(torch.nonzero(eligible)[0, 0])
    # Ineligible and non-finite entries become -inf (+inf when minimising), so the threshold test
    # alone excludes them. Each line is one pass over n (scalar fills, no full-size constants).
    fill = float("-inf") if maximize else float("inf")
    vals = torch.where(ok, scores, fill)
    best = vals.max() if maximize else vals.min()
    tol = rtol * torch.where(ok, scores.abs(), 0.0).max()
    hit = (vals >= best - tol) if maximize else (vals <= best + tol)
    return int(torch.argmax(hit.view(torch.uint8)))


def _design_pairs(xl: Tensor, el: Tensor, kchol: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Factors of ``G_x`` on a Woodbury ``P_0 = (I - L K^{-1} L^T) / lam`` (``L`` = design factor).

    ``x^T P_ab x = (||x||^2 delta_ab - b_a^T K^{-1} b_b) / lam`` with ``b_a[i r + c] = (x_i^T x) E_i[a, c]``,
    i.e. ``b_a^T K^{-1} b_b = k_x^T T_ab k_x`` with ``k_x = (x_i^T x)_i`` and the ``n_L x n_L`` matrices
    ``T_ab[i, j] = (E_i^T K^{-1}_ij E_j)[a, b]``: ``O(n (n_L d + n_L^2 r (r+1) / 2))`` for the pool instead
    of ``O(n r m'^2)`` (Woodbury with explicit ``K^{-1} b``) or ``n D^2`` (dense blocks).

    Args:
        xl: ``n_L x d`` design rows (matrix dtype).
        el: ``n_L x r x r`` design factors, weight folded in.
        kchol: Cholesky factor of ``K = lam I + L^T L`` (``m' x m'``, ``m' = n_L r``).

    Returns:
        ``(xl, tpairs, iu)``: ``tpairs`` is ``n_L x (pairs n_L)`` with column block ``p = (a, b)``,
        ``a <= b`` (``iu`` = the ``2 x pairs`` upper-triangle indices), entry ``[i, (p, j)] = T_ab[i, j]``.
    """
    n_l, r, _ = el.shape
    m_prime = n_l * r
    ebig = torch.zeros(n_l, r, n_l, r, dtype=el.dtype, device=el.device)  # [(i, c), (j, a)]
    rows = torch.arange(n_l, device=el.device)
    ebig[rows, :, rows, :] = el.transpose(1, 2)
    ebig = ebig.view(m_prime, m_prime)
    tfull = ebig.T @ torch.cholesky_solve(ebig, kchol)  # [(i, a), (j, b)]
    tfull = 0.5 * (tfull + tfull.T)
    iu = torch.triu_indices(r, r, device=el.device)
    tpairs = tfull.view(n_l, r, n_l, r).permute(0, 1, 3, 2)[:, iu[0], iu[1], :]
    return xl, tpairs.reshape(n_l, -1), iu


#: The clock of the auto plan's guard (tests replace it with a fake one).
_CLOCK: Callable[[], float] = time.perf_counter


@dataclass
class _Guard:
    """The auto plan's hard time limit: the greedy passes ask it before each step whether to stop.

    ``deadline`` is on :data:`_CLOCK`'s scale (``None``: no limit, as for forced plans). A pass that
    stops records why in ``events``; the driver then completes the batch cheaply (see
    :meth:`_Bait.forward` and :meth:`_Bait.backward`).
    """

    deadline: float | None = None
    events: dict[str, Any] = field(default_factory=dict)

    def stop(self, done: int, total: int, need: int, t0: float) -> bool:
        """Stop before step ``done`` of ``total`` (``need`` are required for a batch) started at ``t0``?

        With ``need`` steps done, stop when the remaining ones, at the mean step time so far, would end
        past the deadline; before that, only when the next step would.
        """
        if self.deadline is None:
            return False
        now = _CLOCK()
        per = (now - t0) / done if done else 0.0
        if done >= need:
            return now + per * (total - done) > self.deadline
        return now + per > self.deadline

    def past(self) -> bool:
        return self.deadline is not None and _CLOCK() > self.deadline

    def left(self) -> float:
        return math.inf if self.deadline is None else self.deadline - _CLOCK()


def _fill(scores: Tensor, eligible: Tensor, count: int) -> list[int]:
    """The ``count`` eligible positions of largest score (NaN last, ties to the lower position)."""
    vals = torch.where(eligible & ~torch.isnan(scores), scores.to(torch.float64), -math.inf)
    vals = torch.where(eligible, vals, torch.full_like(vals, -math.inf))
    order = torch.sort(-vals, stable=True).indices
    ok = eligible[order]
    return [int(i) for i in order[ok][:count]]


@dataclass
class _Timer:
    setup: float = 0.0
    forward: float = 0.0
    backward: float = 0.0


@dataclass
class _State:
    """Everything the greedy passes update. ``D = r d``; ``n_C`` candidates."""

    x: Tensor  # n_C x d candidate embeddings (state dtype)
    et: Tensor  # n_C x r x r transposed class factors E^T scaled by sqrt(w_S), contiguous (state dtype)
    g: Tensor  # n_C x r x r
    h: Tensor | None  # n_C x r x r (None in logdet mode)
    p: Tensor  # D x D, P = M^{-1} (matrix dtype)
    q: Tensor | None  # D x D, Q = P F P (None in logdet mode)
    value: float  # tr(P F) in the reduced space, or log det M (logdet mode)
    info: dict[str, Any] = field(default_factory=dict)
    # Deferred forward updates (see _Bait._forward_fused): P = p - U U^T, Q = q - (U R^T + R U^T) with
    # U = lazy_u[:, :lazy_k], R = lazy_r[:, :lazy_k]; None when P and Q are updated in place.
    lazy_u: Tensor | None = None
    lazy_r: Tensor | None = None
    lazy_k: int = 0


class _Bait:
    """Structured exact BAIT on one (possibly projected) problem."""

    def __init__(
        self,
        problem: Problem,
        x: Tensor,
        *,
        lam: float,
        w_design: float,
        w_picked: float,
        mode: Mode,
        fisher_weights: Tensor | None,
        matrix_dtype: torch.dtype,
        n_threads: int = 1,
        classes: int | None = None,
        samples: int = 0,
    ) -> None:
        self.problem = problem
        # Class approximations (selection/scale.py): each candidate's factor keeps its top `classes`
        # classes (rest merged) plus `samples` pseudo-labels drawn from the rest: c + s columns.
        self.classes = classes
        self.samples = samples if classes is not None else 0
        self.n_threads = max(1, n_threads)
        self.x_all = x  # n x d (state dtype)
        self.probs = problem.probs
        self.lam = lam
        self.w_design = w_design
        self.w_picked = w_picked
        self.mode: Mode = mode
        self.fisher_weights = fisher_weights
        self.mdt = matrix_dtype
        self.device = x.device
        self.n, self.d = int(x.shape[0]), int(x.shape[1])
        self.r = reduced_rank(problem.probs)
        # Per-candidate state dtype. Rank-one problems (regression, binary) keep theirs in float64:
        # g and h are then n scalars, and float32 state drifts most there (g = x^T P x cancels as P
        # shrinks; notes sec. 3). Their per-step GEMV still reads X in its own dtype: a float64 copy
        # made it exact in our tests but cost 1.5-2x per step; float32 GEMVs left objective gaps
        # of at most ~2 % at lam = 0.01 (tests/selection/test_bait.py pins 3 %).
        self.sdt = torch.float64 if self.r == 1 else x.dtype
        self.big_d = self.r * self.d
        self.rtol = _TIE_RTOL.get(self.sdt, 1e-5)
        rc = self.r if classes is None else classes + self.samples
        cand_bytes = max(1, (self.d + 4 * self.r * rc) * torch.finfo(self.sdt).bits // 8)
        self.step_chunk = max(64, min(problem.chunk_size, _STEP_CHUNK_BYTES // cand_bytes))
        if x.device.type == "cuda":
            self.step_chunk = max(self.step_chunk, _STEP_CHUNK_BYTES_CUDA // cand_bytes)
        if self.r == 1:
            # A rank-one step is a GEMV and a few vector ops: big chunks keep the op count small.
            self.step_chunk = max(problem.chunk_size, 2**18)
        self.done = 0
        self.total = 0

    # ---- progress -------------------------------------------------------------------------------
    def _tick(self) -> None:
        self.done += 1
        self.problem.report(self.done, self.total)

    # ---- setup ----------------------------------------------------------------------------------
    def setup(self, n_steps_total: int) -> _State:
        """Build ``F``, ``P_0``, ``Q_0`` and the candidates' ``g``, ``h`` (notes sec. 2(e))."""
        prob = self.problem
        mdt, sdt, dev = self.mdt, self.sdt, self.device
        lam, big_d, r = self.lam, self.big_d, self.r
        cs = prob.chunk_size
        cand = prob.candidates
        n_cand = int(cand.numel())
        design = prob.in_design
        n_design = int(design.numel())
        # F's chunks: at least _F_PARTIALS of them, so that every partial sum has rows and the worker
        # threads share F. A single chunk ran on the calling thread with torch's and OpenBLAS's thread
        # pools alternating on the same two cores: n = 5,000, d = 128, k = 26 (one 8,192-row chunk),
        # F took 9.1 s at 2 torch threads against 0.3 s at 1 (the elementwise ops waited on spinning
        # BLAS threads).
        f_cs = max(1, min(cs, math.ceil(self.n / _F_PARTIALS)))
        pool_chunks = 0 if self.mode != "fisher" else math.ceil(self.n / f_cs)
        # The candidates' g, h chunks: at least _F_PARTIALS of them too (one 4,740-row chunk kept the
        # second core idle at k = 26); like F's, the split does not depend on the thread count.
        gh_cs = max(1, min(cs, math.ceil(n_cand / _F_PARTIALS)))
        cand_chunks = math.ceil(n_cand / gh_cs)
        self.total = pool_chunks + cand_chunks + n_steps_total

        # F: weighted mean of I(x) over every pool row, accumulated in the matrix dtype.
        fmat: Tensor | None = None
        if self.mode == "fisher":
            weights = self.fisher_weights
            if weights is None:
                weights = torch.full((self.n,), 1.0 / self.n, dtype=torch.float64, device=dev)
            pool_bounds = [(lo, min(self.n, lo + f_cs)) for lo in range(0, self.n, f_cs)]
            n_parts = min(_F_PARTIALS, len(pool_bounds))
            parts = [torch.zeros(big_d, big_d, dtype=mdt, device=dev) for _ in range(n_parts)]

            def f_part(j: int) -> int:
                # Chunks j, j + n_parts, ... in order into partial sum j (same for any thread count).
                for lo, hi in pool_bounds[j::n_parts]:
                    probs = None if self.probs is None else self.probs[lo:hi]
                    ef = row_factors(probs, hi - lo, dtype=sdt, device=dev)
                    sf = (ef @ ef.transpose(1, 2)) * weights[lo:hi].to(sdt)[:, None, None]  # chunk x r x r
                    accumulate_kron_upper(parts[j], self.x_all[lo:hi].to(sdt), sf)
                return len(pool_bounds[j::n_parts])

            with _Workers(min(self.n_threads, n_parts)) as workers:
                for done in workers.map(f_part, range(n_parts)):
                    for _ in range(done):
                        self._tick()
            fmat = parts[0]
            for part in parts[1:]:
                fmat += part
            del parts
            symmetrize_blocks(fmat, r)
        elif self.mode == "identity":
            fmat = torch.eye(big_d, dtype=mdt, device=dev)

        # P_0 = M_0^{-1}, Q_0 = P_0 F P_0, and log det M_0.
        p0_identity = n_design == 0 or self.w_design == 0.0
        low_rank: tuple[Tensor, Tensor, Tensor] | None = None  # x_L, T pairs, pair indices
        q: Tensor | None = None
        m_prime = n_design * r
        if p0_identity:
            p = torch.eye(big_d, dtype=mdt, device=dev) / lam
            q = None if fmat is None else fmat / lam**2
            logdet0 = big_d * math.log(lam)
            method = "identity"
        elif 2 * m_prime < big_d:
            # Woodbury with the D x m' factor of the design Fisher (notes sec. 2(e)).
            xl = self.x_all[design].to(mdt)  # n_L x d
            el = row_factors(None if self.probs is None else self.probs[design], n_design, dtype=mdt, device=dev)
            el = el * math.sqrt(self.w_design)  # n_L x r x r
            # lf[a*d + j, i*r + c] = x_i[j] E_i[a, c]
            lf = (el.permute(1, 0, 2)[:, None, :, :] * xl.T[None, :, :, None]).reshape(big_d, m_prime)
            kmat = matmul(lf.T, lf)
            kmat.diagonal().add_(lam)
            kchol = torch.linalg.cholesky(kmat)
            z = torch.cholesky_solve(lf.T, kchol).T  # D x m': L K^{-1}
            p = -matmul(z, lf.T)
            p.diagonal().add_(1.0)
            p /= lam
            if fmat is not None:
                y = matmul(fmat, lf)  # D x m'
                y -= 0.5 * matmul(z, matmul(lf.T, y))
                q = fmat - matmul(z, y.T) - matmul(y, z.T)
                q /= lam**2
            logdet0 = (big_d - m_prime) * math.log(lam) + 2.0 * float(kchol.diagonal().log().sum())
            low_rank = _design_pairs(xl, el, kchol)
            del lf, z, kmat
            method = "woodbury"
        else:
            # The design rows' elementwise ops on one torch thread, the GEMMs on OpenBLAS's threads: with
            # both pools at 2 threads on 2 cores they alternate and wait on each other's spinning
            # threads (k = 26, n_L = 260: 0.83 s against ~0.1 s).
            with torch_threads(1 if dev.type == "cpu" else torch.get_num_threads()):
                m0 = kron_sum(
                    self.x_all[design],
                    None if self.probs is None else self.probs[design],
                    None,
                    out_dtype=mdt,
                    chunk_size=cs,
                    compute_dtype=mdt,
                )
            m0 *= self.w_design
            m0.diagonal().add_(lam)
            with torch_threads(dense_threads(dev, self.x_all.dtype, self.n_threads)):
                chol = torch.linalg.cholesky(m0)
                del m0
                logdet0 = 2.0 * float(chol.diagonal().log().sum())
                p = torch.cholesky_inverse(chol)
                del chol
            if fmat is not None:
                # Q_0 = P_0 F P_0, two D^3 GEMMs (1.2 s of a 4 s setup at k = 26, d = 128), in the candidates'
                # state dtype: their g and h are computed from P_0 and Q_0 cast to it anyway (p_s, q_s
                # below), so a float32 pipeline's Q_0 loses nothing it keeps, and float32 GEMMs run at
                # twice the rate (D = 3,200: 1.2 -> 0.6 s on 2 cores). A float64 pipeline is unchanged.
                p_c, f_c = p.to(sdt), fmat.to(sdt)
                q = matmul(matmul(p_c, f_c), p_c).to(mdt)
                del p_c, f_c
            method = "cholesky"
            # Cost model for G_x (multiply-adds per candidate): the dense block quadratic forms
            # cost D^2 (r+1) / (2r); the Woodbury form below n_L d + n_L^2 r (r+1) / 2 (cheaper iff
            # n_L < d, roughly; then m' < D and K is small).
            if n_design * self.d + n_design**2 * r * (r + 1) // 2 < big_d * big_d * (r + 1) // (2 * r):
                xl = self.x_all[design].to(mdt)
                el = row_factors(None if self.probs is None else self.probs[design], n_design, dtype=mdt, device=dev)
                el = el * math.sqrt(self.w_design)
                lf = (el.permute(1, 0, 2)[:, None, :, :] * xl.T[None, :, :, None]).reshape(big_d, m_prime)
                kmat = lf.T @ lf
                kmat.diagonal().add_(lam)
                low_rank = _design_pairs(xl, el, torch.linalg.cholesky(kmat))
                del lf, kmat
        # Symmetrise and make row-major: LAPACK results are column-major, and the block matvecs
        # below need contiguous rows (a strided P made them 20x slower).
        p = (0.5 * (p + p.T)).contiguous()
        if q is not None:
            q = (0.5 * (q + q.T)).contiguous()

        value = logdet0 if self.mode == "logdet" else float((p * fmat).sum())  # type: ignore[operator]
        del fmat

        # Candidates: embeddings, scaled factors, g and h (notes sec. 2(a)).
        xc = self.x_all if n_cand == self.n else self.x_all[cand]
        if self.classes is not None and self.probs is not None:
            # n_C x r x (c + s); the draws are seeded by the problem's seed
            e = sampled_class_factor(self.probs[cand], self.classes, self.samples, dtype=sdt, seed=prob.seed)
        else:
            e = row_factors(None if self.probs is None else self.probs[cand], n_cand, dtype=sdt, device=dev)
        e *= math.sqrt(self.w_picked)
        rc = int(e.shape[2])
        g = torch.empty(n_cand, rc, rc, dtype=sdt, device=dev)
        h = None if q is None else torch.empty(n_cand, rc, rc, dtype=sdt, device=dev)
        p_s = None if (p0_identity or low_rank is not None) else p.to(sdt)
        q_s = None if q is None else q.to(sdt)
        if low_rank is not None:
            xl_s, tp_s = low_rank[0].to(sdt), low_rank[1].to(sdt)  # n_L x d, n_L x (pairs n_L)
            iu = low_rank[2]
            n_pairs = int(iu.shape[1])
            # Rows per sub-chunk so the m x pairs x n_L temporary stays near _SETUP_SUB_BYTES.
            g_sub = max(16, _SETUP_SUB_BYTES // max(1, n_pairs * n_design * torch.finfo(sdt).bits // 8))

        def gh_chunk(bounds: tuple[int, int]) -> None:
            lo, hi = bounds
            xs = xc[lo:hi].to(sdt)
            ec = e[lo:hi]
            ete = ec.transpose(1, 2)
            norms = (xs * xs).sum(1) / lam
            if p_s is not None:
                g[lo:hi] = ete @ block_quadratic_forms(xs, p_s) @ ec
            elif low_rank is None:
                g[lo:hi] = (ete @ ec) * norms[:, None, None]  # G_x = ||x||^2 / lam I
            else:
                kx = matmul(xs, xl_s.T)  # m x n_L
                quad = torch.empty(hi - lo, n_pairs, dtype=sdt, device=dev)
                for so in range(0, hi - lo, g_sub):
                    ks = kx[so : so + g_sub]
                    u = matmul(ks, tp_s).view(-1, n_pairs, n_design)  # [i, p, j] = (k_x^T T_p)_j
                    quad[so : so + g_sub] = (u * ks[:, None, :]).sum(-1)
                quad /= -lam
                gx = torch.empty(hi - lo, r, r, dtype=sdt, device=dev)
                gx[:, iu[0], iu[1]] = quad
                gx[:, iu[1], iu[0]] = quad
                gx.diagonal(dim1=1, dim2=2).add_(norms[:, None])
                g[lo:hi] = ete @ gx @ ec
            if h is not None and q_s is not None:
                h[lo:hi] = ete @ block_quadratic_forms(xs, q_s) @ ec

        with _Workers(self.n_threads) as workers:
            for _ in workers.map(gh_chunk, [(lo, min(n_cand, lo + gh_cs)) for lo in range(0, n_cand, gh_cs)]):
                self._tick()
        # E^T contiguous: the per-step batched product E^T T was 1.6x faster than with a transposed view.
        et = e.transpose(1, 2).contiguous()
        state = _State(x=xc, et=et, g=g, h=h, p=p, q=q, value=value)
        state.info["p0"] = method
        return state

    # ---- one pick or removal on the D x D matrices ----------------------------------------------
    def _row_blocks(self) -> list[tuple[int, int]]:
        """Fixed row blocks of the ``D x D`` matrices for the worker threads (one block off CPU)."""
        big_d = self.big_d
        size = big_d if self.device.type != "cpu" else _DD_ROW_BLOCK
        return [(lo, min(big_d, lo + size)) for lo in range(0, big_d, size)]

    def _rank_update(
        self, st: _State, x_s: Tensor, e_s: Tensor, sigma: float, workers: _Workers
    ) -> tuple[Tensor, float, list[Callable[[], None]]]:
        """Add (``sigma=+1``) or remove (``-1``) one point: the pool-GEMM blocks, the change, the ``P``/``Q`` jobs.

        The ``D x D`` work (block matvecs of ``P`` and ``Q``, their rank updates) runs in fixed row
        blocks on the worker threads (each block computed as it would be serially, so the bits do not
        depend on the thread count). The rank updates of ``P`` and ``Q`` are returned as jobs, not run:
        the forward pass runs them on the workers together with the candidate chunks of the same step
        (the chunks read only the returned blocks), the backward pass right away; all must finish
        before the next call.

        Args:
            st: state; ``p`` and ``q`` are updated by the returned jobs.
            x_s: ``d`` embedding of the point.
            e_s: ``r x r`` scaled class factor of the point.
            sigma: ``+1`` or ``-1``.
            workers: the worker threads.

        Returns:
            ``(blocks, delta, jobs)``: ``d x (r * c * r)`` matrix ``[U~ | R^]`` laid out for
            :meth:`_update_rows` (``c = 2``, or 1 in logdet mode), the decrease (forward) /
            increase (backward) of ``tr(M^{-1}F)``, or the increase of ``log det M``, and the row-block
            jobs that apply the update to ``P`` and ``Q``.
        """
        mdt = self.mdt
        r, d, big_d = self.r, self.d, self.big_d
        x_s = x_s.to(mdt)
        e_s = e_s.to(mdt)  # r x rc
        rc = int(e_s.shape[1])
        eye = torch.eye(rc, dtype=mdt, device=self.device)
        rows = self._row_blocks()
        q = st.q
        pv = torch.empty(big_d, r, dtype=mdt, device=self.device)
        qv = None if q is None else torch.empty(big_d, r, dtype=mdt, device=self.device)

        lazy = st.lazy_u is not None and st.lazy_r is not None and sigma > 0
        lu = lr = cu = cr = None
        if lazy and st.lazy_k and st.lazy_u is not None and st.lazy_r is not None and q is not None:
            # The deferred updates' part of the block matvecs: P (I ⊗ x) -= U (U^T (I ⊗ x)) and
            # Q (I ⊗ x) -= U (R^T (I ⊗ x)) + R (U^T (I ⊗ x)), 3 D K (r + 1) multiply-adds, on the workers.
            lu, lr = st.lazy_u[:, : st.lazy_k], st.lazy_r[:, : st.lazy_k]
            cu = torch.empty(r, st.lazy_k, dtype=mdt, device=self.device)
            cr = torch.empty(r, st.lazy_k, dtype=mdt, device=self.device)

            def contract(a: int) -> None:
                assert lu is not None and lr is not None and cu is not None and cr is not None
                cu[a] = x_s @ lu[a * d : (a + 1) * d]
                cr[a] = x_s @ lr[a * d : (a + 1) * d]

            for _ in workers.map(contract, range(r)):
                pass

        def matvecs(lh: tuple[int, int]) -> None:
            lo, hi = lh
            pv[lo:hi] = block_matvec(st.p[lo:hi], x_s)
            if lu is not None and cu is not None:
                pv[lo:hi] -= lu[lo:hi] @ cu.T
            if q is not None and qv is not None:
                qv[lo:hi] = block_matvec(q[lo:hi], x_s)
                if lu is not None and lr is not None and cu is not None and cr is not None:
                    qv[lo:hi] -= lu[lo:hi] @ cr.T + lr[lo:hi] @ cu.T

        for _ in workers.map(matvecs, rows):
            pass
        u = pv @ e_s  # D x r: P V_s
        g_s = e_s.T @ block_contract(u, x_s)  # r x r: V_s^T P V_s
        a = eye + sigma * 0.5 * (g_s + g_s.T)
        chol, info = torch.linalg.cholesky_ex(a)
        if int(info) != 0:
            what = "adding" if sigma > 0 else "removing"
            raise InputDataError(
                f"BAIT: the Woodbury system for {what} a point is not positive definite; the embeddings "
                "or probabilities are too ill-conditioned for this lam (use a larger lam or float64 input)"
            )
        u_t = torch.linalg.solve_triangular(chol, u.T, upper=False).T.contiguous()  # D x r: U L^{-T}
        jobs: list[Callable[[], None]] = []
        if q is None or qv is None:
            delta = 2.0 * float(chol.diagonal().log().sum())
            blocks = u_t.view(r, d, 1, rc)
            u_tt = u_t.T.contiguous()

            def p_only(lo: int, hi: int) -> None:
                st.p[lo:hi].addmm_(u_t[lo:hi], u_tt, alpha=-sigma)

            jobs = [functools.partial(p_only, lo, hi) for lo, hi in rows]
        else:
            rr = qv @ e_s  # D x r: Q V_s
            h_s = e_s.T @ block_contract(rr, x_s)  # r x r: V_s^T Q V_s
            h_s = 0.5 * (h_s + h_s.T)
            r_t = torch.linalg.solve_triangular(chol, rr.T, upper=False).T  # D x r: R L^{-T}
            y = torch.linalg.solve_triangular(chol, h_s, upper=False)  # L^{-1} h_s
            s_t = torch.linalg.solve_triangular(chol, y.T, upper=False)  # L^{-1} h_s L^{-T}
            r_h = r_t - (0.5 * sigma) * (u_t @ s_t)  # D x r
            delta = float(s_t.diagonal().sum())
            blocks = torch.stack([u_t, r_h], dim=1).view(r, d, 2, rc)
            # Q -= sigma (U~ R^T + R^ U~^T) as one rank-2r GEMM: one pass over Q.
            left = torch.cat([u_t, r_h], 1)
            right = torch.cat([r_h, u_t], 1).T.contiguous()
            u_tt = u_t.T.contiguous()

            def pq(lo: int, hi: int) -> None:
                st.p[lo:hi].addmm_(u_t[lo:hi], u_tt, alpha=-sigma)
                q[lo:hi].addmm_(left[lo:hi], right, alpha=-sigma)

            if lazy and st.lazy_u is not None and st.lazy_r is not None:
                k0 = st.lazy_k
                st.lazy_u[:, k0 : k0 + rc] = u_t
                st.lazy_r[:, k0 : k0 + rc] = r_h
                st.lazy_k = k0 + rc
            else:
                jobs = [functools.partial(pq, lo, hi) for lo, hi in rows]
        # d x (r * c * r), column index (a, c-block, col): one GEMM gives m x r x (c r) per chunk.
        return blocks.permute(1, 0, 2, 3).reshape(d, -1), delta, jobs

    @staticmethod
    def _update_rows(
        x: Tensor, et: Tensor, g: Tensor, h: Tensor | None, blocks: Tensor, sigma: float, *, half_h: bool = False
    ) -> None:
        """``g -= sigma W W^T``, ``h -= sigma (W Z^T + Z W^T)`` with ``[W | Z] = E^T (X [U~ | R^])``.

        Args:
            x: ``m x d`` rows.
            et: ``m x rc x r`` transposed scaled factors ``E^T`` (contiguous is fastest; ``rc = r``
                unless top-c).
            g: ``m x rc x rc``, updated in place.
            h: ``m x rc x rc`` or ``None``, updated in place.
            blocks: ``d x (r * c * rc)`` from :meth:`_rank_update`, same dtype as ``x``.
            sigma: ``+1`` or ``-1``.
            half_h: ``h`` holds ``h~`` with ``h = h~ + h~^T`` (``r > 1``): then ``h~ -= sigma W Z^T``,
                one contiguous subtraction instead of two (one of them transposed).
        """
        m = x.shape[0]
        rc, r = int(et.shape[1]), int(et.shape[2])
        if r == 1:
            # Rank one: one streaming GEMV in the pool dtype; the (float64) state absorbs the result.
            # c x m = blocks^T X^T: 1.6x faster than X @ blocks (m x c) for c <= 2 (10.4 vs 6.5 GB/s
            # of X read, one thread), and its rows are contiguous for the vector ops below.
            t = (blocks.to(x.dtype).T.contiguous() @ x.T).to(g.dtype)  # c x m
            w = et[:, 0, 0] * t[0]
            g[:, 0, 0] -= sigma * w * w
            if h is not None:
                z = et[:, 0, 0] * t[1]
                h[:, 0, 0] -= (2.0 * sigma) * w * z
            return
        c = 1 if h is None else 2
        numpy_ok = x.device.type == "cpu" and g.is_contiguous() and (h is None or h.is_contiguous())
        if numpy_ok and not _legacy_step():
            _update_rows_numpy(x, et, g, h, blocks, sigma, half_h=half_h)
            return
        t = matmul(x.to(blocks.dtype), blocks)  # m x (r * c * rc)
        if _legacy_step():  # the previous update, for same-run benchmarks (BAIT_STEP=legacy)
            wz = torch.bmm(et, t.view(m, r, c * rc))
            w = wz[:, :, :rc]
            g.baddbmm_(w, w.transpose(1, 2), alpha=-sigma)
            if h is not None:
                y = torch.bmm(w, wz[:, :, rc:].transpose(1, 2))
                h.sub_(y, alpha=sigma)
                if not half_h:
                    h.sub_(y.transpose(1, 2), alpha=sigma)
            return
        wz = _small_bmm(et, t.view(m, r, c * rc))  # m x rc x c rc: [W | Z]
        w = wz[:, :, :rc]
        g.sub_(_small_bmm(w, w.transpose(1, 2)), alpha=sigma)
        if h is not None:
            y = _small_bmm(w, wz[:, :, rc:].transpose(1, 2))  # m x rc x rc: W Z^T
            h.sub_(y, alpha=sigma)
            if not half_h:
                h.sub_(y.transpose(1, 2), alpha=sigma)

    def _scores(self, g: Tensor, h: Tensor | None, sigma: float, *, half_h: bool = False) -> Tensor:
        if h is None:
            return logdet_scores(g)
        return trace_solve_scores(g, h, sigma, half_h=half_h)

    # ---- passes ---------------------------------------------------------------------------------
    def forward(
        self, st: _State, n_steps: int, guard: _Guard | None = None, need: int = 0
    ) -> tuple[list[int], list[float]]:
        """Greedy forward pass; returns candidate positions in pick order and their gains.

        With a ``guard`` that says stop, the pass ends early; fewer than ``need`` picks are then completed
        by the last step's scores (the best remaining single-point gains, without updates between them),
        recorded in ``guard.events``.
        """
        guard = guard or _Guard()
        n_cand = st.x.shape[0]
        cs = self.step_chunk
        chosen = torch.zeros(n_cand, dtype=torch.bool, device=self.device)
        eligible = torch.ones(n_cand, dtype=torch.bool, device=self.device)
        scores = torch.empty(n_cand, dtype=self.sdt, device=self.device)
        bounds = [(lo, min(n_cand, lo + cs)) for lo in range(0, n_cand, cs)]
        blocks = torch.empty(0)
        # During the pass h holds h~ = h / 2 (h = h~ + h~^T; exact scaling): its update is then one
        # contiguous subtraction, and the score symmetrises while making its batch-last copy.
        half_h = st.h is not None and self.r > 1
        if st.h is not None and half_h:
            st.h.mul_(0.5)

        def score_chunk(lh: tuple[int, int]) -> None:
            lo, hi = lh
            scores[lo:hi] = self._scores(st.g[lo:hi], None if st.h is None else st.h[lo:hi], 1.0, half_h=half_h)

        def step_chunk(lh: tuple[int, int]) -> None:
            # Chosen rows are updated too (harmless) so the chunks stay contiguous.
            lo, hi = lh
            hc = None if st.h is None else st.h[lo:hi]
            self._update_rows(st.x[lo:hi], st.et[lo:hi], st.g[lo:hi], hc, blocks, 1.0, half_h=half_h)
            scores[lo:hi] = self._scores(st.g[lo:hi], hc, 1.0, half_h=half_h)

        picks: list[int] = []
        gains: list[float] = []
        # Chunks of one step run on the worker threads. n=100k, d=128, k=10 on 2 cores: 0.25 -> 0.14 s
        # per step at load ~1; at load ~3.4 (both cores busy with other work) 2 threads measured
        # 0.25-0.38 s vs 0.24-0.33 s (GIL hand-offs between the ~150 short ops of a chunk).
        # The rank update of P and Q (row-block jobs) runs on the workers with the step's candidate
        # chunks: the chunks only read the blocks [U~ | R^], so nothing waits for the D x D update.
        jobs: list[Callable[[], None]] = []

        def run(job: Callable[[], None] | tuple[int, int]) -> None:
            if callable(job):
                job()
            else:
                step_chunk(job)

        with _Workers(self.n_threads) as workers:
            for _ in workers.map(score_chunk, bounds):
                pass
            if st.h is not None and half_h and self.device.type == "cpu" and _fused_step_enabled():
                return self._forward_fused(st, n_steps, scores, eligible, workers, guard, need)
            t0 = _CLOCK()
            for step in range(n_steps):
                if guard.stop(step, n_steps, need, t0):
                    self._cut(guard, picks, n_steps, need, scores, eligible)
                    break
                pos = _first_best(scores, eligible, maximize=True, rtol=self.rtol)
                picks.append(pos)
                chosen[pos] = True
                eligible[pos] = False
                blocks, delta, jobs = self._rank_update(st, st.x[pos], st.et[pos].T, 1.0, workers)
                gains.append(delta)
                st.value = st.value + delta if self.mode == "logdet" else st.value - delta
                todo: list[Callable[[], None] | tuple[int, int]] = list(jobs)
                if step + 1 < n_steps:
                    blocks = blocks.to(self.sdt)
                    todo += bounds
                for _ in workers.map(run, todo):
                    pass
                self._tick()
        if st.h is not None and half_h:
            st.h = st.h + st.h.transpose(1, 2)
        return picks, gains

    @staticmethod
    def _cut(guard: _Guard, picks: list[int], n_steps: int, need: int, scores: Tensor, eligible: Tensor) -> None:
        """Record a forward pass stopped by the guard; complete it to ``need`` picks from ``scores``."""
        guard.events["forward_stopped_at"] = len(picks)
        guard.events["forward_planned"] = n_steps
        if len(picks) < need:
            extra = _fill(scores, eligible, need - len(picks))
            guard.events["filled"] = len(extra)
            for pos in extra:
                eligible[pos] = False
            picks.extend(extra)

    def _forward_fused(
        self,
        st: _State,
        n_steps: int,
        scores: Tensor,
        eligible: Tensor,
        workers: _Workers,
        guard: _Guard,
        need: int,
    ) -> tuple[list[int], list[float]]:
        """The forward pass's steps on CPU with the compiled per-candidate kernel (:mod:`selection.fused`).

        Called with ``st.h`` holding ``h~`` (``h = h~ + h~^T``) and ``scores`` the first step's. The
        candidates' ``E^T``, ``g`` and ``h~`` move into the kernel's tile-major layout (lanes last) for
        the pass and back afterwards; per step and chunk of whole tiles, one OpenBLAS GEMM
        ``[U~ | R^]^T X^T`` (lanes contiguous) and one kernel call (no GIL) do the update and the scores.
        Picks and gains are those of the numpy step (same ``_rank_update``); ``P``/``Q`` are updated in
        place or, where cheaper, deferred (below).
        """
        assert st.h is not None
        n_cand = int(st.x.shape[0])
        lanes = fused.lanes_for(int(st.et.shape[1]))
        n_pad = fused.padded(n_cand, lanes)
        dt = np.dtype(str(self.sdt).removeprefix("torch."))
        x_pad = np.zeros((n_pad, self.d), dtype=dt)
        x_pad[:n_cand] = st.x.to(self.sdt).numpy()
        et_t = fused.to_tiles(st.et.numpy(), n_pad, lanes)
        g_t = fused.to_tiles(st.g.numpy(), n_pad, lanes)
        h_t = fused.to_tiles(st.h.numpy(), n_pad, lanes)
        st.g = st.h = torch.empty(0, dtype=self.sdt)  # the tiles hold the state until the pass ends
        rc, r = int(et_t.shape[1]), int(et_t.shape[2])
        score_np = np.zeros(n_pad, dtype=dt)
        score_np[:n_cand] = scores.numpy()
        scores = torch.from_numpy(score_np[:n_cand])
        cs = max(lanes, lanes * round(self.step_chunk / lanes))
        bounds = [(lo, min(n_pad, lo + cs)) for lo in range(0, n_pad, cs)]
        blocks_t = np.empty(0, dtype=dt)
        # Defer P's and Q's rank updates (_State.lazy_u) when that costs less over the whole pass:
        # step t's block matvecs then pay ~3 D t rc (r + 1) for the deferred part instead of the
        # 3 D^2 rc of updating P and Q, i.e. when n_steps (r + 1) < 2 D (k = 26, d = 128, 40 steps:
        # D = 3,200, a sixth of the updates' multiply-adds). The backward pass reads them as they are.
        # The two D x (n_steps rc) buffers must also fit where the setup's transient F was (D^2 words):
        # n_steps rc <= D / 2, so the peak memory stays within estimate_bytes.
        big_d = self.big_d
        if st.q is not None and n_steps * (r + 1) < 2 * big_d and 2 * n_steps * rc <= big_d:
            st.lazy_u = torch.zeros(big_d, n_steps * rc, dtype=self.mdt)
            st.lazy_r = torch.zeros(big_d, n_steps * rc, dtype=self.mdt)
            st.lazy_k = 0
        st.info["pq_updates"] = "deferred" if st.lazy_u is not None else "in place"

        def chunk(lo: int, hi: int) -> None:
            t = _scratch("fused_t", (blocks_t.shape[0], hi - lo), dt)
            np.matmul(blocks_t, x_pad[lo:hi].T, out=t)
            a, b = lo // lanes, hi // lanes
            fused.fused_step(
                t,
                et_t[a:b],
                g_t[a:b],
                h_t[a:b],
                score_np[lo:hi],
                1.0,
                _scratch("fused_m", (6, rc, rc, lanes), dt),
                _scratch("fused_v", (4, lanes), dt),
            )

        picks: list[int] = []
        gains: list[float] = []
        t0 = _CLOCK()
        for step in range(n_steps):
            if guard.stop(step, n_steps, need, t0):
                self._cut(guard, picks, n_steps, need, scores, eligible)
                break
            pos = _first_best(scores, eligible, maximize=True, rtol=self.rtol)
            picks.append(pos)
            eligible[pos] = False
            blocks, delta, jobs = self._rank_update(st, st.x[pos], st.et[pos].T, 1.0, workers)
            gains.append(delta)
            st.value = st.value - delta
            todo: list[Callable[[], None]] = list(jobs)
            if step + 1 < n_steps:
                blocks_t = np.ascontiguousarray(blocks.to(self.sdt).numpy().T)
                todo += [functools.partial(chunk, lo, hi) for lo, hi in bounds]
            for _ in workers.map(lambda job: job(), todo):
                pass
            self._tick()
        st.g = torch.from_numpy(fused.from_tiles(g_t, n_cand))
        h = torch.from_numpy(fused.from_tiles(h_t, n_cand))
        st.h = h + h.transpose(1, 2)
        return picks, gains

    def backward(self, st: _State, picks: list[int], n_keep: int, guard: _Guard | None = None) -> list[int]:
        """Backward pruning in the matrix dtype; returns the kept positions in forward order.

        With a ``guard`` that says stop, the remaining removals are made at once by the current scores
        (the smallest increases of ``tr(M^{-1} F)``, without updates between them), recorded in
        ``guard.events``.
        """
        guard = guard or _Guard()
        rc = int(st.et.shape[1])
        if self.device.type == "cpu" and _fused_step_enabled() and _span_backward(len(picks) * rc, self.big_d):
            # CPU only so far: the CUDA path keeps the backward pass its GPU figures were measured with.
            return self._backward_gram(st, picks, n_keep, guard)
        self._fold_lazy(st)
        with _Workers(self.n_threads) as workers:
            return self._backward(st, picks, n_keep, workers, guard)

    @staticmethod
    def _cut_backward(guard: _Guard, scores: Tensor, alive: Tensor, count: int, done: int) -> None:
        """Remove ``count`` alive picks of smallest removal score at once (guard stop)."""
        worst = _fill(-scores, alive, count)
        for j in worst:
            alive[j] = False
        guard.events["backward_stopped_at"] = done
        guard.events["removed_at_once"] = len(worst)

    def _pick_gram(self, mat: Tensor, x: Tensor, e: Tensor) -> Tensor:
        """``V^T mat V`` for the picks' factors ``V = [V_1 .. V_m]``, ``V_j = (I_r ⊗ x_j) E_j``, symmetrised.

        Both sides use the Kronecker structure: ``mat (I_r ⊗ x_j)`` for every pick is one GEMM of
        ``mat`` viewed as ``(D r) x d`` (``D^2 m`` multiply-adds, in chunks of picks so the
        ``D x r x chunk`` temporary stays small), and ``(I_r ⊗ x_i)^T`` on the left is one batched
        GEMM over the ``r`` row blocks (``D m^2 rc``), not a ``D``-long product per entry.
        """
        r, d = self.r, self.d
        m, _, rc = e.shape
        big_d = r * d
        step = max(1, (1 << 22) // (big_d * r))
        cols = []
        for lo in range(0, m, step):
            hi = min(m, lo + step)
            mb = matmul(mat.view(big_d * r, d), x[lo:hi].T.contiguous()).view(big_d, r, hi - lo)  # [row, b, j]
            cols.append(torch.einsum("xbj,jbq->xjq", mb, e[lo:hi]))  # mat V_j: D x chunk x rc
        mv = torch.cat(cols, dim=1).reshape(r, d, m * rc)
        t = torch.matmul(x, mv)  # r x m x (m rc): [a, i, (j, q)] = x_i^T (mat V_j)[a-block, q]
        gram = torch.einsum("iap,aic->ipc", e, t).reshape(m * rc, m * rc)
        return 0.5 * (gram + gram.T)

    def _pick_proj(self, cols: Tensor, x: Tensor, e: Tensor) -> Tensor:
        """``V^T cols`` (``m rc x K``) for ``D x K`` columns: one batched GEMM over the ``r`` row blocks."""
        r, d = self.r, self.d
        m, _, rc = e.shape
        t = torch.matmul(x, cols.reshape(r, d, -1))  # r x m x K
        return torch.einsum("iap,aik->ipk", e, t).reshape(m * rc, -1)

    def _fold_lazy(self, st: _State) -> None:
        """Apply the deferred forward updates to ``P`` and ``Q`` (one rank-K GEMM each) and drop them."""
        if st.lazy_u is not None and st.lazy_r is not None and st.lazy_k and st.q is not None:
            lu, lr = st.lazy_u[:, : st.lazy_k], st.lazy_r[:, : st.lazy_k]
            st.p.addmm_(lu, lu.T, alpha=-1.0)
            st.q.addmm_(torch.cat([lu, lr], 1), torch.cat([lr, lu], 1).T, alpha=-1.0)
        st.lazy_u = st.lazy_r = None
        st.lazy_k = 0

    def _backward_gram(self, st: _State, picks: list[int], n_keep: int, guard: _Guard) -> list[int]:
        """Backward pruning in the span of the picks (exact, no ``D x D`` update per removal).

        Everything a removal needs is a product ``V_i^T P V_j`` or ``V_i^T Q V_j`` between picks:
        ``g_i``, ``h_i`` are the diagonal blocks, and removing ``s`` (``P' = P + U~ U~^T``,
        ``Q' = Q + U~ R^^T + R^ U~^T``) changes the ``m rc x m rc`` matrices ``A = V^T P V``,
        ``C = V^T Q V`` by ``W W^T`` and ``W Z^T + Z W^T`` with ``W = A[:, s] L^{-T}``,
        ``Z = C[:, s] L^{-T} + (1/2) W S~`` (the formulas of :meth:`_rank_update` with both sides
        multiplied by ``V^T``). Building ``A`` and ``C`` costs ``2 (D^2 m + D m^2 rc)`` once; a removal
        ``3 (m rc)^2 rc``, against ``~8 D^2 rc`` for the rank updates of ``P`` and ``Q`` (k = 26, d = 128,
        B = 20: 0.54 s of backward before). ``P`` and ``Q`` are left as the forward pass ended.
        """
        assert st.q is not None
        mdt = self.mdt
        order = sorted(picks)  # ascending candidate position = ascending pool row
        idx = torch.tensor(order, dtype=torch.long, device=self.device)
        m = len(order)
        x = st.x[idx].to(mdt)
        e = st.et[idx].transpose(1, 2).to(mdt)  # m x r x rc
        rc = int(e.shape[2])
        gram_p = self._pick_gram(st.p, x, e)
        gram_q = self._pick_gram(st.q, x, e)
        if st.lazy_u is not None and st.lazy_r is not None and st.lazy_k:
            # The forward pass's deferred updates, seen from the picks: V^T U and V^T R (m rc x K).
            yu = self._pick_proj(st.lazy_u[:, : st.lazy_k], x, e)
            yr = self._pick_proj(st.lazy_r[:, : st.lazy_k], x, e)
            gram_p -= yu @ yu.T
            gram_q -= yu @ yr.T + yr @ yu.T
            gram_p = 0.5 * (gram_p + gram_p.T)
            gram_q = 0.5 * (gram_q + gram_q.T)
        eye = torch.eye(rc, dtype=mdt, device=self.device)
        alive = torch.ones(m, dtype=torch.bool, device=self.device)
        rtol = _TIE_RTOL.get(mdt, 1e-5)
        t0 = _CLOCK()
        for done in range(m - n_keep):
            g = gram_p.view(m, rc, m, rc).diagonal(dim1=0, dim2=2).permute(2, 0, 1).contiguous()
            h = gram_q.view(m, rc, m, rc).diagonal(dim1=0, dim2=2).permute(2, 0, 1).contiguous()
            scores = trace_solve_scores(g, h, -1.0)
            if guard.stop(done, m - n_keep, m - n_keep, t0):
                self._cut_backward(guard, scores, alive, m - n_keep - done, done)
                break
            j = _first_best(scores, alive, maximize=False, rtol=rtol)
            alive[j] = False
            sl = slice(j * rc, (j + 1) * rc)
            g_s = gram_p[sl, sl]
            chol, info = torch.linalg.cholesky_ex(eye - 0.5 * (g_s + g_s.T))
            if int(info) != 0:
                raise InputDataError(
                    "BAIT: the Woodbury system for removing a point is not positive definite; the embeddings "
                    "or probabilities are too ill-conditioned for this lam (use a larger lam or float64 input)"
                )
            w = torch.linalg.solve_triangular(chol, gram_p[:, sl].T, upper=False).T  # A[:, s] L^{-T}
            r_t = torch.linalg.solve_triangular(chol, gram_q[:, sl].T, upper=False).T  # C[:, s] L^{-T}
            h_s = gram_q[sl, sl]
            h_s = 0.5 * (h_s + h_s.T)
            y = torch.linalg.solve_triangular(chol, h_s, upper=False)
            s_t = torch.linalg.solve_triangular(chol, y.T, upper=False)  # L^{-1} h_s L^{-T}
            z = r_t + 0.5 * (w @ s_t)
            st.value += float(s_t.diagonal().sum())
            gram_p.addmm_(w, w.T)
            gram_q.addmm_(torch.cat([w, z], 1), torch.cat([z, w], 1).T)
            self._tick()
        kept = {order[j] for j in range(m) if bool(alive[j])}
        return [p for p in picks if p in kept]

    def _backward(self, st: _State, picks: list[int], n_keep: int, workers: _Workers, guard: _Guard) -> list[int]:
        assert st.q is not None
        mdt = self.mdt
        order = sorted(picks)  # ascending candidate position = ascending pool row
        idx = torch.tensor(order, dtype=torch.long, device=self.device)
        x = st.x[idx].to(mdt)
        e = st.et[idx].transpose(1, 2).to(mdt)
        et = e.transpose(1, 2)
        # Fresh g, h of the picks from the current P, Q (float64 when P, Q are).
        g = et @ block_quadratic_forms(x, st.p) @ e
        h = et @ block_quadratic_forms(x, st.q) @ e
        alive = torch.ones(len(order), dtype=torch.bool, device=self.device)
        rtol = _TIE_RTOL.get(mdt, 1e-5)
        t0 = _CLOCK()
        n_remove = len(order) - n_keep
        for done in range(n_remove):
            scores = trace_solve_scores(g, h, -1.0)
            if guard.stop(done, n_remove, n_remove, t0):
                self._cut_backward(guard, scores, alive, n_remove - done, done)
                break
            j = _first_best(scores, alive, maximize=False, rtol=rtol)
            alive[j] = False
            blocks, delta, jobs = self._rank_update(st, x[j], e[j], -1.0, workers)
            for _ in workers.map(lambda job: job(), jobs):
                pass
            st.value += delta
            self._update_rows(x, et, g, h, blocks, -1.0)
            self._tick()
        kept = {order[j] for j in range(len(order)) if bool(alive[j])}
        return [p for p in picks if p in kept]


# --------------------------------------------------------------------------------------------------
# Driver shared by the strategies
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
    """Choose what to run (module docstring of selection/scale.py): forced kinds as asked, auto by cost.

    Auto: exact when its estimate fits ``time_budget_s`` and ``max_memory_gb``; else, among the plans
    built from a pre-filter, a PCA dimension, a class approximation (top-c by the mass rule, or top +
    sampled columns) and forward-only picking, the one with the smallest estimated gap whose estimate
    fits both budgets (ties: the faster). With none inside the time budget, the fastest that fits memory.
    """
    r = reduced_rank(problem.probs)
    b = problem.batch_size
    n_design = int(problem.in_design.numel())
    n_cand_all = int(problem.candidates.numel())
    d = problem.d
    dtypes = [torch.float64] if problem.dtype == torch.float64 else [torch.float64, problem.dtype]
    threads = resolve_threads(problem.device)
    exact_obj_mem = (
        estimate_bytes(n_cand=0, d=d, r=r, matrix_dtype=torch.float64, state_dtype=torch.float64, mode=mode)
        <= budget_gb * _GB
    )
    exact_obj_s = _objective_seconds(problem, r, mode)
    # The exact objective of an approximate plan's set is computed when it fits memory and a quarter of
    # the time budget (else the approximate one is reported).
    objective_ok = mode != "logdet" and exact_obj_mem and exact_obj_s <= 0.25 * time_budget_s

    def cost(
        n_keep: int, rows: int, dim: int, rc: int, ov: float, approximate: bool
    ) -> tuple[dict[str, float], int, bool]:
        n_fwd = b if not backward else min(n_keep, max(b, math.floor(ov * b + 1e-9)))
        obj = approximate and objective_ok
        phases = estimate_phases(
            n_rows=rows,
            n_cand=n_keep,
            d=dim,
            r=r,
            rc=rc,
            n_forward=n_fwd,
            n_backward=(n_fwd - b) if backward else 0,
            n_design=n_design,
            mode=mode,
            device=problem.device,
            dtype=problem.dtype,
            pca_from=d if dim != d else None,
            n_pool=problem.n,
            objective=obj,
            threads=threads,
        )
        mem = min(
            estimate_bytes(n_cand=n_keep, d=dim, r=r, matrix_dtype=dt, state_dtype=problem.dtype, mode=mode, rc=rc)
            for dt in dtypes
        )
        return phases, mem, obj

    def make(
        kind_: str,
        dim: int | None,
        classes: int | None,
        pf: Prefilter | None,
        reason: str,
        samples: int = 0,
        ov: float | None = None,
    ) -> _Plan:
        n_keep = n_cand_all if pf is None else min(n_cand_all, pf.top + pf.random)
        rows = problem.n if pf is None else n_design + n_keep
        rc = r if classes is None else classes + samples
        approximate = dim is not None or classes is not None or pf is not None
        ov_run = oversample if ov is None else ov
        phases, mem, obj = cost(n_keep, rows, d if dim is None else dim, rc, ov_run, approximate)
        plan = _Plan(kind_, dim, classes, pf, reason, float(sum(phases.values())), mem, samples=samples)
        plan.estimated_setup_s = phases["setup"]
        plan.estimated_greedy_s = phases["forward"] + phases["backward"]
        plan.oversample = ov
        plan.objective = obj
        return plan

    def fits(p: _Plan) -> bool:
        return p.estimated_bytes <= budget_gb * _GB and p.estimated_s <= time_budget_s

    explicit = prefilter if isinstance(prefilter, Prefilter) else None
    if explicit is not None and min(n_cand_all, explicit.top + explicit.random) < b:
        raise ParameterError(
            f"prefilter keeps {min(n_cand_all, explicit.top + explicit.random)} candidates, fewer than "
            f"batch_size={b}; raise 'top' or 'random'"
        )
    if kind == "exact":
        return make("exact", None, None, explicit, "forced (approx='exact')")
    if kind in ("pca", "pca+topc", "topc", "sampled", "pca+sampled"):
        classes = None
        samples = 0
        if kind in ("topc", "pca+topc") and problem.probs is not None:
            classes = approx_classes if approx_classes is not None else auto_classes(problem.probs, lam=lam)
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
                while dim > 1 and make(kind, dim, classes, explicit, "", samples).estimated_bytes > budget_gb * _GB:
                    dim -= 1
            else:
                dim = approx_dim
        return make(kind, dim, classes, explicit, f"forced (approx={kind!r})", samples)

    # auto
    exact = make("exact", None, None, explicit, "fits the budgets")
    exact.estimated_gap = 0.0
    if fits(exact):
        return exact
    over = (
        f"exact needs ~{exact.estimated_s:.0f} s and {exact.estimated_bytes / _GB:.2f} GB "
        f"(budgets {time_budget_s:g} s, {budget_gb:g} GB)"
    )
    # The options of each knob with its estimated gap.
    pf_opts: list[tuple[Prefilter | None, float, str]] = [(explicit, 0.0, "")]
    n_fwd_max = min(n_cand_all, max(b, math.floor(oversample * b + 1e-9)))
    if prefilter == "auto":
        big_pool = n_cand_all > PREFILTER_MIN_CANDIDATES
        keeps = ladder_prefilter(n_cand_all) if big_pool else []
        floor = max(PREFILTER_FLOOR, 4 * n_fwd_max)
        keep = (keeps[-1] if keeps else n_cand_all) // 2
        while keep >= floor:
            keeps.append(keep)
            keep //= 2
        for i, keep in enumerate(keeps):
            halvings = math.log2(n_cand_all / keep)
            free = big_pool and keep >= scale.PREFILTER_MIN_KEEP
            # Free halvings still rank below no pre-filter, larger keeps first.
            gap = 1e-6 * (i + 1) if free else GAP_PER_PREFILTER_HALVING * halvings
            n_top = round(PREFILTER_TOP_FRACTION * keep)
            pf_opts.append(
                (Prefilter(top=n_top, random=keep - n_top, score="gradnorm"), gap, f"pre-filtered to {keep} candidates")
            )
    dims = [d, *(ladder_dims(d) if approx_dim is None else [approx_dim])]
    kept = _variance_kept(problem, dims) if len(dims) > 1 else {d: 1.0}
    dim_opts = [(dim, GAP_PER_PCA_VARIANCE * (1.0 - kept[dim])) for dim in dims]
    cls_opts: list[tuple[int | None, int, float]] = [(None, 0, 0.0)]  # (top classes, samples, gap)
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
    if backward and oversample > 1:
        ov_opts.append((1.0, GAP_FORWARD_ONLY))

    plans: list[_Plan] = []
    for pf_opt, g_pf, why_pf in pf_opts:
        for dim, g_dim in dim_opts:
            for c_top, smp, g_cls in cls_opts:
                for ov, g_ov in ov_opts:
                    if pf_opt is explicit and dim == d and c_top is None and ov == oversample:
                        plans.append(exact)
                        continue
                    kind_ = "exact" if c_top is None else ("sampled" if smp else "topc")
                    if dim != d:
                        kind_ = "pca" if c_top is None else f"pca+{kind_}"
                    ov_plan = None if ov == oversample else ov
                    plan = make(kind_, None if dim == d else dim, c_top, pf_opt, "", smp, ov_plan)
                    plan.estimated_gap = g_pf + g_dim + g_cls + g_ov
                    plan.reason = "; ".join(x for x in (over, why_pf) if x)
                    plans.append(plan)
    in_memory = [p for p in plans if p.estimated_bytes <= budget_gb * _GB]
    if not in_memory:
        cheapest = min(plans, key=lambda p: p.estimated_bytes)
        raise MemoryBudgetError(
            f"no BAIT plan fits max_memory_gb={budget_gb:g}: {over}; the smallest plan tried "
            f"({cheapest.describe()}) needs {cheapest.estimated_bytes / _GB:.2f} GB. Raise max_memory_gb, force an "
            "approximation (approx='pca' with a small approx_dim, approx='topc' with approx_classes), or "
            "pre-filter the pool (prefilter={'top': N, 'random': M})."
        )

    def gave_up(p: _Plan) -> _Plan:
        if p.prefilter is not None and p.prefilter is not explicit:
            keep = p.prefilter.top + p.prefilter.random
            p.gave_up.append(f"candidates: pre-filtered to {keep} of {n_cand_all}")
        if p.dim is not None:
            p.gave_up.append(
                f"dimensions: PCA to {p.dim} of {d} ({100 * (1 - kept[p.dim]):.1f} % of the Fisher-weighted "
                "embedding variance dropped)"
            )
        if p.classes is not None:
            rank = p.classes + p.samples
            how = f"top {p.classes}" + (f" + {p.samples} sampled pseudo-labels" if p.samples else " (rest merged)")
            outside = 1 - cls_kept.get(rank, 1.0)
            p.gave_up.append(
                f"classes: {how} per candidate instead of {r} ({100 * outside:.1f} % of the class Fisher "
                f"outside the top {rank} classes)"
            )
        if p.oversample is not None:
            p.gave_up.append(f"oversampling: {p.oversample:g}x forward picks instead of {oversample:g}x")
        return p

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
            return gave_up(alt)
    if best is None:
        best = min(in_memory, key=lambda p: (p.estimated_s, p.estimated_gap or 0.0))
        best.reason = (
            f"{best.reason}; no plan fits the time budget: the fastest that fits memory (the guard holds the time)"
        )
    return gave_up(best)


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


def _prefiltered(problem: Problem, pf: Prefilter, weights: Tensor | None) -> tuple[Problem, Tensor, Tensor, int]:
    """The sub-problem of design rows plus kept candidates, its stratified Fisher weights and row map."""
    top_rows, rand_rows, w_rand = prefilter_candidates(
        problem.X, problem.probs, problem.candidates, pf, seed=problem.seed, chunk_size=problem.chunk_size
    )
    design = problem.in_design
    keep = torch.sort(torch.cat([top_rows, rand_rows])).values
    rows = torch.sort(torch.cat([design, keep])).values
    w = torch.ones(rows.numel(), dtype=torch.float64, device=problem.device)
    w[torch.searchsorted(rows, rand_rows)] = w_rand
    if weights is not None:
        w = w * weights[rows]
    sub = Problem(
        X=problem.X[rows],
        probs=None if problem.probs is None else problem.probs[rows],
        labeled=torch.searchsorted(rows, problem.labeled),
        reserved=torch.searchsorted(rows, problem.reserved),
        candidates=torch.searchsorted(rows, keep),
        batch_size=problem.batch_size,
        task=problem.task,
        seed=problem.seed,
        chunk_size=problem.chunk_size,
        progress=problem.progress,
    )
    return sub, w / w.sum(), rows, int(top_rows.numel())


def _run(
    problem: Problem,
    *,
    mode: Mode,
    lam: float,
    oversample: float,
    convention: str,
    approx: str | None,
    approx_dim: int | None,
    fisher_weights: Any,
    max_memory_gb: float,
    backward: bool,
    approx_classes: int | None = None,
    prefilter: Any = None,
    time_budget_s: float = DEFAULT_TIME_BUDGET_S,
    approx_samples: int | None = None,
) -> StrategyOutput:
    t_start = time.perf_counter()
    lam = _check_lam(lam)
    oversample = _check_oversample(oversample)
    budget = _check_budget(max_memory_gb)
    time_budget = check_time_budget(time_budget_s)
    kind = _check_approx(approx, approx_dim, approx_classes, problem, approx_samples)
    # The auto plan's promise: the call returns within 1.5x time_budget_s (the guard stops the greedy
    # passes at GUARD_FACTOR x; forced plans run as asked).
    guard = _Guard(deadline=_CLOCK() + GUARD_FACTOR * time_budget if kind == "auto" else None)
    pf_spec = parse_prefilter(prefilter, regression=problem.probs is None)
    if convention not in CONVENTIONS:
        raise ParameterError(f"unknown convention {convention!r}; expected one of {CONVENTIONS}")
    weights = _check_fisher_weights(fisher_weights, problem)
    if problem.probs is not None and problem.probs.shape[1] < 2:
        raise InputDataError("classification needs at least 2 classes")
    if problem.dtype not in (torch.float32, torch.float64):
        raise InputDataError(f"BAIT needs float32 or float64 embeddings, got {problem.dtype}")

    calibration_s = 0.0
    if kind == "auto":
        time_budget_plan, calibration_s = _budget_after_rates(problem, time_budget, guard)
    else:
        time_budget_plan = time_budget
    with torch.no_grad():
        plan = _plan(
            problem,
            kind=kind,
            approx_dim=approx_dim,
            approx_classes=approx_classes,
            prefilter=pf_spec,
            mode=mode,
            oversample=oversample,
            backward=backward,
            budget_gb=budget,
            time_budget_s=time_budget_plan,
            lam=lam,
            approx_samples=approx_samples,
        )
        t_plan = time.perf_counter()
        work, work_weights, rows_map, n_top = problem, weights, None, 0
        if plan.prefilter is not None:
            work, work_weights, rows_map, n_top = _prefiltered(problem, plan.prefilter, weights)
        out = _run_core(
            work,
            mode=mode,
            lam=lam,
            oversample=oversample,
            convention=convention,
            plan=plan,
            weights=work_weights,
            budget=budget,
            backward=backward,
            guard=guard,
            # Auto plans compute the exact objective of an approximate set only where the plan said it fits;
            # a pre-filtered run computes it below, over the whole pool.
            exact_objective_ok=(plan.objective or kind != "auto") and rows_map is None,
        )
    diag = out.diagnostics
    approx_info = plan.describe()
    approx_info["requested"] = kind
    if kind == "auto":
        approx_info["rates"] = machine_rates(problem.device, problem.dtype, resolve_threads(problem.device)).describe()
        approx_info["calibration_seconds"] = float(f"{calibration_s:.3g}")
        approx_info["planned_budget_seconds"] = float(f"{time_budget_plan:.3g}")
        _observe_timings(problem, plan, diag)
    diag["approximation"] = approx_info
    diag["timings"]["plan"] = t_plan - t_start
    if rows_map is None:
        return out
    # Map back to pool rows; the objective so far used the stratified estimate of F.
    indices = rows_map[torch.as_tensor(out.indices, device=problem.device)].cpu().numpy().astype(np.int64)
    if "forward_indices" in diag:
        diag["forward_indices"] = rows_map[torch.as_tensor(diag["forward_indices"])].cpu().tolist()
    approx_info["prefilter"]["kept_top"] = n_top
    approx_info["prefilter"]["kept_random"] = int(work.candidates.numel()) - n_top
    objective = out.objective
    if mode != "logdet" and objective is not None:
        diag["prefiltered_objective"] = objective
        diag["objective_kind"] = "prefiltered"
        r = reduced_rank(problem.probs)
        big_d = r * problem.d
        exact_s = _objective_seconds(problem, r, mode)
        if 3 * big_d * big_d * 8 <= budget * _GB and exact_s <= min(0.25 * time_budget, guard.left()):
            n_design = int(problem.in_design.numel())
            w_design, w_picked = design_weights(convention, n_design, problem.batch_size)
            objective = exact_objective(
                problem.X,
                problem.probs,
                problem.in_design,
                torch.as_tensor(indices, device=problem.device),
                lam=lam,
                w_design=w_design,
                w_picked=w_picked,
                fisher_weights=weights,
                identity_fisher=mode == "identity",
                chunk_size=problem.chunk_size,
            )
            diag["exact_objective"] = objective
            diag["objective_kind"] = "exact"
    diag["timings"]["total"] = time.perf_counter() - t_start
    return StrategyOutput(indices=indices, objective=objective, diagnostics=diag)


#: Seconds the auto plan keeps aside for its own work (the gap model's subsamples, the pre-filter's
#: scores) and the return, on top of what the call has spent before planning: PLAN_RESERVE_S, or
#: PLAN_RESERVE_FRACTION of the budget when that is less.
PLAN_RESERVE_S = 0.05
PLAN_RESERVE_FRACTION = 0.05


def _budget_after_rates(problem: Problem, time_budget: float, guard: _Guard) -> tuple[float, float]:
    """Rates of this machine (measured on a process's first call, bounded by the budget: see
    selection/calibrate.py), then ``(seconds left for the plan's estimate, seconds the rates took)``.

    Everything the call spent so far (validation, the measurement, the compiled kernel's first load)
    counts against ``time_budget``.
    """
    t0 = _CLOCK()
    machine_rates(problem.device, problem.dtype, resolve_threads(problem.device), budget_s=time_budget)
    now = _CLOCK()
    start = (guard.deadline or now) - GUARD_FACTOR * time_budget
    reserve = min(PLAN_RESERVE_S, PLAN_RESERVE_FRACTION * time_budget)
    return max(1e-3, time_budget - (now - start) - reserve), now - t0


def _observe_timings(problem: Problem, plan: _Plan, diag: dict[str, Any]) -> None:
    """Fold the measured setup (and greedy passes, when the guard did not cut them) into the rates."""
    timings = diag.get("timings", {})
    device, dtype, threads = problem.device, problem.dtype, resolve_threads(problem.device)
    if "setup" in timings:
        observe(device, dtype, threads, phase="setup", estimated=plan.estimated_setup_s, measured=timings["setup"])
    if "deadline" not in diag and "forward" in timings:
        greedy = timings["forward"] + timings.get("backward", 0.0)
        observe(device, dtype, threads, phase="greedy", estimated=plan.estimated_greedy_s, measured=greedy)


def _objective_seconds(problem: Problem, r: int, mode: Mode) -> float:
    """Estimated seconds of :func:`selection.fisher.exact_objective` over the whole pool."""
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


def _run_core(
    problem: Problem,
    *,
    mode: Mode,
    lam: float,
    oversample: float,
    convention: str,
    plan: _Plan,
    weights: Tensor | None,
    budget: float,
    backward: bool,
    guard: _Guard | None = None,
    exact_objective_ok: bool = True,
) -> StrategyOutput:
    t_start = time.perf_counter()
    guard = guard or _Guard()
    if plan.oversample is not None:
        oversample = plan.oversample
    r = reduced_rank(problem.probs)
    n_threads = resolve_threads(problem.device)
    b = problem.batch_size
    n_cand = int(problem.candidates.numel())
    n_design = int(problem.in_design.numel())
    w_design, w_picked = design_weights(convention, n_design, b)
    n_forward = b if not backward else min(n_cand, max(b, math.floor(oversample * b + 1e-9)))
    approximate = plan.dim is not None or plan.classes is not None

    diag: dict[str, Any] = {
        "device": str(problem.device),
        "dtype": str(problem.dtype).replace("torch.", ""),
        "torch_threads": torch.get_num_threads(),
        "threads": n_threads,
        "lam": lam,
        "convention": convention,
        "w_labeled": w_design,
        "w_selected": w_picked,
    }

    x = problem.X
    x_dim = problem.d
    rc = r if plan.classes is None else plan.classes + plan.samples
    with torch.no_grad():
        if plan.dim is not None:
            basis, var_kept = fisher_pca_basis(x, problem.probs, weights, plan.dim, chunk_size=problem.chunk_size)
            x = x @ basis.to(problem.dtype)  # n x approx_dim, in the pool dtype (no float64 copy of X)
            x_dim = plan.dim
            diag["approx_dim"] = plan.dim
            diag["approx_variance_kept"] = var_kept
        if plan.classes is not None and problem.probs is not None:
            diag["approx_classes"] = plan.classes
            diag["approx_rest_mass"] = rest_mass(problem.probs[problem.candidates], plan.classes)
            if plan.samples:
                diag["approx_samples"] = plan.samples
        mdt = _choose_matrix_dtype(problem, x_dim, r, mode, budget, rc=rc)
        diag["D"] = r * x_dim
        diag["matrix_dtype"] = str(mdt).replace("torch.", "")

        engine = _Bait(
            problem,
            x,
            lam=lam,
            w_design=w_design,
            w_picked=w_picked,
            mode=mode,
            fisher_weights=weights,
            matrix_dtype=mdt,
            n_threads=n_threads,
            classes=plan.classes,
            samples=plan.samples,
        )
        n_backward = n_forward - b if backward else 0
        state = engine.setup(n_forward + n_backward)
        t_setup = time.perf_counter()
        picks, gains = engine.forward(state, n_forward, guard, need=b)
        t_fwd = time.perf_counter()
        if len(picks) > b and guard.past():
            # No time left to prune: the first B forward picks (the forward-only greedy's batch).
            guard.events["backward_skipped"] = len(picks) - b
            kept = picks[:b]
        elif backward and len(picks) > b:
            kept = engine.backward(state, picks, b, guard)
        else:
            kept = picks
        t_bwd = time.perf_counter()

    rows = problem.candidates[torch.tensor(kept, dtype=torch.long, device=problem.device)]
    indices = rows.cpu().numpy().astype(np.int64)
    diag["timings"] = {"setup": t_setup - t_start, "forward": t_fwd - t_setup, "backward": t_bwd - t_fwd}
    diag["steps"] = {"forward": len(gains), "backward": len(picks) - len(kept)}
    if guard.events:
        diag["deadline"] = dict(guard.events)
    diag["p0_method"] = state.info.get("p0")
    diag["pq_updates"] = state.info.get("pq_updates", "in place")
    if backward:
        fwd_rows = problem.candidates[torch.tensor(picks, dtype=torch.long, device=problem.device)]
        diag["forward_indices"] = fwd_rows.cpu().tolist()

    objective: float | None
    if mode == "logdet":
        null = problem.d * math.log(lam) if problem.probs is not None else 0.0
        diag["logdet"] = state.value + null
        diag["logdet_gain"] = float(sum(gains))
        diag["forward_gains"] = gains
        objective = None
        if approximate:
            diag["objective_kind"] = "approximate"
    else:
        objective = state.value
        if mode == "identity" and problem.probs is not None:
            objective += x_dim / lam  # softmax null direction of the (projected) parameter space
        cut = any(key in guard.events for key in ("filled", "removed_at_once", "backward_skipped"))
        if approximate or cut:
            diag["approximate_objective"] = objective
            diag["objective_kind"] = "approximate"
            if cut:
                # The engine's value is not the returned set's (picks filled or removed without updates).
                objective = None
                diag["objective_kind"] = "none: the deadline cut the greedy passes"
            fits = estimate_bytes(
                n_cand=0, d=problem.d, r=r, matrix_dtype=torch.float64, state_dtype=torch.float64, mode=mode
            )
            if fits <= budget * _GB and exact_objective_ok and _objective_seconds(problem, r, mode) <= guard.left():
                with torch.no_grad():
                    exact = exact_objective(
                        problem.X,
                        problem.probs,
                        problem.in_design,
                        rows,
                        lam=lam,
                        w_design=w_design,
                        w_picked=w_picked,
                        fisher_weights=weights,
                        identity_fisher=mode == "identity",
                        chunk_size=problem.chunk_size,
                    )
                diag["exact_objective"] = exact
                diag["objective_kind"] = "exact"
                objective = exact
        diag["forward_gains"] = gains
    diag["timings"]["total"] = time.perf_counter() - t_start
    return StrategyOutput(indices=indices, objective=objective, diagnostics=diag)


@register(
    "bait",
    tasks=("classification", "regression"),
    summary="BAIT: greedy forward-backward minimisation of tr(M^-1 F) (Fisher trace), exact and structured",
)
def bait(
    problem: Problem,
    *,
    lam: float = DEFAULT_LAM,
    oversample: float = 2,
    convention: str = "reference",
    approx: str | None = None,
    approx_dim: int | None = None,
    approx_classes: int | None = None,
    approx_samples: int | None = None,
    prefilter: Any = None,
    time_budget_s: float = DEFAULT_TIME_BUDGET_S,
    fisher_weights: Any = None,
    max_memory_gb: float = 8.0,
) -> StrategyOutput:
    """BAIT selection (Ash et al. 2021, Algorithm 1), exact, without the ``n x dk x k`` tensor.

    Args:
        problem: the validated pool (``X`` is ``n x d``, ``probs`` ``n x k`` or ``None``).
        lam: ridge ``lam > 0`` of ``M`` (default :data:`DEFAULT_LAM`, chosen by experiment 5).
        oversample: the forward pass picks ``min(oversample * B, n_C)`` points (``1`` = forward only).
        convention: weights of labeled/reserved and picked rows in ``M``: ``"reference"``
            (authors' code), ``"paper"`` or ``"sum"`` (see the module docstring).
        approx: ``None``/``"auto"``: exact BAIT whenever the cost model (selection/scale.py, rates
            measured on this machine by selection/calibrate.py) says it fits ``time_budget_s`` and
            ``max_memory_gb``, else the plan of smallest estimated gap that fits, built from
            pre-filtering, a PCA projection, a class approximation (top-``c``, or top-``c`` plus
            sampled pseudo-labels) and forward-only picking; a guard stops the greedy passes so the call
            returns within 1.5x ``time_budget_s`` (docs/algorithm-many-classes.md).
            ``"exact"``/``"none"``: exact, always (no automatic pre-filter, no guard); ``"pca"``:
            select on embeddings projected onto the top ``approx_dim`` eigenvectors of the
            Fisher-weighted pool second moment; ``"topc"``: each candidate's class Fisher truncated to
            its top ``approx_classes`` classes (the rest merged into one class: a PSD lower bound);
            ``"sampled"``: the top ``approx_classes`` classes plus ``approx_samples`` pseudo-labels drawn
            from the rest (an unbiased estimate of the class Fisher, rank ``c + s``);
            ``"pca+topc"``, ``"pca+sampled"``: both. The plan is ``diagnostics["approximation"]``.
        approx_dim: projected dimension for ``"pca"`` (default ``d // 4``, shrunk to fit).
        approx_classes: classes kept per candidate for ``"topc"`` (default: the fewest that leave at
            most 1 % mean probability mass outside) or ``"sampled"`` (default 12, may be 0).
        approx_samples: pseudo-labels per candidate for ``"sampled"`` (default: 16 columns in all).
        prefilter: ``None``/``"auto"`` (pre-filter only when auto planning needs to), ``"none"``/``False``,
            or ``{"top": N, "random": M, "score": "gradnorm" | "margin", "seed": s}``: run BAIT on the
            ``N`` best candidates by the score plus ``M`` drawn at random from the others, with ``F``
            estimated from the rows kept.
        time_budget_s: time budget of the auto plan (seconds): its estimate fits it, and the call
            returns within 1.5x of it (the guard completes the batch cheaply if the estimate was short).
        fisher_weights: optional ``n`` nonnegative row weights; ``F`` is their weighted mean of ``I(x)``.
        max_memory_gb: budget for the ``D x D`` matrices and per-candidate state.

    Returns:
        Kept picks (pool row indices, forward order), ``tr(M^{-1}F)`` of the set, diagnostics.

    Raises:
        ParameterError: a parameter is out of range.
        MemoryBudgetError: forced exact BAIT exceeds ``max_memory_gb``, or no plan fits the budgets.
    """
    return _run(
        problem,
        mode="fisher",
        lam=lam,
        oversample=oversample,
        convention=convention,
        approx=approx,
        approx_dim=approx_dim,
        fisher_weights=fisher_weights,
        max_memory_gb=max_memory_gb,
        backward=True,
        approx_classes=approx_classes,
        approx_samples=approx_samples,
        prefilter=prefilter,
        time_budget_s=time_budget_s,
    )


@register(
    "bait_nofisher",
    tasks=("classification", "regression"),
    summary="BAIT ablation with the pool Fisher replaced by the identity: minimises tr(M^-1)",
)
def bait_nofisher(
    problem: Problem,
    *,
    lam: float = DEFAULT_LAM,
    oversample: float = 2,
    convention: str = "reference",
    approx: str | None = None,
    approx_dim: int | None = None,
    max_memory_gb: float = 8.0,
) -> StrategyOutput:
    """BAIT with ``F = I`` (the paper's "no Fisher" ablation); same passes and conventions as :func:`bait`.

    Args:
        problem: the validated pool.
        lam: ridge ``lam > 0`` (default :data:`DEFAULT_LAM`, as :func:`bait`).
        oversample: forward picks ``min(oversample * B, n_C)``.
        convention: ``"reference"``, ``"paper"`` or ``"sum"``.
        approx: ``None`` or ``"pca"``.
        approx_dim: projected dimension for ``approx="pca"``.
        max_memory_gb: memory budget.

    Returns:
        Kept picks in forward order and ``tr(M^{-1})`` of the set (full ``k d`` space).

    Raises:
        ParameterError: a parameter is out of range.
        MemoryBudgetError: the exact matrices exceed ``max_memory_gb``.
    """
    return _run(
        problem,
        mode="identity",
        lam=lam,
        oversample=oversample,
        convention=convention,
        approx=approx,
        approx_dim=approx_dim,
        fisher_weights=None,
        max_memory_gb=max_memory_gb,
        backward=True,
    )


@register(
    "logdet_fisher",
    tasks=("classification",),
    summary="Greedy maximisation of log det(M) with the full pointwise Fisher (paper appendix, Alg. 3)",
)
def logdet_fisher(
    problem: Problem,
    *,
    lam: float = 1.0,
    convention: str = "sum",
    approx: str | None = None,
    approx_dim: int | None = None,
    max_memory_gb: float = 8.0,
) -> StrategyOutput:
    """Greedy ``log det`` (D-optimal) selection with ``I(x)``: each pick maximises ``log det(I + g_x)``.

    The default ``convention="sum"`` (``M = lam I + sum_{design + picked} I(x)``) matches
    ``logdet_rank1``, so the two appendix variants differ only in the embedding;
    ``convention="paper"`` scales the labeled sum by ``1/n_L`` as the appendix algorithm does.
    Forward only, ``B`` picks.

    Args:
        problem: the validated pool.
        lam: ridge ``lam > 0``.
        convention: ``"sum"``, ``"paper"`` or ``"reference"``.
        approx: ``None`` or ``"pca"``.
        approx_dim: projected dimension for ``approx="pca"``.
        max_memory_gb: memory budget.

    Returns:
        Picks in order; ``objective`` is ``None``; ``diagnostics["logdet"]`` is ``log det M`` of the
        final set (full ``k d`` space) and ``diagnostics["logdet_gain"]`` its increase over ``M_0``.

    Raises:
        ParameterError: a parameter is out of range.
        MemoryBudgetError: the exact matrices exceed ``max_memory_gb``.
    """
    return _run(
        problem,
        mode="logdet",
        lam=lam,
        oversample=1,
        convention=convention,
        approx=approx,
        approx_dim=approx_dim,
        fisher_weights=None,
        max_memory_gb=max_memory_gb,
        backward=False,
    )

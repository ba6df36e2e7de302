"""The exact engine: per-candidate state, the greedy forward and backward steps, Woodbury updates.

Exact fast BAIT as derived in docs/algorithm.md: per-candidate ``r x r`` matrices ``g_x = V_x^T P V_x``
and ``h_x = V_x^T Q V_x`` (``P = M^{-1}``, ``Q = P F P``) formed from ``d x d`` blocks, kept current by
symmetric square-root rank-``r`` updates with one pool GEMM per greedy step (conventions: the package
docstring of :mod:`selection.bait`). :class:`_Bait` runs on one (possibly projected, pre-filtered or
class-approximated) problem; the driver (:mod:`selection.bait.driver`) decides which.

The forward pass's steps on CPU run the compiled per-candidate kernel of :mod:`selection.fused` (one
OpenBLAS GEMM and one kernel call per chunk of candidates). The chunked torch/numpy step
(:meth:`_Bait._update_rows`) is what the kernel does not cover: ``log det`` mode, rank-one problems
(regression, binary), the CUDA path, and the backward pass on ``P`` and ``Q`` when the picks' span is not
smaller than ``D``. A guard (:class:`_Guard`) stops the passes at the auto plan's deadline.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import torch

from selection import fused
from selection.bait.approx import sampled_class_factor
from selection.bait.threads import _scratch, _Workers
from selection.calibrate import dense_threads
from selection.errors import InputDataError
from selection.fisher import kron_sum, reduced_rank, row_factors
from selection.linalg import (
    accumulate_kron_upper,
    block_contract,
    block_matvec,
    block_quadratic_forms,
    logdet_scores,
    matmul,
    rank_one_chunk,
    rank_one_update,
    symmetrize_blocks,
    torch_threads,
    trace_solve_scores,
)
from selection.problem import Problem

Tensor = torch.Tensor
#: What the engine minimises or maximises: ``tr(M^{-1} F)`` (``"fisher"``), ``tr(M^{-1})``
#: (``"identity"``, ``F = I``) or ``log det M`` (``"logdet"``, forward only).
Mode = Literal["fisher", "identity", "logdet"]

_TIE_RTOL = {torch.float64: 1e-10, torch.float32: 1e-5}


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


def _span_backward(span: int, big_d: int) -> bool:
    """Prune in the picks' span (``span = 2B rc`` columns) rather than on ``P`` and ``Q`` (``D = big_d``)?

    When the span is smaller than ``D``: a removal then costs ``3 span^2 rc`` instead of ``~3 D^2 rc``
    (with ``span >= D``, e.g. B = 100 at k = 10, d = 128, the ``D x D`` updates are cheaper).
    """
    return span < big_d


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


def _now() -> float:
    """:data:`_CLOCK`'s time, read at the call (so a replaced clock is seen by every module)."""
    return _CLOCK()


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
        # Class approximations (selection/bait/approx.py): each candidate's factor keeps its top `classes`
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
        """Build ``F``, ``P_0``, ``Q_0`` and the candidates' ``g``, ``h`` (docs/algorithm.md, 3e).

        Args:
            n_steps_total: forward plus backward steps to come (for progress reports).

        Returns:
            The state: ``x`` ``(n_C, d)``, ``et`` ``(n_C, rc, r)``, ``g`` and ``h`` ``(n_C, rc, rc)``
            (``h`` ``None`` in logdet mode), ``p`` and ``q`` ``(D, D)``, and the objective's value.
        """
        cs = self.problem.chunk_size
        n_cand = int(self.problem.candidates.numel())
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

        fmat = self._pool_fisher(f_cs)
        p, q, logdet0, low_rank, method = self._initial_inverse(fmat)
        # Symmetrise and make row-major: LAPACK results are column-major, and the block matvecs
        # below need contiguous rows (a strided P made them 20x slower).
        p = (0.5 * (p + p.T)).contiguous()
        if q is not None:
            q = (0.5 * (q + q.T)).contiguous()

        value = logdet0 if self.mode == "logdet" else float((p * fmat).sum())  # type: ignore[operator]
        del fmat

        xc, et, g, h = self._candidate_state(p, q, low_rank, method, gh_cs)
        state = _State(x=xc, et=et, g=g, h=h, p=p, q=q, value=value)
        state.info["p0"] = method
        return state

    def _pool_fisher(self, f_cs: int) -> Tensor | None:
        """``F`` ``(D, D)``: the weighted mean of ``I(x)`` over every pool row in chunks of ``f_cs`` rows,
        accumulated in the matrix dtype (the identity in ``"identity"`` mode, ``None`` in logdet mode)."""
        mdt, sdt, dev, big_d = self.mdt, self.sdt, self.device, self.big_d
        if self.mode == "identity":
            return torch.eye(big_d, dtype=mdt, device=dev)
        if self.mode != "fisher":
            return None
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
        parts.clear()
        symmetrize_blocks(fmat, self.r)
        return fmat

    def _initial_inverse(
        self, fmat: Tensor | None
    ) -> tuple[Tensor, Tensor | None, float, tuple[Tensor, Tensor, Tensor] | None, str]:
        """``P_0 = M_0^{-1}`` and ``Q_0 = P_0 F P_0`` (``(D, D)``; ``Q_0`` ``None`` without ``F``), ``log det M_0``.

        Returns:
            ``(p, q, logdet0, low_rank, method)``: ``low_rank`` is the design's Woodbury factors for the
            candidates' ``g`` (:func:`_design_pairs`) where that form is cheaper, else ``None``;
            ``method`` is ``"identity"`` (no design rows), ``"woodbury"`` or ``"cholesky"``.
        """
        mdt, dev, lam, big_d = self.mdt, self.device, self.lam, self.big_d
        n_design = int(self.problem.in_design.numel())
        if n_design == 0 or self.w_design == 0.0:
            p = torch.eye(big_d, dtype=mdt, device=dev) / lam
            q = None if fmat is None else fmat / lam**2
            return p, q, big_d * math.log(lam), None, "identity"
        if 2 * n_design * self.r < big_d:
            return self._woodbury_p0(fmat)
        return self._cholesky_p0(fmat)

    def _design_factor(self) -> tuple[Tensor, Tensor, Tensor]:
        """The design rows ``x_L`` ``(n_L, d)``, their weighted factors ``E_L`` ``(n_L, r, r)`` and the
        ``(D, m')`` factor ``L`` of the design Fisher (``m' = n_L r``, ``L[a d + j, i r + c] = x_i[j] E_i[a, c]``),
        in the matrix dtype."""
        design = self.problem.in_design
        n_design = int(design.numel())
        xl = self.x_all[design].to(self.mdt)  # n_L x d
        probs = None if self.probs is None else self.probs[design]
        el = row_factors(probs, n_design, dtype=self.mdt, device=self.device)
        el = el * math.sqrt(self.w_design)  # n_L x r x r
        lf = (el.permute(1, 0, 2)[:, None, :, :] * xl.T[None, :, :, None]).reshape(self.big_d, n_design * self.r)
        return xl, el, lf

    def _woodbury_p0(
        self, fmat: Tensor | None
    ) -> tuple[Tensor, Tensor | None, float, tuple[Tensor, Tensor, Tensor] | None, str]:
        """:meth:`_initial_inverse` by Woodbury with the ``(D, m')`` design factor (``2 m' < D``)."""
        lam, big_d = self.lam, self.big_d
        xl, el, lf = self._design_factor()
        m_prime = int(lf.shape[1])
        kmat = matmul(lf.T, lf)
        kmat.diagonal().add_(lam)
        kchol = torch.linalg.cholesky(kmat)
        z = torch.cholesky_solve(lf.T, kchol).T  # D x m': L K^{-1}
        p = -matmul(z, lf.T)
        p.diagonal().add_(1.0)
        p /= lam
        q = None
        if fmat is not None:
            y = matmul(fmat, lf)  # D x m'
            y -= 0.5 * matmul(z, matmul(lf.T, y))
            q = fmat - matmul(z, y.T) - matmul(y, z.T)
            q /= lam**2
        logdet0 = (big_d - m_prime) * math.log(lam) + 2.0 * float(kchol.diagonal().log().sum())
        low_rank = _design_pairs(xl, el, kchol)
        del lf, z, kmat
        return p, q, logdet0, low_rank, "woodbury"

    def _cholesky_p0(
        self, fmat: Tensor | None
    ) -> tuple[Tensor, Tensor | None, float, tuple[Tensor, Tensor, Tensor] | None, str]:
        """:meth:`_initial_inverse` by a Cholesky factorisation of the dense ``(D, D)`` ``M_0``."""
        mdt, sdt, dev, lam, big_d, r = self.mdt, self.sdt, self.device, self.lam, self.big_d, self.r
        design = self.problem.in_design
        n_design = int(design.numel())
        # The design rows' elementwise ops on one torch thread, the GEMMs on OpenBLAS's threads: with
        # both pools at 2 threads on 2 cores they alternate and wait on each other's spinning
        # threads (k = 26, n_L = 260: 0.83 s against ~0.1 s).
        with torch_threads(1 if dev.type == "cpu" else torch.get_num_threads()):
            m0 = kron_sum(
                self.x_all[design],
                None if self.probs is None else self.probs[design],
                None,
                out_dtype=mdt,
                chunk_size=self.problem.chunk_size,
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
        q = None
        if fmat is not None:
            # Q_0 = P_0 F P_0, two D^3 GEMMs (1.2 s of a 4 s setup at k = 26, d = 128), in the candidates'
            # state dtype: their g and h are computed from P_0 and Q_0 cast to it anyway (p_s, q_s in
            # _candidate_state), so a float32 pipeline's Q_0 loses nothing it keeps, and float32 GEMMs run
            # at twice the rate (D = 3,200: 1.2 -> 0.6 s on 2 cores). A float64 pipeline is unchanged.
            p_c, f_c = p.to(sdt), fmat.to(sdt)
            q = matmul(matmul(p_c, f_c), p_c).to(mdt)
            del p_c, f_c
        # Cost model for G_x (multiply-adds per candidate): the dense block quadratic forms
        # cost D^2 (r+1) / (2r); the Woodbury form below n_L d + n_L^2 r (r+1) / 2 (cheaper iff
        # n_L < d, roughly; then m' < D and K is small).
        low_rank = None
        if n_design * self.d + n_design**2 * r * (r + 1) // 2 < big_d * big_d * (r + 1) // (2 * r):
            xl, el, lf = self._design_factor()
            kmat = lf.T @ lf
            kmat.diagonal().add_(lam)
            low_rank = _design_pairs(xl, el, torch.linalg.cholesky(kmat))
            del lf, kmat
        return p, q, logdet0, low_rank, "cholesky"

    def _candidate_state(
        self, p: Tensor, q: Tensor | None, low_rank: tuple[Tensor, Tensor, Tensor] | None, method: str, gh_cs: int
    ) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """The candidates' embeddings, scaled factors, ``g`` and ``h`` (docs/algorithm.md, 3a), in chunks of ``gh_cs``.

        Returns:
            ``(x, et, g, h)``: ``(n_C, d)``, ``E^T`` ``(n_C, rc, r)`` contiguous, ``(n_C, rc, rc)`` each
            (``h`` ``None`` without ``Q``).
        """
        prob = self.problem
        sdt, dev, lam, r = self.sdt, self.device, self.lam, self.r
        cand = prob.candidates
        n_cand = int(cand.numel())
        n_design = int(prob.in_design.numel())
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
        p_s = None if (method == "identity" or low_rank is not None) else p.to(sdt)
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
        return xc, e.transpose(1, 2).contiguous(), g, h

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

        The chunked step where the compiled kernel does not run: rank one (a GEMV), on CPU through
        :func:`_update_rows_numpy`, elsewhere (CUDA) through torch's batched products.

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
            rank_one_update(x, et, g, h, blocks, sigma)
            return
        if x.device.type == "cpu":
            _update_rows_numpy(x, et, g, h, blocks, sigma, half_h=half_h)
            return
        c = 1 if h is None else 2
        t = matmul(x.to(blocks.dtype), blocks)  # m x (r * c * rc)
        wz = torch.bmm(et, t.view(m, r, c * rc))  # m x rc x c rc: [W | Z]
        w = wz[:, :, :rc]
        g.sub_(torch.bmm(w, w.transpose(1, 2)), alpha=sigma)
        if h is not None:
            y = torch.bmm(w, wz[:, :, rc:].transpose(1, 2))  # m x rc x rc: W Z^T
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
        """Greedy forward pass of ``n_steps`` picks over the ``n_C`` candidates of ``st`` (updated in place).

        Returns ``(picks, gains)``: candidate positions (into ``st.x``'s ``n_C`` rows) in pick order, and
        each pick's decrease of ``tr(M^{-1} F)`` (increase of ``log det M`` in logdet mode).

        With a ``guard`` that says stop, the pass ends early; fewer than ``need`` picks are then completed
        by the last step's scores (the best remaining single-point gains, without updates between them),
        recorded in ``guard.events``.
        """
        guard = guard or _Guard()
        n_cand = st.x.shape[0]
        cs = self.step_chunk
        if self.r == 1 and self.device.type == "cpu":
            cs = rank_one_chunk(n_cand, self.n_threads, cs)
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
            if self._runs_fused(st, half_h):
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

    def _runs_fused(self, st: _State, half_h: bool) -> bool:
        """Whether the compiled kernel runs the forward steps: on CPU, with ``h~`` held (trace objective, ``r > 1``)."""
        return st.h is not None and half_h and self.device.type == "cpu"

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
        Picks and gains are those of the chunked step (:meth:`_update_rows`, same ``_rank_update``);
        ``P``/``Q`` are updated in place or, where cheaper, deferred (below).
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
        if self.device.type == "cpu" and _span_backward(len(picks) * rc, self.big_d):
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

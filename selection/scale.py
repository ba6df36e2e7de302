"""BAIT at scale: top-``c`` class truncation, candidate pre-filtering, and the cost model that picks them.

**Top-c classes.** For a row with softmax ``p``, keep its ``c`` most probable classes ``T`` and merge the
others into one "rest" class of mass ``p_rest``. The Fisher of that coarser observation is

    C~ = J (diag p~ - p~ p~^T) J^T,   p~ = (p_T, p_rest),   J = [e_t (t in T) | z],  z = p_rest-vector / p_rest,

the covariance of the conditional expectation of the score ``e_y - p`` given the coarse label, so
``0 <= C~ <= C = diag p - p p^T`` (Loewner order; data processing), ``rank C~ <= c`` and ``C~ = C`` when
``c = k - 1``. In the reduced class space (Helmert basis ``O`` of ``1^⊥``) its factor is the ``(k-1) x c``
matrix ``E~ = O^T J O_{c+1} E'`` with ``E' E'^T = O_{c+1}^T (diag p~ - p~ p~^T) O_{c+1}``. Per candidate the
greedy state becomes ``c x c`` instead of ``(k-1) x (k-1)``, and the pool GEMM of a step ``n d (k-1) 2c``
instead of ``n d (k-1) 2(k-1)``: the per-candidate ``r^3`` algebra that dominates large ``k`` drops to ``c^3``.
The pool Fisher ``F`` stays exact (it is a pool average, computed once).

**Pre-filtering.** Keep the top ``N`` candidates by a cheap score (the norm of the BADGE gradient
embedding ``||p - e_yhat|| ||x||``, or the smallest margin ``p_1 - p_2``) plus ``M`` candidates drawn
uniformly (seeded) from the rest; run BAIT on them. ``F`` is then estimated from the rows kept
(stratified: design and top rows count once, each random row ``(n_C - N) / M`` times), an unbiased
estimate of the pool sum.

**Cost model.** :func:`estimate_phases` counts multiply-adds (and bytes, for streaming work) of the
structured engine's setup, forward and backward steps and divides by the rates of this machine
(:func:`selection.calibrate.machine_rates`: a microbenchmark per device, dtype and thread count, cached
per process; ``BAIT_RATES=table`` for the committed table); memory is :func:`selection.bait.estimate_bytes`.
``approx=None`` ("auto") keeps exact BAIT whenever it fits the time and memory budgets, and otherwise
runs the plan of smallest estimated gap that fits, over pre-filtering, PCA dimensions, class
approximations (top-``c``; top-``c`` plus sampled pseudo-labels, :func:`sampled_class_factor`) and
forward-only picking (docs/algorithm-many-classes.md). The plan, what it gave up and its estimate are
recorded in the diagnostics.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import torch

from selection.calibrate import Rates, machine_rates, small_flops
from selection.errors import ParameterError
from selection.linalg import helmert_basis, reduced_class_factor

Tensor = torch.Tensor

#: Auto pre-filtering is considered only for more candidates than this.
PREFILTER_MIN_CANDIDATES = 50_000
#: Auto pre-filtering keeps at least this many candidates (top + random).
PREFILTER_MIN_KEEP = 10_000
#: Fraction of the kept candidates taken by score under auto pre-filtering (the rest is random).
PREFILTER_TOP_FRACTION = 0.75
#: Auto top-c keeps the smallest ``c`` whose mean probability mass left in the "rest" class is at most
#: ``min(TOPC_REST_MASS, TOPC_REST_PER_LAM * lam)``. The merged classes' Fisher competes with the ridge
#: ``lam``: on 12- and 20-class synthetic pools at lam = 0.01 (tests/selection/test_scale.py) a rest mass
#: of 0.01 left objective gaps of 2-8 %, 0.002 left 0.1-1.7 %.
TOPC_REST_MASS = 0.01
TOPC_REST_PER_LAM = 0.2
#: Seconds per Python-level torch op of the setup (block rows, block copies) and fixed seconds of a
#: setup (thread pools, class factors, small allocations), on the 2-core benchmark machine.
SETUP_OP_S = 3e-5
SETUP_FIXED_S = 0.02
#: Smallest PCA dimension the auto ladder goes down to.
PCA_MIN_DIM = 8
PREFILTER_SCORES = ("gradnorm", "margin")


# --------------------------------------------------------------------------------------------------
# Top-c classes
# --------------------------------------------------------------------------------------------------


def topc_class_factor(probs: Tensor, c: int, *, dtype: torch.dtype) -> Tensor:
    """Reduced-space factors ``E~`` (``m x (k-1) x c``) of the top-``c`` coarse-grained class Fisher.

    ``E~ E~^T = O^T C~ O`` with ``C~`` of the module docstring, ``0 <= C~ <= diag p - p p^T``.

    Args:
        probs: ``m x k`` probabilities.
        c: classes kept, ``1 <= c <= k - 1``.
        dtype: dtype of the computation and result.

    Returns:
        ``m x (k-1) x c`` factors.
    """
    k = int(probs.shape[1])
    if not 1 <= c <= k - 1:
        raise ParameterError(f"approx_classes must be in [1, k-1={k - 1}], got {c}")
    dev = probs.device
    p = probs.to(dtype)
    basis = helmert_basis(k, dtype=dtype, device=dev)  # k x r
    top_p, top_i = torch.topk(p, c, dim=1)  # m x c, sorted descending
    rest_vec = p.scatter(1, top_i, 0.0)  # m x k: the probabilities outside the top c
    p_rest = rest_vec.sum(1)  # m
    p_tilde = torch.cat([top_p, p_rest[:, None]], 1)  # m x (c+1)
    p_tilde = p_tilde / p_tilde.sum(1, keepdim=True)
    small = reduced_class_factor(p_tilde, helmert_basis(c + 1, dtype=dtype, device=dev))  # m x c x c
    # O^T J: columns O^T e_t = O[t] for t in T, and O^T z with z = rest_vec / p_rest (0 if p_rest = 0:
    # the rest class then carries no Fisher and z does not matter).
    safe = torch.where(p_rest > 0, p_rest, torch.ones_like(p_rest))
    oz = (rest_vec @ basis) / safe[:, None]  # m x r
    oz = torch.where((p_rest > 0)[:, None], oz, torch.zeros_like(oz))
    otj = torch.cat([basis[top_i].transpose(1, 2), oz[:, :, None]], 2)  # m x r x (c+1)
    return otj @ (helmert_basis(c + 1, dtype=dtype, device=dev) @ small)  # m x r x c


@dataclass(frozen=True)
class ClassApprox:
    """How each candidate's class Fisher is approximated: its ``top`` classes kept exactly, the others
    merged into one "rest" class, plus ``sampled`` pseudo-labels drawn from the rest (``0``: plain top-c).

    The factor has ``top + sampled`` columns (the per-candidate rank ``rc`` of the engine).
    """

    top: int
    sampled: int = 0

    @property
    def rank(self) -> int:
        return self.top + self.sampled

    def describe(self) -> dict[str, Any]:
        return {"top": self.top, "sampled": self.sampled}


def sampled_class_factor(probs: Tensor, top: int, sampled: int, *, dtype: torch.dtype, seed: int) -> Tensor:
    """Reduced-space factors ``E^`` (``m x (k-1) x (top + sampled)``): top-``c`` plus a sampled rest.

    By the law of total covariance over the coarse label (``top`` classes, rest), the class Fisher
    ``C = diag p - p p^T`` of a row splits into ``C~`` (:func:`topc_class_factor`, exact part) and the
    rest's within-class covariance ``p_rest (diag q - q q^T)`` with ``q`` the rest's normalised
    probabilities. The second term is replaced by ``(p_rest / s) sum_j (e_{y_j} - q)(e_{y_j} - q)^T``
    over ``s`` pseudo-labels ``y_j`` drawn from ``q`` by systematic sampling (one uniform offset per
    row, points ``(u + j) / s``): each ``y_j`` has law ``q``, so ``E^ E^^T`` is an unbiased estimate of
    ``O^T C O``, exact when ``top = k - 1`` or the rest holds one class (or no mass). ``top = 0`` is
    the plain sampled Fisher (gradients of ``s`` labels drawn from ``p``).

    Args:
        probs: ``m x k`` probabilities.
        top: classes kept exactly, ``0 <= top <= k - 1``.
        sampled: pseudo-labels per row, ``top + sampled <= k - 1``.
        dtype: dtype of the computation and result.
        seed: seed of the draws (the same rows and seed give the same factors).

    Returns:
        ``m x (k-1) x (top + sampled)`` factors.
    """
    k = int(probs.shape[1])
    if top < 0 or sampled < 0 or not 1 <= top + sampled <= k - 1:
        raise ParameterError(f"top + sampled classes must be in [1, k-1={k - 1}], got {top} + {sampled}")
    if sampled == 0:
        return topc_class_factor(probs, top, dtype=dtype)
    dev = probs.device
    p = probs.to(dtype)
    m = int(p.shape[0])
    basis = helmert_basis(k, dtype=dtype, device=dev)  # k x r
    if top > 0:
        top_i = torch.topk(p, top, dim=1).indices
        rest_vec = p.scatter(1, top_i, 0.0)  # m x k
    else:
        rest_vec = p.clone()
    p_rest = rest_vec.sum(1)  # m
    safe = torch.where(p_rest > 0, p_rest, torch.ones_like(p_rest))
    q = rest_vec / safe[:, None]  # m x k, rows sum to 1 (0 where no rest mass)
    cum = q.to(torch.float64).cumsum(1)
    cum = cum / torch.where(cum[:, -1:] > 0, cum[:, -1:], torch.ones_like(cum[:, -1:]))
    gen = torch.Generator(device="cpu")
    gen.manual_seed(int(seed))
    u = 1.0 - torch.rand(m, 1, generator=gen, dtype=torch.float64)  # (0, 1]
    pts = ((u + torch.arange(sampled, dtype=torch.float64)[None, :]) / sampled).to(dev)  # m x s, in (0, 1]
    ys = torch.searchsorted(cum, pts.clamp(max=1.0)).clamp_(max=k - 1)  # m x s
    oq = q @ basis  # m x r: O^T q
    cols = basis[ys] - oq[:, None, :]  # m x s x r: O^T (e_y - q)
    cols *= torch.sqrt(p_rest / sampled)[:, None, None]
    parts = [cols.transpose(1, 2)]
    if top > 0:
        parts.insert(0, topc_class_factor(probs, top, dtype=dtype))
    return torch.cat(parts, 2).contiguous()


def class_fisher_kept(probs: Tensor, top: int, *, sample: int = 4096) -> float:
    """Mean fraction of the class Fisher's trace that top-``top`` coarse-graining keeps exactly
    (``tr C~ / tr C``, rows with ``tr C > 0``; ``top = 0``: 0). The rest is what sampling estimates."""
    return class_fisher_kept_many(probs, [top], sample=sample)[top]


def class_fisher_kept_many(probs: Tensor, tops: list[int], *, sample: int = 4096) -> dict[int, float]:
    """:func:`class_fisher_kept` for several ``top`` at once (one sort of a row subsample)."""
    k = int(probs.shape[1])
    p = probs[:: max(1, probs.shape[0] // sample)].to(torch.float64)
    srt = torch.sort(p, dim=1, descending=True).values
    total = (p * (1 - p)).sum(1)
    ok = total > 0
    cum = srt.cumsum(1)
    cum_sq = (srt * srt).cumsum(1)
    cum_var = (srt * (1 - srt)).cumsum(1)
    sq = (p * p).sum(1)
    out: dict[int, float] = {}
    for top in tops:
        if top <= 0:
            out[top] = 0.0
            continue
        if top >= k - 1 or not bool(ok.any()):
            out[top] = 1.0
            continue
        rest = (1 - cum[:, top - 1]).clamp_min(0)
        sq_rest = (sq - cum_sq[:, top - 1]).clamp_min(0)
        z2 = torch.where(rest > 1e-300, sq_rest / rest.clamp_min(1e-300) ** 2, torch.zeros_like(rest))
        kept = cum_var[:, top - 1] + rest * (1 - rest) * z2
        out[top] = float((kept[ok] / total[ok]).mean())
    return out


def rest_mass(probs: Tensor, c: int) -> float:
    """Mean probability mass outside each row's top ``c`` classes."""
    return float(1.0 - torch.topk(probs.to(torch.float64), c, dim=1).values.sum(1).mean())


def rest_mass_limit(lam: float) -> float:
    """Largest mean rest mass the auto top-c accepts at ridge ``lam``."""
    return min(TOPC_REST_MASS, TOPC_REST_PER_LAM * lam)


def auto_classes(probs: Tensor, *, lam: float = 1.0, sample: int = 20_000) -> int:
    """Smallest ``c`` whose mean rest mass is at most :func:`rest_mass_limit` (``k - 1`` if none is)."""
    limit = rest_mass_limit(lam)
    k = int(probs.shape[1])
    p = probs[:: max(1, probs.shape[0] // sample)].to(torch.float64)
    cum = torch.sort(p, dim=1, descending=True).values.cumsum(1).mean(0)  # mean top-c mass, c = 1..k
    for c in range(1, k - 1):
        if 1.0 - float(cum[c - 1]) <= limit:
            return c
    return k - 1


# --------------------------------------------------------------------------------------------------
# Pre-filtering
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Prefilter:
    """A validated pre-filter: ``top`` candidates by ``score`` plus ``random`` drawn from the rest."""

    top: int
    random: int
    score: str = "gradnorm"
    seed: int | None = None

    def describe(self) -> dict[str, Any]:
        return {"top": self.top, "random": self.random, "score": self.score, "seed": self.seed}


def parse_prefilter(spec: Any, *, regression: bool) -> Prefilter | str | None:
    """``None``/``"auto"`` -> ``"auto"``; ``False``/``"none"`` -> ``None``; a dict -> :class:`Prefilter`.

    Raises:
        ParameterError: unknown keys, non-integer or negative sizes, no candidate kept, unknown score.
    """
    if spec is None or spec == "auto":
        return "auto"
    if spec is False or spec == "none":
        return None
    if not isinstance(spec, dict):
        raise ParameterError(
            f"prefilter must be None/'auto', 'none'/False or a dict like {{'top': 5000, 'random': 1000, "
            f"'score': 'gradnorm'}}, got {spec!r}"
        )
    unknown = set(spec) - {"top", "random", "score", "seed"}
    if unknown:
        raise ParameterError(f"unknown prefilter keys {sorted(unknown)}; valid: top, random, score, seed")
    sizes = {}
    for key in ("top", "random"):
        v = spec.get(key, 0)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise ParameterError(f"prefilter[{key!r}] must be an integer >= 0, got {v!r}")
        sizes[key] = v
    if sizes["top"] + sizes["random"] == 0:
        raise ParameterError("prefilter keeps no candidate: set 'top' and/or 'random' > 0")
    score = spec.get("score", "gradnorm")
    if score not in PREFILTER_SCORES:
        raise ParameterError(f"prefilter['score'] must be one of {PREFILTER_SCORES}, got {score!r}")
    if score == "margin" and regression:
        raise ParameterError("prefilter score 'margin' needs class probabilities; use 'gradnorm' for regression")
    seed = spec.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
        raise ParameterError(f"prefilter['seed'] must be an integer >= 0, got {seed!r}")
    return Prefilter(top=sizes["top"], random=sizes["random"], score=score, seed=seed)


def prefilter_scores(x: Tensor, probs: Tensor | None, kind: str, chunk_size: int) -> Tensor:
    """Cheap per-row scores, larger = more worth keeping (float64, ``m``)."""
    out = torch.empty(x.shape[0], dtype=torch.float64, device=x.device)
    for lo in range(0, x.shape[0], chunk_size):
        hi = min(x.shape[0], lo + chunk_size)
        xn = x[lo:hi].to(torch.float64).norm(dim=1)
        if probs is None:
            out[lo:hi] = xn
            continue
        p = probs[lo:hi].to(torch.float64)
        if kind == "margin":
            top2 = torch.topk(p, 2, dim=1).values
            out[lo:hi] = -(top2[:, 0] - top2[:, 1])
        else:  # gradnorm: ||p - e_yhat|| ||x||, the BADGE gradient embedding's norm
            pmax = p.max(1).values
            out[lo:hi] = torch.sqrt(((p * p).sum(1) - 2 * pmax + 1).clamp_min(0)) * xn
    return out


def prefilter_candidates(
    x: Tensor, probs: Tensor | None, candidates: Tensor, spec: Prefilter, *, seed: int, chunk_size: int
) -> tuple[Tensor, Tensor, float]:
    """Rows kept by the pre-filter.

    Returns:
        ``(top_rows, random_rows, random_weight)``: sorted pool rows of each stratum and the weight
        ``(n_C - N) / M`` of a random row in the stratified Fisher estimate.
    """
    n_c = int(candidates.numel())
    n_top = min(spec.top, n_c)
    # Scores of every row, chunked, then the candidates' (no copy of the candidates' embeddings).
    scores = prefilter_scores(x, probs, spec.score, chunk_size)[candidates]
    # Stable sort: equal scores keep the lower row first.
    order = torch.sort(-scores, stable=True).indices
    top_pos = order[:n_top]
    rest_pos = order[n_top:]
    n_rand = min(spec.random, int(rest_pos.numel()))
    gen = torch.Generator(device="cpu")
    gen.manual_seed(int(seed if spec.seed is None else spec.seed))
    pick = torch.randperm(int(rest_pos.numel()), generator=gen)[:n_rand].to(candidates.device)
    rand_pos = rest_pos[pick]
    weight = (n_c - n_top) / n_rand if n_rand > 0 else 0.0
    return torch.sort(candidates[top_pos]).values, torch.sort(candidates[rand_pos]).values, weight


# --------------------------------------------------------------------------------------------------
# Cost model
# --------------------------------------------------------------------------------------------------


def default_threads() -> int:
    """Worker threads the engine uses on CPU when nothing overrides them (``selection.bait.resolve_threads``)."""
    env = os.environ.get("BAIT_THREADS", "").strip()
    if env.isdigit():
        return max(1, int(env))
    return max(torch.get_num_threads(), min(2, os.cpu_count() or 1))


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
        threads: worker threads on CPU (default :func:`default_threads`).
        rates: the rates (default :func:`selection.calibrate.machine_rates` of the device, dtype, threads).

    Returns:
        ``{"setup", "forward", "backward", "objective"}`` seconds.
    """
    n_threads = default_threads() if threads is None else max(1, threads)
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
    setup_s = (setup_s + setup_ops * SETUP_OP_S + SETUP_FIXED_S) * rt.setup_factor
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
        # vector passes, bound by memory, not multiply-adds (10^6 x 64 float32: ~70 ms a step at load 4).
        per_step = n_cand * (d * (torch.finfo(dtype).bits // 8) + 6 * 8) / rt.stream + step_mats + step_fixed
    per_step *= rt.greedy_factor
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


def check_time_budget(value: Any) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value <= 0:
        raise ParameterError(f"time_budget_s must be a finite number > 0, got {value!r}")
    return float(value)

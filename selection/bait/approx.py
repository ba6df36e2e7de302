"""The approximations a BAIT plan can use: top-``c`` class factors (plus sampled pseudo-labels) and
candidate pre-filtering. :mod:`selection.bait.plan` decides when; the engine and driver apply them.

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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from selection.errors import ParameterError
from selection.linalg import helmert_basis, reduced_class_factor

Tensor = torch.Tensor

#: Auto top-c keeps the smallest ``c`` whose mean probability mass left in the "rest" class is at most
#: ``min(TOPC_REST_MASS, TOPC_REST_PER_LAM * lam)``. The merged classes' Fisher competes with the ridge
#: ``lam``: on 12- and 20-class synthetic pools at lam = 0.01 (tests/selection/test_scale.py) a rest mass
#: of 0.01 left objective gaps of 2-8 %, 0.002 left 0.1-1.7 %.
TOPC_REST_MASS = 0.01
TOPC_REST_PER_LAM = 0.2
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
    (``tr C~ / tr C``, rows with ``tr C > 0``; ``top = 0``: 0). The rest is what sampling estimates.

    ``probs`` is ``(m, k)``; the mean is over a subsample of at most about ``sample`` rows."""
    return class_fisher_kept_many(probs, [top], sample=sample)[top]


def class_fisher_kept_many(probs: Tensor, tops: list[int], *, sample: int = 4096) -> dict[int, float]:
    """:func:`class_fisher_kept` for several ``top`` at once (one sort of a row subsample of ``probs``, ``(m, k)``)."""
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
    """Mean probability mass outside each row's top ``c`` classes (``probs`` ``(m, k)``)."""
    return float(1.0 - torch.topk(probs.to(torch.float64), c, dim=1).values.sum(1).mean())


def rest_mass_limit(lam: float) -> float:
    """Largest mean rest mass the auto top-c accepts at ridge ``lam``."""
    return min(TOPC_REST_MASS, TOPC_REST_PER_LAM * lam)


def auto_classes(probs: Tensor, *, lam: float = 1.0, sample: int = 20_000) -> int:
    """Smallest ``c`` whose mean rest mass is at most :func:`rest_mass_limit` (``k - 1`` if none is).

    ``probs`` is ``(m, k)``; the mean is over a subsample of at most about ``sample`` rows."""
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
    """Cheap per-row scores, larger = more worth keeping: ``(m,)`` float64 for ``x`` ``(m, d)`` and
    ``probs`` ``(m, k)`` or ``None`` (regression: the norm of ``x``), in chunks of ``chunk_size`` rows."""
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


_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _splitmix64(z: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser of ``z`` (uint64, wrapping)."""
    with np.errstate(over="ignore"):
        z = (z + np.uint64(0x9E3779B97F4A7C15)) & _MASK64
        z = ((z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & _MASK64
        z = ((z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & _MASK64
        return z ^ (z >> np.uint64(31))


def item_keys(seed: int, item_ids: np.ndarray) -> np.ndarray:
    """``(m,)`` float64 keys in ``[0, 1)``, a function of ``(seed, item id)`` only (splitmix64 of the id mixed with
    the seed's): the random stratum of a pre-filter, the same whatever the shard layout."""
    if seed < 0:
        raise ParameterError("seed must be non-negative")
    ids = np.asarray(item_ids, dtype=np.int64).astype(np.uint64)
    mixed = _splitmix64(np.asarray([seed], dtype=np.uint64))[0]
    bits = _splitmix64(ids ^ mixed)
    return (bits >> np.uint64(11)).astype(np.float64) * 2.0**-53


def prefilter_candidates(
    x: Tensor,
    probs: Tensor | None,
    candidates: Tensor,
    spec: Prefilter,
    *,
    seed: int,
    chunk_size: int,
    row_ids: np.ndarray | None = None,
) -> tuple[Tensor, Tensor, float]:
    """Rows kept by the pre-filter.

    Args:
        x: ``(n, d)`` pool embeddings.
        probs: ``(n, k)`` probabilities or ``None``.
        candidates: ``(n_C,)`` candidate pool rows.
        spec: the pre-filter.
        seed: the draw's seed when ``spec.seed`` is ``None``.
        chunk_size: rows per chunk of the scores.
        row_ids: ``(n,)`` int64 ids of the rows, or ``None``. With ids the random stratum is the ``M`` other
            candidates of smallest :func:`item_keys` ``(seed, id)`` (ties to the lowest id), the sample a
            sharded pool draws; without, a seeded permutation of the other candidates' positions.

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
    draw_seed = int(seed if spec.seed is None else spec.seed)
    if row_ids is not None:
        rest_ids = row_ids[candidates[rest_pos].cpu().numpy()]
        low = np.lexsort((rest_ids, item_keys(draw_seed, rest_ids)))[:n_rand]
        pick = torch.as_tensor(low, dtype=torch.int64).to(candidates.device)
    else:
        gen = torch.Generator(device="cpu")
        gen.manual_seed(draw_seed)
        pick = torch.randperm(int(rest_pos.numel()), generator=gen)[:n_rand].to(candidates.device)
    rand_pos = rest_pos[pick]
    weight = (n_c - n_top) / n_rand if n_rand > 0 else 0.0
    return torch.sort(candidates[top_pos]).values, torch.sort(candidates[rand_pos]).values, weight

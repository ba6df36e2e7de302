"""Naive reference BAIT for the tests: explicit ``kd x kd`` matrices, inverses recomputed every step.

Deliberately shares no code with :mod:`selection`: full (unreduced) ``k d`` parameter space, the
explicit ``kd x k`` factor ``V_x`` of every row, numpy float64, ``M^{-1}`` recomputed from ``M``
at every greedy step. Same conventions as :mod:`selection.bait` (class-major ``W``,
``V_x[:, c] = sqrt(p_c) (e_c - p) ⊗ x``, F over all rows, weights by convention, ties to the lowest
row index with the same relative tie tolerance).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from selection.bait import DEFAULT_LAM


@dataclass
class NaiveResult:
    indices: list[int]  # kept picks, in forward order
    forward: list[int]  # all forward picks, in order
    objective: float  # tr(M^{-1} F) of the kept set (or log det M for logdet mode)


def fisher_factors(x: np.ndarray, probs: np.ndarray | None) -> np.ndarray:
    """``n x kd x k`` explicit factors (``n x d x 1`` for regression)."""
    if probs is None:
        return x[:, :, None].copy()
    n, d = x.shape
    k = probs.shape[1]
    v = np.zeros((n, k * d, k))
    for i in range(n):
        p = probs[i]
        for col in range(k):
            coef = np.sqrt(max(p[col], 0.0)) * (np.eye(k)[col] - p)  # k
            v[i, :, col] = np.kron(coef, x[i])
    return v


def weights_for(convention: str, n_design: int, batch: int) -> tuple[float, float]:
    if convention == "reference":
        return 1.0 / (n_design + batch), batch / (n_design + batch)
    if convention == "paper":
        return (1.0 / n_design if n_design else 0.0), 1.0
    if convention == "sum":
        return 1.0, 1.0
    raise ValueError(convention)


def _best(scores: np.ndarray, eligible: np.ndarray, maximize: bool, rtol: float) -> int:
    ok = eligible & np.isfinite(scores)
    if not ok.any():
        return int(np.flatnonzero(eligible)[0])
    vals = scores[ok]
    best = vals.max() if maximize else vals.min()
    tol = rtol * np.abs(vals).max()
    hit = ok & ((scores >= best - tol) if maximize else (scores <= best + tol))
    return int(np.flatnonzero(hit)[0])


def naive_bait(
    x: np.ndarray,
    probs: np.ndarray | None,
    labeled: list[int],
    reserved: list[int],
    batch: int,
    *,
    lam: float = DEFAULT_LAM,
    oversample: int = 2,
    convention: str = "reference",
    mode: str = "fisher",
    fisher_weights: np.ndarray | None = None,
    rtol: float = 1e-10,
) -> NaiveResult:
    """Naive BAIT / no-Fisher BAIT / greedy log det.

    Args:
        x: ``n x d`` float64.
        probs: ``n x k`` or ``None`` (regression).
        labeled, reserved: row indices counted in ``M`` with weight ``w_L``.
        batch: ``B``.
        lam: ridge.
        oversample: forward picks ``min(oversample * B, n_C)`` (``mode='logdet'``: ``B``, no backward).
        convention: ``"reference"``, ``"paper"`` or ``"sum"``.
        mode: ``"fisher"``, ``"identity"`` (F = I) or ``"logdet"``.
        fisher_weights: optional ``n`` weights of the pool mean.
        rtol: relative tie tolerance.
    """
    n = x.shape[0]
    v = fisher_factors(x, probs)  # n x D x k
    big_d = v.shape[1]
    fis = np.einsum("nac,nbc->nab", v, v)  # n x D x D, I(x) explicitly
    if mode == "identity":
        fmat = np.eye(big_d)
    else:
        w = np.ones(n) if fisher_weights is None else np.asarray(fisher_weights, dtype=np.float64)
        fmat = np.einsum("n,nab->ab", w / w.sum(), fis)
    design = sorted(set(labeled) | set(reserved))
    cands = [i for i in range(n) if i not in set(design)]
    w_l, w_s = weights_for(convention, len(design), batch)
    m = lam * np.eye(big_d) + w_l * fis[design].sum(0)
    u_all = np.sqrt(w_s) * v[cands]  # n_C x D x k
    eye_k = np.eye(v.shape[2])

    n_forward = batch if mode == "logdet" else min(len(cands), oversample * batch)
    chosen = np.zeros(len(cands), dtype=bool)
    forward: list[int] = []
    for _ in range(n_forward):
        p = np.linalg.inv(m)
        g = np.swapaxes(u_all, 1, 2) @ (p @ u_all)  # n_C x k x k: U^T P U
        if mode == "logdet":
            scores = np.linalg.slogdet(eye_k + g)[1]
        else:
            q = p @ fmat @ p
            h = np.swapaxes(u_all, 1, 2) @ (q @ u_all)  # U^T P F P U
            scores = np.trace(np.linalg.solve(eye_k + g, h), axis1=1, axis2=2)
        j = _best(scores, ~chosen, True, rtol)
        chosen[j] = True
        forward.append(j)
        m = m + w_s * fis[cands[j]]
    alive = list(forward)
    if mode != "logdet":
        while len(alive) > batch:
            p = np.linalg.inv(m)
            q = p @ fmat @ p
            order = sorted(alive)
            u = u_all[order]
            g = np.swapaxes(u, 1, 2) @ (p @ u)
            h = np.swapaxes(u, 1, 2) @ (q @ u)
            scores = np.trace(np.linalg.solve(eye_k - g, h), axis1=1, axis2=2)
            j = _best(scores, np.ones(len(order), dtype=bool), False, rtol)
            alive.remove(order[j])
            m = m - w_s * fis[cands[order[j]]]
    logdet = mode == "logdet"
    objective = float(np.linalg.slogdet(m)[1]) if logdet else float(np.trace(np.linalg.solve(m, fmat)))
    kept = [cands[j] for j in forward if j in set(alive)]
    return NaiveResult(indices=kept, forward=[cands[j] for j in forward], objective=objective)

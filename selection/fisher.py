"""Fisher information of the last layer, in the reduced class space, built without the n x dk x k tensor.

Conventions (shared with :mod:`selection.bait`): the last layer ``W`` is ``k x d``, vectorised
class-major (index ``c * d + j``). For an embedding ``x`` with softmax ``p``,
``I(x) = (diag p - p p^T) ⊗ x x^T``. Since ``(diag p - p p^T) 1 = 0``, every ``I(x)`` lives on
``(1^⊥) ⊗ R^d``; in the Helmert basis ``O`` of ``1^⊥`` it is ``(E E^T) ⊗ x x^T`` with the square
``(k-1) x (k-1)`` factor ``E`` of :func:`selection.linalg.reduced_class_factor`. Regression
(squared loss, one output) has ``I(x) = x x^T``: ``r = 1`` and ``E = 1``.

``r`` denotes the reduced class count (``k - 1``, or 1 for regression) and ``D = r d``.
"""

from __future__ import annotations

import math

import torch

from selection.linalg import (
    accumulate_kron_upper,
    helmert_basis,
    reduced_class_factor,
    symmetrize_blocks,
)

Tensor = torch.Tensor


def reduced_rank(probs: Tensor | None) -> int:
    """``r``: ``k - 1`` for classification with ``k`` classes, 1 for regression (``probs is None``)."""
    return 1 if probs is None else int(probs.shape[1]) - 1


def row_factors(probs: Tensor | None, m: int, *, dtype: torch.dtype, device: torch.device) -> Tensor:
    """Square class factors ``E_i`` with ``I(x_i) = (E_i E_i^T) ⊗ x_i x_i^T`` in the reduced space.

    Args:
        probs: ``m x k`` probabilities, or ``None`` for regression.
        m: number of rows (used for regression).
        dtype: dtype of the result (the computation runs in it).
        device: device of the result.

    Returns:
        ``m x r x r`` factors.
    """
    if probs is None:
        return torch.ones(m, 1, 1, dtype=dtype, device=device)
    basis = helmert_basis(int(probs.shape[1]), dtype=dtype, device=device)
    return reduced_class_factor(probs.to(dtype), basis)


def kron_sum(
    x: Tensor,
    probs: Tensor | None,
    weights: Tensor | None,
    *,
    out_dtype: torch.dtype,
    chunk_size: int,
    compute_dtype: torch.dtype | None = None,
) -> Tensor:
    """``sum_i w_i I(x_i)`` in the reduced space, chunked over rows (``m D^2`` flops, ``chunk x D`` temporary).

    Args:
        x: ``m x d`` rows.
        probs: ``m x k`` probabilities or ``None`` (regression).
        weights: ``m`` nonnegative row weights, or ``None`` for all ones.
        out_dtype: dtype of the ``D x D`` accumulator.
        chunk_size: rows per chunk.
        compute_dtype: dtype of the per-chunk GEMMs (default ``out_dtype``).

    Returns:
        ``D x D`` symmetric matrix.
    """
    m, d = x.shape
    r = reduced_rank(probs)
    cdt = compute_dtype or out_dtype
    out = torch.zeros(r * d, r * d, dtype=out_dtype, device=x.device)
    for lo in range(0, m, chunk_size):
        hi = min(m, lo + chunk_size)
        xc = x[lo:hi].to(cdt)
        e = row_factors(None if probs is None else probs[lo:hi], hi - lo, dtype=cdt, device=x.device)
        s = e @ e.transpose(1, 2)  # chunk x r x r
        if weights is not None:
            s = s * weights[lo:hi].to(cdt)[:, None, None]
        accumulate_kron_upper(out, xc, s)
    symmetrize_blocks(out, r)
    return out


def exact_objective(
    x: Tensor,
    probs: Tensor | None,
    design: Tensor,
    picked: Tensor,
    *,
    lam: float,
    w_design: float,
    w_picked: float,
    fisher_weights: Tensor | None = None,
    identity_fisher: bool = False,
    chunk_size: int = 8192,
) -> float:
    """``tr(M^{-1} F)`` of a set, in float64, from explicit ``D x D`` matrices (a Cholesky of ``M``).

    ``M = lam I + w_design sum_{design} I(x) + w_picked sum_{picked} I(x)`` and ``F`` is the
    (weighted) mean of ``I(x)`` over all ``m`` rows, or the identity (``identity_fisher``). The value
    is the one in the full ``k d`` parameter space: with ``F = I`` the softmax null direction adds
    ``d / lam``.

    Args:
        x: ``m x d`` pool embeddings.
        probs: ``m x k`` probabilities or ``None`` (regression).
        design: int64 row indices counted with weight ``w_design`` (labeled and reserved rows).
        picked: int64 row indices counted with weight ``w_picked``.
        lam: ridge ``lam > 0``.
        w_design: weight of design rows.
        w_picked: weight of picked rows.
        fisher_weights: ``m`` nonnegative weights of the pool mean, or ``None`` (uniform).
        identity_fisher: use ``F = I`` instead of the pool Fisher.
        chunk_size: rows per chunk.

    Returns:
        The objective as a Python float.
    """
    f64 = torch.float64
    m, d = x.shape
    r = reduced_rank(probs)
    big_d = r * d
    mmat = torch.zeros(big_d, big_d, dtype=f64, device=x.device)
    for rows, w in ((design, w_design), (picked, w_picked)):
        if rows.numel() and w != 0.0:
            part = kron_sum(x[rows], None if probs is None else probs[rows], None, out_dtype=f64, chunk_size=chunk_size)
            mmat += w * part
    mmat.diagonal().add_(lam)
    chol = torch.linalg.cholesky(mmat)
    if identity_fisher:
        inv_l = torch.linalg.solve_triangular(chol, torch.eye(big_d, dtype=f64, device=x.device), upper=False)
        value = float((inv_l * inv_l).sum())
        return value + (d / lam if probs is not None else 0.0)
    weights = None
    if fisher_weights is not None:
        weights = fisher_weights.to(f64)
        weights = weights / weights.sum()
    fmat = kron_sum(x, probs, weights, out_dtype=f64, chunk_size=chunk_size)
    if weights is None:
        fmat /= m
    y = torch.linalg.solve_triangular(chol, fmat, upper=False)  # L^{-1} F
    z = torch.linalg.solve_triangular(chol, y.T, upper=False)  # L^{-1} F L^{-T}
    return float(z.diagonal().sum())


def fisher_pca_basis(
    x: Tensor,
    probs: Tensor | None,
    weights: Tensor | None,
    dim: int,
    *,
    chunk_size: int,
) -> tuple[Tensor, float]:
    """Top ``dim`` eigenvectors of the Fisher-weighted pool second moment ``sum_i w_i tr(C_i) x_i x_i^T``.

    ``tr(C_i) = 1 - ||p_i||^2`` is the total class Fisher of row ``i`` (1 for regression), so the
    projection keeps the embedding directions that carry the pool Fisher (notes sec. 4).

    Args:
        x: ``m x d`` embeddings.
        probs: ``m x k`` probabilities or ``None``.
        weights: ``m`` nonnegative weights or ``None``.
        dim: number of directions kept, ``1 <= dim <= d``.
        chunk_size: rows per chunk.

    Returns:
        ``(basis, kept)``: ``d x dim`` orthonormal basis (float64) and the fraction of the weighted
        second moment's trace that it keeps.
    """
    f64 = torch.float64
    m, d = x.shape
    cov = torch.zeros(d, d, dtype=f64, device=x.device)
    for lo in range(0, m, chunk_size):
        hi = min(m, lo + chunk_size)
        xc = x[lo:hi].to(f64)
        wc = torch.ones(hi - lo, dtype=f64, device=x.device)
        if probs is not None:
            pc = probs[lo:hi].to(f64)
            wc = 1.0 - (pc * pc).sum(1)
        if weights is not None:
            wc = wc * weights[lo:hi].to(f64)
        cov += xc.T @ (xc * wc[:, None])
    evals, evecs = torch.linalg.eigh(cov)  # ascending
    top = evecs[:, -dim:].flip(1)
    total = float(evals.clamp_min(0).sum())
    kept = float(evals[-dim:].clamp_min(0).sum()) / total if total > 0 else 1.0
    return top, (kept if math.isfinite(kept) else 1.0)

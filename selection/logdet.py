"""Greedy log-det maximisation on rank-1 (Kronecker) embeddings: the paper's appendix Algorithm 2.

``logdet_rank1`` greedily maximises ``log det(M)`` with ``M = lam I + sum_{design + picked} g g^T``
over BADGE's gradient embeddings ``g = a ⊗ x`` (``a = e_yhat - p``); by the matrix-determinant lemma
the gain of adding ``x`` is ``log(1 + g_x^T M^{-1} g_x)``. Note the paper's Algorithm 2 scales the
labeled sum by ``1/|S|``; we use the plain sum (every labeled or reserved row counts as one
observation, as a picked row does), which is what the Bayesian-linear-regression reading of the
objective gives.

The engine :func:`greedy_logdet_kron` never forms the ``n x dk`` embedding matrix. It keeps, for every
candidate, the quadratic form ``q_x = g_x^T M^{-1} g_x`` and after a pick ``s`` applies the
Sherman-Morrison update ``q_x <- q_x - (g_x^T u)^2 / (1 + q_s)`` with ``u = M^{-1} g_s``; since
``g_x^T u = a_x^T U x_x`` for ``u = vec(U)`` (``U`` is ``k x d``), a step costs ``O(n d k)``.
``u`` is obtained from the initial ``M_0^{-1}`` and the previous ``u``'s (``O(t d k)`` at step ``t``).
``M_0^{-1}`` is applied in one of three ways, chosen automatically:

* ``"none"``: no labeled/reserved row, ``M_0 = lam I``;
* ``"woodbury"``: ``L <= dk`` design rows, ``M_0^{-1} = (I - G^T K^{-1} G)/lam`` with the ``L x L``
  matrix ``K = lam I + G G^T`` built from Kronecker inner products (memory ``O(L^2 + chunk L)``);
* ``"dense"``: ``L > dk``, the ``dk x dk`` matrix ``M_0`` is accumulated in chunks and inverted by
  Cholesky (memory ``O((dk)^2)``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from selection.baselines import gradient_factors
from selection.errors import MemoryBudgetError, ParameterError
from selection.problem import Problem, StrategyOutput, register

#: Largest ``dk x dk`` matrix (entries) the dense path may allocate (2 GiB in float64).
MAX_DENSE_ENTRIES = 2**28


@dataclass
class LogdetResult:
    """Output of :func:`greedy_logdet_kron`.

    Attributes:
        picks: positions (into the candidate arrays) in pick order.
        gains: ``log(1 + g^T M^{-1} g)`` of each pick; their sum is ``log det M_B - log det M_0``.
        init: how ``M_0^{-1}`` was applied (``"none"``, ``"woodbury"`` or ``"dense"``).
    """

    picks: list[int]
    gains: list[float]
    init: str


def _slices(n: int, size: int) -> list[slice]:
    return [slice(s, min(s + size, n)) for s in range(0, n, size)]


def _kron_rows(A: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
    """Explicit class-major Kronecker rows ``a ⊗ x``: ``c x k`` and ``c x d`` -> ``c x dk``."""
    return (A[:, :, None] * X[:, None, :]).reshape(A.shape[0], -1)


def greedy_logdet_kron(
    A: torch.Tensor,
    X: torch.Tensor,
    A_design: torch.Tensor,
    X_design: torch.Tensor,
    *,
    lam: float,
    steps: int,
    chunk: int = 8192,
    progress: Callable[[int, int], None] | None = None,
) -> LogdetResult:
    """Greedy forward maximisation of ``log det(lam I + sum g g^T)`` over ``g = a ⊗ x``, no repeats.

    Args:
        A: ``m x k`` class factors of the candidates (``k = 1`` with ones gives plain ``g = x``).
        X: ``m x d`` embeddings of the candidates.
        A_design: ``L x k`` factors of rows already in ``M_0`` (labeled, reserved).
        X_design: ``L x d`` embeddings of those rows.
        lam: ridge ``lam > 0``.
        steps: number of picks, ``1 <= steps <= m``.
        chunk: rows per chunk when streaming.
        progress: optional ``callback(done, total)``.

    Returns:
        The picks (positions into ``A``/``X``), their gains, and the ``M_0`` path used.

    Raises:
        MemoryBudgetError: the dense path would need more than ``MAX_DENSE_ENTRIES`` entries.
    """
    m, k = A.shape
    d = X.shape[1]
    dk = d * k
    n_design = A_design.shape[0]
    sq = (A * A).sum(dim=1) * (X * X).sum(dim=1)  # m, ||g_x||^2

    # p0(a, x) -> M_0^{-1} (a ⊗ x) as a k x d matrix; q: m, q_x = g_x^T M_0^{-1} g_x
    p0: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    if n_design == 0:
        init = "none"
        q = sq / lam

        def p0(a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            return torch.outer(a, x) / lam

    elif n_design <= dk:
        init = "woodbury"
        K = (A_design @ A_design.T) * (X_design @ X_design.T)  # L x L (L = n_design), <g_l, g_l'>
        K.diagonal().add_(lam)
        chol = torch.linalg.cholesky(K)
        q = torch.empty_like(sq)
        for r in _slices(m, chunk):
            R = (A[r] @ A_design.T) * (X[r] @ X_design.T)  # c x L, <g_x, g_l>
            W = torch.linalg.solve_triangular(chol, R.T, upper=False)  # L x c
            q[r] = (sq[r] - (W * W).sum(dim=0)) / lam

        def p0(a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            r_s = (A_design @ a) * (X_design @ x)  # L
            w = torch.cholesky_solve(r_s[:, None], chol)[:, 0]  # L
            return (torch.outer(a, x) - A_design.T @ (w[:, None] * X_design)) / lam

    else:
        init = "dense"
        if dk * dk > MAX_DENSE_ENTRIES:
            raise MemoryBudgetError(
                f"logdet_rank1 with {n_design} labeled/reserved rows needs a {dk} x {dk} matrix; "
                "use strategy 'badge' (same embeddings, no matrix) or fewer labeled rows"
            )
        M0 = torch.zeros(dk, dk, dtype=X.dtype, device=X.device)
        for r in _slices(n_design, chunk):
            G = _kron_rows(A_design[r], X_design[r])  # c x dk
            M0.addmm_(G.T, G)
        M0.diagonal().add_(lam)
        P0 = torch.cholesky_inverse(torch.linalg.cholesky(M0))  # dk x dk
        P0 = (P0 + P0.T) / 2
        q = torch.empty_like(sq)
        for r in _slices(m, max(1, chunk // k)):
            G = _kron_rows(A[r], X[r])  # c x dk
            q[r] = ((G @ P0) * G).sum(dim=1)

        def p0(a: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            return (P0 @ torch.outer(a, x).reshape(-1)).reshape(k, d)

    q.clamp_min_(0.0)
    chosen = torch.zeros(m, dtype=torch.bool, device=X.device)
    neg = torch.tensor(-math.inf, dtype=q.dtype, device=q.device)
    Us: list[torch.Tensor] = []  # k x d each, u_j = M_{j}^{-1} g_{s_j}
    denoms: list[torch.Tensor] = []  # 1 + q_{s_j}
    picks: list[int] = []
    gains: list[float] = []
    for t in range(steps):
        s = int(torch.argmax(torch.where(chosen, neg, q)))  # first maximum: lowest row
        q_s = q[s]
        picks.append(s)
        gains.append(float(torch.log1p(q_s)))
        chosen[s] = True
        if t == steps - 1:
            break
        a_s, x_s = A[s], X[s]
        U = p0(a_s, x_s)  # k x d
        for U_j, den_j in zip(Us, denoms, strict=True):
            U = U - U_j * ((a_s @ U_j @ x_s) / den_j)
        den = 1.0 + q_s
        Us.append(U)
        denoms.append(den)
        for r in _slices(m, chunk):
            gu = ((X[r] @ U.T) * A[r]).sum(dim=1)  # c, g_x^T u
            q[r] -= gu * gu / den
        q.clamp_min_(0.0)
        if progress is not None:
            progress(t + 1, steps)
    if progress is not None:
        progress(steps, steps)
    return LogdetResult(picks=picks, gains=gains, init=init)


@register(
    "logdet_rank1",
    tasks=("classification",),
    summary="Greedy log-det maximisation on BADGE gradient embeddings (paper appendix, rank-1 Fisher)",
)
def logdet_rank1(problem: Problem, *, lam: float = 1.0) -> StrategyOutput:
    """Greedy ``max log det(lam I + sum g g^T)`` on gradient embeddings ``g = (e_yhat - p) ⊗ x``.

    Labeled and reserved rows are in ``M_0`` (plain sum, see the module docstring).

    Args:
        problem: a classification problem.
        lam: ridge ``lam > 0`` on the ``dk x dk`` design matrix.

    Returns:
        Candidate rows in pick order; ``objective`` is ``log det M_B - log det M_0``; diagnostics
        hold the per-pick ``gains`` and the ``M_0`` path (``init``).

    Raises:
        ParameterError: ``lam`` is not a positive finite number.
        MemoryBudgetError: too many labeled rows for the ``dk x dk`` path.
    """
    if isinstance(lam, bool) or not isinstance(lam, int | float) or not (0 < lam < math.inf):
        raise ParameterError(f"lam must be a positive finite number, got {lam!r}")
    assert problem.probs is not None
    cand, design = problem.candidates, problem.in_design
    res = greedy_logdet_kron(
        gradient_factors(problem.probs[cand]),
        problem.X[cand],
        gradient_factors(problem.probs[design]),
        problem.X[design],
        lam=float(lam),
        steps=problem.batch_size,
        chunk=problem.chunk_size,
        progress=problem.progress,
    )
    rows = cand[torch.tensor(res.picks, device=cand.device)]
    return StrategyOutput(
        indices=rows.cpu().numpy(),
        objective=float(sum(res.gains)),
        diagnostics={"gains": res.gains, "init": res.init, "lam": float(lam)},
    )

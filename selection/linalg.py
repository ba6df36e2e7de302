"""Linear-algebra kernels of the structured BAIT method (docs/algorithm.md, "the fast exact method").

Parameter vectors are class-major in a *reduced* space of dimension ``D = r * d``: coordinate
``a * d + j`` is reduced class direction ``a`` (``0 <= a < r``) and embedding coordinate ``j``. A
Fisher matrix there is a sum of Kronecker products ``S ⊗ x x^T`` with ``S`` an ``r x r`` class matrix;
a ``D x D`` matrix is viewed as ``r x r`` blocks of size ``d x d``.

Everything here is pure torch: dtype and device follow the arguments, nothing is moved to a device.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import torch

Tensor = torch.Tensor

# Below this many reduced classes the batched score uses a vectorised elimination written in
# torch (one elementwise op over the whole chunk per pivot); above it, batched LAPACK Cholesky.
_ELIMINATION_MAX_R = 12


def helmert_basis(k: int, *, dtype: torch.dtype, device: torch.device) -> Tensor:
    """Orthonormal basis of the complement of the all-ones vector in ``R^k`` (Helmert contrasts).

    Args:
        k: number of classes, ``k >= 2``.
        dtype: dtype of the result.
        device: device of the result.

    Returns:
        ``k x (k-1)`` matrix ``O`` with ``O^T O = I`` and ``O^T 1 = 0``. Column ``j`` is
        ``(1, ..., 1, -(j+1), 0, ..., 0) / sqrt((j+1)(j+2))`` with ``j+1`` leading ones.
    """
    out = torch.zeros(k, k - 1, dtype=torch.float64)
    for j in range(k - 1):
        out[: j + 1, j] = 1.0
        out[j + 1, j] = -(j + 1.0)
        out[:, j] /= ((j + 1.0) * (j + 2.0)) ** 0.5
    return out.to(dtype=dtype, device=device)


def reduced_class_factor(probs: Tensor, basis: Tensor) -> Tensor:
    """Square factor of each row's class Fisher in the reduced (softmax-null-free) class space.

    With ``C = diag(p) - p p^T`` and ``O`` = ``basis``, returns ``E`` with ``E E^T = O^T C O``.
    ``E = O^T diag(sqrt p) H`` where ``H`` is the first ``k-1`` columns of the Householder reflector
    that sends ``sqrt p`` to ``-e_k`` (an orthonormal basis of ``sqrt(p)^⊥``); ``1 + sqrt(p_k) >= 1``,
    so the construction is stable for any probability vector, peaked ones included.

    Args:
        probs: ``m x k`` probabilities.
        basis: ``k x (k-1)`` orthonormal basis of ``1^⊥`` (:func:`helmert_basis`).

    Returns:
        ``m x (k-1) x (k-1)`` factors ``E``.
    """
    k = probs.shape[1]
    r = k - 1
    s = probs.clamp_min(0).sqrt()  # m x k
    v = s.clone()
    v[:, -1] += 1.0  # v = sqrt(p) + e_k, ||v||^2 = 2 (1 + s_k)
    denom = v[:, -1:]  # m x 1, equals 1 + s_k
    ot = basis.T  # r x k
    u = (s * v) @ basis  # m x r: O^T (s ∘ v)
    # O^T diag(s) I[:, :r]  minus  O^T (s ∘ v) v[:r]^T / (1 + s_k)
    e = ot[:, :r].unsqueeze(0) * s[:, None, :r]  # m x r x r
    e -= u[:, :, None] * (v[:, None, :r] / denom[:, :, None])
    return e


#: Bytes of the per-sub-block temporaries of the setup's pool loops (``m' x D`` products).
_SUB_BYTES = 2 * 2**20


def _sub_rows(width: int, x: Tensor) -> int:
    """Rows per sub-block so that an ``m' x width`` temporary of ``x``'s dtype stays near :data:`_SUB_BYTES`.

    Off CPU (one kernel launch per op) the whole chunk is one sub-block.
    """
    if x.device.type != "cpu":
        return max(1, int(x.shape[0]))
    return max(64, _SUB_BYTES // max(1, width * x.element_size()))


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run the block with torch's intra-op threads at ``n`` (>= 1), restoring the previous count after."""
    if n < 1:
        raise ValueError(f"torch threads must be >= 1, got {n}")
    saved = torch.get_num_threads()
    if saved != n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if torch.get_num_threads() != saved:
            torch.set_num_threads(saved)


def matmul(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b``; on CPU (no autograd) through numpy's ``matmul`` (OpenBLAS), else torch.

    On the 2-core AMD EPYC this project measures on, torch's MKL GEMM ran at 46 GFLOP/s per core in
    float32 (28 in float64) against OpenBLAS's 87 (f32, one thread) for ``8192 x 128 @ 128 x 162``, the
    greedy step's pool GEMM; the setup's ``n D^2`` GEMMs gain the same. Batched (3-D) operands work too.
    """
    if a.device.type != "cpu" or a.requires_grad or b.requires_grad:
        return a @ b
    return torch.from_numpy(np.matmul(a.numpy(), b.numpy()))


def accumulate_kron_upper(out: Tensor, x: Tensor, s: Tensor) -> None:
    """``out += sum_i s_i ⊗ x_i x_i^T`` on the upper block triangle (blocks ``b >= a``).

    One GEMM ``x^T @ Y_a`` per block row ``a`` (``Y_a`` is ``m x (r-a)d``): ``m D^2`` flops in all,
    over row sub-blocks whose ``Y_a`` stays near :data:`_SUB_BYTES` (cache-sized: forming ``Y_a``
    is a streaming write, and a chunk-sized one went to memory and back).
    The lower block triangle is left untouched; call :func:`symmetrize_blocks` once at the end.

    Args:
        out: ``D x D`` accumulator, ``D = r d``; may have a wider dtype than ``x``.
        x: ``m x d`` rows.
        s: ``m x r x r`` symmetric class matrices (weights already folded in).
    """
    m, d = x.shape
    r = s.shape[1]
    sub = _sub_rows(r * d, x)
    for a in range(r):
        acc: Tensor | None = None
        for lo in range(0, m, sub):
            xs = x[lo : lo + sub]
            y = (s[lo : lo + sub, a, a:, None] * xs[:, None, :]).reshape(xs.shape[0], (r - a) * d)  # m' x (r-a)d
            part = matmul(xs.T, y)
            acc = part if acc is None else acc.add_(part)
        if acc is not None:
            out[a * d : (a + 1) * d, a * d :] += acc.to(out.dtype)


def symmetrize_blocks(mat: Tensor, r: int) -> None:
    """Copy the upper ``d x d`` blocks of ``mat`` (``D x D``, ``D = r d``) onto the lower ones, in place."""
    d = mat.shape[0] // r
    for a in range(r):
        for b in range(a + 1, r):
            mat[b * d : (b + 1) * d, a * d : (a + 1) * d] = mat[a * d : (a + 1) * d, b * d : (b + 1) * d].T


def block_quadratic_forms(x: Tensor, mat: Tensor) -> Tensor:
    """Per-row ``r x r`` matrices ``G_i[a, b] = x_i^T mat_ab x_i`` for a symmetric block matrix.

    Uses the upper block triangle only: ``r`` GEMMs ``x @ mat[a-block, b>=a]``, ``m D^2`` flops, over
    cache-sized row sub-blocks (rows are independent: the result does not depend on the sub-block size).

    Args:
        x: ``m x d`` rows (same dtype as ``mat``).
        mat: ``D x D`` symmetric matrix, ``D = r d``.

    Returns:
        ``m x r x r`` symmetric matrices.
    """
    m, d = x.shape
    r = mat.shape[0] // d
    out = x.new_empty(m, r, r)
    sub = _sub_rows(mat.shape[0], x)
    for lo in range(0, m, sub):
        xs = x[lo : lo + sub]
        ms = xs.shape[0]
        for a in range(r):
            t = matmul(xs, mat[a * d : (a + 1) * d, a * d :])  # m' x (r-a)d
            vals = (t.view(ms, r - a, d) * xs[:, None, :]).sum(-1)  # m' x (r-a)
            out[lo : lo + ms, a, a:] = vals
            out[lo : lo + ms, a + 1 :, a] = vals[:, 1:]
    return out


def block_matvec(mat: Tensor, x: Tensor) -> Tensor:
    """``[mat_{:, b} x]_b`` for a ``D x D`` matrix and a ``d``-vector: the ``D x r`` matrix ``mat (I_r ⊗ x)``.

    Args:
        mat: ``D x D``, ``D = r d`` (or a block of its rows: ``m x D`` gives ``m x r``).
        x: ``d`` vector.

    Returns:
        ``D x r`` matrix (``2 D^2`` flops, one streaming read of ``mat``).
    """
    rows, big_d = mat.shape
    d = x.shape[0]
    return mat.view(rows, big_d // d, d) @ x


def block_contract(u: Tensor, x: Tensor) -> Tensor:
    """``(I_r ⊗ x)^T u``: the ``r x c`` matrix with row ``a`` equal to ``x^T u[a-block]``.

    Args:
        u: ``D x c``, ``D = r d``.
        x: ``d`` vector.

    Returns:
        ``r x c``.
    """
    big_d, c = u.shape
    d = x.shape[0]
    return torch.einsum("adc,d->ac", u.view(big_d // d, d, c), x)


def batch_last(a: Tensor) -> Tensor:
    """A contiguous ``r x c x m`` copy of the ``m x r x c`` batch ``a`` (a 2-D transpose of ``m x rc``).

    On CPU numpy's blocked transpose was 2x faster than ``permute(1, 2, 0).contiguous()`` for
    ``m = 8192, r = c = 9``. Always a copy: the callers modify the result in place.
    """
    m, r, c = a.shape
    flat = a.reshape(m, r * c)
    if a.device.type == "cpu" and not a.requires_grad:
        # np.array(copy=True): for m = 1 (or r c = 1) the transpose is already contiguous and
        # ascontiguousarray would return a view of ``a``, which the callers then modify in place.
        out = torch.from_numpy(np.array(flat.numpy().T, order="C", copy=True))
    else:
        out = flat.t().clone(memory_format=torch.contiguous_format)  # .contiguous() can be a view too
    return out.view(r, c, m)


def trace_solve_scores(g: Tensor, h: Tensor, sigma: float, *, half_h: bool = False) -> Tensor:
    """Batched ``tr(h_i (I + sigma g_i)^{-1})`` for symmetric ``h_i`` and positive definite ``I + sigma g_i``.

    Rows whose matrix ``I + sigma g_i`` is not numerically positive definite get NaN (the callers map
    NaN to the worst score).

    Args:
        g: ``m x r x r`` symmetric.
        h: ``m x r x r`` symmetric.
        sigma: ``+1`` (adding a point) or ``-1`` (removing one).
        half_h: ``h`` holds ``h~`` with ``h_i = h~_i + h~_i^T`` (any ``h~``, not necessarily symmetric).

    Returns:
        ``m`` scores.
    """
    m, r, _ = g.shape
    if r == 1:
        den = 1.0 + sigma * g[:, 0, 0]
        out = (2.0 * h[:, 0, 0] if half_h else h[:, 0, 0]) / den
        return torch.where(den > 0, out, torch.full_like(out, float("nan")))
    if r > _ELIMINATION_MAX_R:
        if half_h:
            h = h + h.transpose(1, 2)
        a = g * sigma
        a.diagonal(dim1=1, dim2=2).add_(1.0)
        chol, info = torch.linalg.cholesky_ex(a)
        y = torch.linalg.solve_triangular(chol, h, upper=False)  # L^{-1} h
        z = torch.linalg.solve_triangular(chol, y.transpose(1, 2), upper=False)  # L^{-1} h L^{-T}
        out = z.diagonal(dim1=1, dim2=2).sum(-1)
        return torch.where(info == 0, out, torch.full_like(out, float("nan")))
    # Symmetric elimination (LDL^T) on batch-last copies, so every op is a contiguous vector op over
    # the chunk: at pivot j, A <- A - l a_j^T and h <- h - l h_j^T - h_j l^T + h_jj l l^T on the
    # trailing block (l = a_j / a_jj), and tr(A^{-1} h) = sum_j h_jj / a_jj.
    a = batch_last(g)  # r x r x m
    if sigma != 1.0:
        a.mul_(sigma)
    a.diagonal(dim1=0, dim2=1).add_(1.0)
    hh = batch_last(h)  # r x r x m
    if half_h:
        hh = hh + hh.transpose(0, 1)  # contiguous in m: a fast elementwise op
    out = torch.zeros(m, dtype=g.dtype, device=g.device)
    min_piv = a[0, 0].clone()
    for j in range(r):
        piv = a[j, j]
        torch.minimum(min_piv, piv, out=min_piv)
        inv = 1.0 / piv
        hjj = hh[j, j]
        out.addcmul_(hjj, inv)
        if j + 1 < r:
            col = a[j + 1 :, j]  # r' x m; equals row j by symmetry
            lvec = col * inv
            a[j + 1 :, j + 1 :].addcmul_(lvec[:, None], col[None], value=-1.0)
            hj = hh[j + 1 :, j]  # r' x m
            t = torch.addcmul(hj, lvec, hjj, value=-1.0)
            sub = hh[j + 1 :, j + 1 :]
            sub.addcmul_(lvec[:, None], hj[None], value=-1.0)
            sub.addcmul_(t[:, None], lvec[None], value=-1.0)
    return torch.where(min_piv > 0, out, torch.full_like(out, float("nan")))


def logdet_scores(g: Tensor) -> Tensor:
    """Batched ``log det(I + g_i)``; NaN where ``I + g_i`` is not numerically positive definite.

    Args:
        g: ``m x r x r`` symmetric positive semidefinite.

    Returns:
        ``m`` values.
    """
    r = g.shape[1]
    if r == 1:
        den = 1.0 + g[:, 0, 0]
        out = torch.log(den.clamp_min(torch.finfo(g.dtype).tiny))
        return torch.where(den > 0, out, torch.full_like(out, float("nan")))
    a = g.clone()
    a.diagonal(dim1=1, dim2=2).add_(1.0)
    chol, info = torch.linalg.cholesky_ex(a)
    out = 2.0 * chol.diagonal(dim1=1, dim2=2).log().sum(-1)
    return torch.where(info == 0, out, torch.full_like(out, float("nan")))


#: Smallest row chunk of a rank-one step (below it the per-chunk op overhead shows).
RANK_ONE_MIN_CHUNK = 2**14


def rank_one_chunk(n_rows: int, threads: int, cap: int) -> int:
    """Row chunk of a rank-one step over ``n_rows`` candidates on ``threads`` workers: big chunks keep the op
    count small (at most ``cap``), but at least one chunk per worker thread (one chunk of 10^5 x 768 left the
    second core idle: 52 -> 99 ms median per step against 58 -> 63 ms in two chunks, one core busy elsewhere)."""
    per_thread = -(-max(1, n_rows) // max(1, threads))
    return max(RANK_ONE_MIN_CHUNK, min(cap, per_thread))


def rank_one_update(x: Tensor, et: Tensor, g: Tensor, h: Tensor | None, blocks: Tensor, sigma: float) -> None:
    """The rank-one (regression, binary) greedy step on ``m`` rows, in place: ``g -= sigma w^2`` and
    ``h -= 2 sigma w z`` with ``[w | z] = e * (X [u | v])``.

    One streaming GEMV in the pool dtype (``blocks^T X^T``: 1.6x faster than ``X @ blocks`` for two
    columns, 10.4 vs 6.5 GB/s of ``X`` read on one thread, and its rows are contiguous for the vector ops);
    the (float64) state absorbs the result. The step is bound by the memory traffic of reading ``X``, which
    is why the cost model times it on its own (:mod:`selection.calibrate`, ``rank1``).

    Args:
        x: ``m x d`` rows (pool dtype).
        et: ``m x 1 x 1`` scaled factors.
        g: ``m x 1 x 1``, updated in place.
        h: ``m x 1 x 1`` or ``None``, updated in place.
        blocks: ``d x c`` (``c = 1`` without ``h``, else 2).
        sigma: ``+1`` or ``-1``.
    """
    t = (blocks.to(x.dtype).T.contiguous() @ x.T).to(g.dtype)  # c x m
    w = et[:, 0, 0] * t[0]
    g[:, 0, 0] -= sigma * w * w
    if h is not None:
        z = et[:, 0, 0] * t[1]
        h[:, 0, 0] -= (2.0 * sigma) * w * z

"""The exact greedy step's per-candidate algebra as one compiled kernel (CPU, numba).

After a pick, every candidate ``x`` needs (notes/fast-bait.md, sec. 2b)

* ``[W | Z] = E_x^T T_x`` with ``T_x = (I ⊗ x^T) [U~ | R^]`` (``r x 2 rc``, from one pool GEMM),
* ``g_x -= W W^T`` and ``h~_x -= W Z^T`` (``h = h~ + h~^T``),
* the score ``tr(h (I + g)^{-1})`` by symmetric elimination.

numpy runs these as ~10 batched calls per chunk of candidates, each a pass over the chunk's state in
memory, with ``r x r`` matrix products that BLAS does not speed up: 35 ms update + 51 ms score of a
~140 ms step at n = 10^5, r = 9 on one thread. Here one kernel does all of it for a tile of
:func:`lanes_for` candidates (256 for small ``r``) at a time while the tile's work arrays are in
cache, with the candidates as the innermost, unit-stride loop of every line so that LLVM vectorises it
("batch-last" layout: ``state[tile, a, b, lane]``). The arithmetic is the same as the numpy path's
(same formulas, same elimination order); only the summation order inside the small products differs
(and products may be fused into FMAs), so float64 picks agree with the naive implementation as before
(tests/selection).

The kernels are compiled on first use per dtype (about 1-3 s) and cached on disk by numba
(``cache=True``: in ``__pycache__`` next to this file, or numba's user cache directory when that is not
writable), so later processes load them in milliseconds.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import njit

__all__ = ["from_tiles", "fused_step", "lanes_for", "padded", "to_tiles", "warm_up"]

#: Candidates per tile for small ``r``. The kernel's lane loops are vectorised by LLVM with run-time
#: alias checks, whose cost is paid per loop: one thread, n = 8,192, d = 128, r = 9, float32, the
#: kernel took 968 ns per candidate with 16 lanes fully unrolled (not vectorised), then 538 / 449 /
#: 406 / 290 / 221 / 259 ns with 16 / 32 / 64 / 128 / 256 / 512 lanes.
MAX_LANES = 256
#: Work-array words per tile (``r^2 x lanes``) at most, once below 256 lanes: at r = 25 (n = 4,992,
#: one thread, float32) the kernel took 10.7 / 8.6 / 6.5 / 6.5 / 6.9 us per candidate with 16 / 32 /
#: 64 / 128 / 256 lanes, so 64 there; r = 9 keeps 256.
_TILE_WORDS = 625 * 64


def lanes_for(rc: int) -> int:
    """Candidates per tile for ``rc x rc`` per-candidate matrices: 256, halved while ``rc^2 x lanes`` is large."""
    lanes = MAX_LANES
    while lanes > 16 and rc * rc * lanes > _TILE_WORDS:
        lanes //= 2
    return lanes


def padded(n: int, lanes: int) -> int:
    """``n`` rounded up to a whole number of tiles."""
    return lanes * math.ceil(n / lanes)


def to_tiles(a: np.ndarray[Any, Any], n_pad: int, lanes: int) -> np.ndarray[Any, Any]:
    """``m x p x q`` (batch first) -> ``n_pad / lanes x p x q x lanes`` (tile-major, lanes last), zero-padded."""
    m, p, q = a.shape
    out = np.zeros((n_pad // lanes, p, q, lanes), dtype=a.dtype)
    full = m // lanes
    if full:
        out[:full] = a[: full * lanes].reshape(full, lanes, p, q).transpose(0, 2, 3, 1)
    rest = m - full * lanes
    if rest:
        out[full, :, :, :rest] = a[full * lanes :].transpose(1, 2, 0)
    return out


def from_tiles(t: np.ndarray[Any, Any], m: int) -> np.ndarray[Any, Any]:
    """Inverse of :func:`to_tiles`: the first ``m`` candidates as a contiguous ``m x p x q`` array."""
    nt, p, q, lanes = t.shape
    return np.ascontiguousarray(t.transpose(0, 3, 1, 2).reshape(nt * lanes, p, q)[:m])


def _jit(fn: Any) -> Any:
    """``njit`` without the GIL, numpy's error model (no zero-division branch in the lane loops) and
    FMA contraction; cached on disk, or compiled per process where numba finds no writable cache
    directory (it would otherwise fail at import: set ``NUMBA_CACHE_DIR`` to keep the cache)."""
    options: dict[str, Any] = {"nogil": True, "error_model": "numpy", "fastmath": {"contract"}}
    try:
        return njit(cache=True, **options)(fn)
    except RuntimeError:  # "cannot cache function ...: no locator available"
        return njit(**options)(fn)


@_jit
def _step_kernel(
    t: np.ndarray[Any, Any],
    et: np.ndarray[Any, Any],
    g: np.ndarray[Any, Any],
    h: np.ndarray[Any, Any],
    out: np.ndarray[Any, Any],
    consts: np.ndarray[Any, Any],
    scratch: np.ndarray[Any, Any],
    vec: np.ndarray[Any, Any],
) -> None:  # pragma: no cover - compiled; exercised through fused_step
    nt, rc, r, lanes = et.shape
    # sigma, 1, 0 and NaN in the arrays' dtype: a Python float literal would promote float32 lanes to float64.
    sigma = consts[0]
    one = consts[1]
    zero = consts[2]
    nan = consts[3]
    w = scratch[0]
    z = scratch[1]
    a = scratch[2]
    hs = scratch[3]
    acc = vec[0]
    acc2 = vec[1]
    inv = vec[2]
    res = vec[3]
    lv = scratch[4]  # l vectors: lv[p, 0, :]
    tv = scratch[5]  # t vectors: tv[p, 0, :]
    two_rc = 2 * rc
    for tile in range(nt):
        base = tile * lanes
        # [W | Z] = E^T T
        for p in range(rc):
            for q in range(rc):
                for i in range(lanes):
                    acc[i] = zero
                    acc2[i] = zero
                for j in range(r):
                    ru = j * two_rc + q
                    rz = ru + rc
                    for i in range(lanes):
                        e = et[tile, p, j, i]
                        acc[i] += e * t[ru, base + i]
                        acc2[i] += e * t[rz, base + i]
                for i in range(lanes):
                    w[p, q, i] = acc[i]
                    z[p, q, i] = acc2[i]
        # g -= sigma W W^T (symmetric: lower triangle mirrored), h~ -= sigma W Z^T
        for p in range(rc):
            for q in range(rc):
                for i in range(lanes):
                    acc[i] = zero
                for j in range(rc):
                    for i in range(lanes):
                        acc[i] += w[p, j, i] * z[q, j, i]
                for i in range(lanes):
                    h[tile, p, q, i] -= sigma * acc[i]
            for q in range(p + 1):
                for i in range(lanes):
                    acc[i] = zero
                for j in range(rc):
                    for i in range(lanes):
                        acc[i] += w[p, j, i] * w[q, j, i]
                for i in range(lanes):
                    v = g[tile, p, q, i] - sigma * acc[i]
                    g[tile, p, q, i] = v
                    g[tile, q, p, i] = v
        # tr(h (I + sigma g)^{-1}), h = h~ + h~^T, by symmetric elimination on the lower triangles
        # (as selection.linalg.trace_solve_scores): at pivot j, tr += h_jj / a_jj, then
        # A <- A - l a_j^T, h <- h - l h_j^T - t l^T (t = h_j - h_jj l) on the trailing block.
        for p in range(rc):
            for q in range(p + 1):
                for i in range(lanes):
                    a[p, q, i] = sigma * g[tile, p, q, i]
                    hs[p, q, i] = h[tile, p, q, i] + h[tile, q, p, i]
            for i in range(lanes):
                a[p, p, i] += one
        for i in range(lanes):
            res[i] = zero
        for jj in range(rc):
            for i in range(lanes):
                piv = a[jj, jj, i]
                iv = one / piv if piv > zero else nan
                inv[i] = iv
                res[i] += hs[jj, jj, i] * iv
            for p in range(jj + 1, rc):
                for i in range(lanes):
                    lp = a[p, jj, i] * inv[i]
                    lv[p, 0, i] = lp
                    tv[p, 0, i] = hs[p, jj, i] - lp * hs[jj, jj, i]
            for p in range(jj + 1, rc):
                for q in range(jj + 1, p + 1):
                    for i in range(lanes):
                        a[p, q, i] -= lv[p, 0, i] * a[q, jj, i]
                        hs[p, q, i] -= lv[p, 0, i] * hs[q, jj, i] + tv[p, 0, i] * lv[q, 0, i]
        for i in range(lanes):
            out[base + i] = res[i]


def fused_step(
    t: np.ndarray[Any, Any],
    et: np.ndarray[Any, Any],
    g: np.ndarray[Any, Any],
    h: np.ndarray[Any, Any],
    out: np.ndarray[Any, Any],
    sigma: float,
    scratch: np.ndarray[Any, Any],
    vec: np.ndarray[Any, Any],
) -> None:
    """Update ``g``, ``h~`` of a run of tiles in place and write their scores (NaN: not positive definite).

    Args:
        t: ``(r * 2 * rc) x (tiles * lanes)``: ``[U~ | R^]^T X^T`` for the tiles' candidates, row index
            ``(a, W/Z, col)`` as :meth:`selection.bait.engine._Bait._rank_update` lays out its blocks.
        et: ``tiles x rc x r x lanes`` transposed class factors ``E^T``.
        g: ``tiles x rc x rc x lanes``, updated in place.
        h: ``tiles x rc x rc x lanes`` holding ``h~`` (``h = h~ + h~^T``), updated in place.
        out: ``tiles * lanes`` scores.
        sigma: ``+1`` (a point added) or ``-1`` (removed).
        scratch: ``6 x rc x rc x lanes`` work array of the same dtype (per thread).
        vec: ``4 x lanes`` work array of the same dtype (per thread).
    """
    consts = np.array([sigma, 1.0, 0.0, np.nan], dtype=g.dtype)
    _step_kernel(t, et, g, h, out, consts, scratch, vec)


def warm_up() -> None:
    """Compile (or load from the cache) the kernel for float32 and float64 on a one-tile problem."""
    for dt in (np.float32, np.float64):
        lanes = lanes_for(2)
        fused_step(
            np.zeros((8, lanes), dtype=dt),
            np.zeros((1, 2, 2, lanes), dtype=dt),
            np.zeros((1, 2, 2, lanes), dtype=dt),
            np.zeros((1, 2, 2, lanes), dtype=dt),
            np.zeros(lanes, dtype=dt),
            1.0,
            np.empty((6, 2, 2, lanes), dtype=dt),
            np.empty((4, lanes), dtype=dt),
        )

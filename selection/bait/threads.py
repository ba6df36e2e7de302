"""Worker threads of the exact engine: how many, the pool that runs chunk jobs, and per-thread buffers.

Each chunk job is computed by one thread exactly as it would be serially (torch's intra-op threads and
OpenBLAS held at one thread meanwhile), so picks and state do not depend on the thread count. The cost
model (:mod:`selection.bait.plan`) asks :func:`resolve_threads` too, so it plans with the threads the
engine will use.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from selection.errors import ParameterError

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

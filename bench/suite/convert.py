"""Generic conversion steps: seeded splits, standardisation, subsampling, table -> arrays.

Converters (:mod:`bench.suite.registry`) return a :class:`Converted`; :func:`bench.suite.save`
checks it against the suite's conventions and caches it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from bench.suite.spec import DatasetSpec

if TYPE_CHECKING:
    import pandas as pd

#: The seed of every split and subsample (fixed: the suite's splits never change between fetches).
SPLIT_SEED = 20_26_14


@dataclass
class Converted:
    """Arrays of one dataset, in the conventions of :mod:`bench.suite`."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    classes: list[str] | None

    def check(self, spec: DatasetSpec) -> None:
        """Raise ``ValueError`` when the arrays break the conventions for ``spec``'s task."""
        name = spec.name
        for part in ("x_train", "x_test"):
            x = getattr(self, part)
            if x.dtype != np.float32 or x.ndim != 2 or not np.isfinite(x).all():
                raise ValueError(f"{name}: {part} must be a finite float32 (n, d) array, got {x.dtype} {x.shape}")
        if self.x_train.shape[1] != self.x_test.shape[1]:
            raise ValueError(f"{name}: train has {self.x_train.shape[1]} features, test {self.x_test.shape[1]}")
        for x, y, part in ((self.x_train, self.y_train, "train"), (self.x_test, self.y_test, "test")):
            if y.shape[0] != x.shape[0]:
                raise ValueError(f"{name}: {part} has {x.shape[0]} rows but {y.shape[0]} targets")
        if spec.task == "regression":
            if self.classes is not None:
                raise ValueError(f"{name}: a regression dataset has no classes")
            for y in (self.y_train, self.y_test):
                if y.dtype != np.float32 or y.ndim != 2 or not np.isfinite(y).all():
                    raise ValueError(f"{name}: regression targets must be finite float32 (n, m), got {y.dtype}")
            return
        if self.classes is None:
            raise ValueError(f"{name}: a classification dataset needs class names")
        k = len(self.classes)
        if (spec.task == "binary") != (k == 2):
            raise ValueError(f"{name}: task {spec.task} with {k} classes")
        for y in (self.y_train, self.y_test):
            if y.dtype != np.int64 or y.ndim != 1 or (y.size and (y.min() < 0 or y.max() >= k)):
                raise ValueError(f"{name}: class targets must be int64 indices in 0..{k - 1}")
        missing = sorted(set(range(k)) - set(np.unique(self.y_train).tolist()))
        if missing:
            raise ValueError(f"{name}: classes {missing} have no training row")


def split_indices(
    n: int,
    *,
    test_fraction: float = 0.25,
    stratify: np.ndarray | None = None,
    max_train: int | None = None,
    max_test: int | None = None,
    seed: int = SPLIT_SEED,
) -> tuple[np.ndarray, np.ndarray]:
    """Seeded train/test row indices (sorted), stratified by ``stratify`` when given, then capped.

    Caps keep each part's class proportions (a stratified subsample). Deterministic in its arguments.
    """
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    rng = np.random.default_rng(seed)
    groups = [np.arange(n)] if stratify is None else [np.flatnonzero(stratify == c) for c in np.unique(stratify)]
    train: list[np.ndarray] = []
    test: list[np.ndarray] = []
    for rows in groups:
        rows = rng.permutation(rows)
        n_test = round(len(rows) * test_fraction)
        if len(rows) >= 2:
            n_test = min(max(n_test, 1), len(rows) - 1)
        test.append(rows[:n_test])
        train.append(rows[n_test:])
    tr, te = np.concatenate(train), np.concatenate(test)
    return np.sort(_cap(tr, max_train, stratify, rng)), np.sort(_cap(te, max_test, stratify, rng))


def _cap(rows: np.ndarray, cap: int | None, stratify: np.ndarray | None, rng: np.random.Generator) -> np.ndarray:
    if cap is None or len(rows) <= cap:
        return rows
    if stratify is None:
        return rng.choice(rows, size=cap, replace=False)
    labels = stratify[rows]
    keep: list[np.ndarray] = []
    classes, counts = np.unique(labels, return_counts=True)
    quota = np.maximum(1, np.floor(counts * cap / len(rows)).astype(int))
    for c, q in zip(classes, quota, strict=True):
        keep.append(rng.choice(rows[labels == c], size=min(int(q), int((labels == c).sum())), replace=False))
    return np.concatenate(keep)


def standardize(train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both as float32, centred and scaled by the training split's mean and std (constant columns: 1)."""
    mean = train.mean(axis=0, dtype=np.float64)
    std = train.std(axis=0, dtype=np.float64)
    std[std == 0] = 1.0
    return ((train - mean) / std).astype(np.float32), ((test - mean) / std).astype(np.float32)


def classification(
    x: np.ndarray,
    labels: Sequence[Any] | np.ndarray,
    *,
    scale: bool = True,
    classes: Sequence[str] | None = None,
    **split: Any,
) -> Converted:
    """Seeded stratified split of ``x`` with class labels ``labels`` (any hashables; names in ``classes``
    order when given, else sorted), features standardised when ``scale``."""
    lab = np.asarray([str(v) for v in labels])
    names = list(classes) if classes is not None else sorted(set(lab.tolist()))
    index = {c: i for i, c in enumerate(names)}
    y = np.asarray([index[v] for v in lab], dtype=np.int64)
    tr, te = split_indices(len(y), stratify=y, **split)
    x = np.asarray(x, dtype=np.float64)
    if scale:
        xtr, xte = standardize(x[tr], x[te])
    else:
        xtr, xte = x[tr].astype(np.float32), x[te].astype(np.float32)
    # Only the classes that made it into the subsample (a cap can drop a class of one row).
    present = np.unique(y[tr])
    if len(present) < len(names):
        remap = -np.ones(len(names), dtype=np.int64)
        remap[present] = np.arange(len(present))
        keep_te = np.isin(y[te], present)
        return Converted(xtr, remap[y[tr]], xte[keep_te], remap[y[te][keep_te]], [names[i] for i in present])
    return Converted(xtr, y[tr], xte, y[te], names)


def regression(x: np.ndarray, target: np.ndarray, *, scale: bool = True, **split: Any) -> Converted:
    """Seeded split of ``x`` with targets ``target`` (``(n,)`` or ``(n, m)``); targets are standardised
    by the training split, features too when ``scale``."""
    t = np.asarray(target, dtype=np.float64)
    if t.ndim == 1:
        t = t[:, None]
    tr, te = split_indices(len(t), **split)
    x = np.asarray(x, dtype=np.float64)
    xtr, xte = standardize(x[tr], x[te]) if scale else (x[tr].astype(np.float32), x[te].astype(np.float32))
    ytr, yte = standardize(t[tr], t[te])
    return Converted(xtr, ytr, xte, yte, None)


def frame_features(frame: pd.DataFrame) -> np.ndarray:
    """A table's columns as float64 features: numbers as they are, two-level categoricals as 0/1,
    other categoricals and strings one-hot; rows with a missing value are the caller's to drop."""
    import pandas as pd

    cols: list[np.ndarray] = []
    for name in frame.columns:
        col = frame[name]
        if pd.api.types.is_bool_dtype(col) or pd.api.types.is_numeric_dtype(col):
            cols.append(col.astype("float64").to_numpy()[:, None])
            continue
        cats = col.astype("category")
        levels = list(cats.cat.categories)
        codes = cats.cat.codes.to_numpy()
        if len(levels) <= 2:
            cols.append((codes == len(levels) - 1).astype(np.float64)[:, None])
        else:
            cols.append((codes[:, None] == np.arange(len(levels))[None, :]).astype(np.float64))
    return np.concatenate(cols, axis=1) if cols else np.zeros((len(frame), 0))

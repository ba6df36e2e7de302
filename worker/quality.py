"""Model quality after training: scores of the new head on the pool's labeled validation items, and a
2-D map of the pool in the head's feature space. Both are stored with the checkpoint by the batch job.

The map samples at most :data:`MAP_MAX_POINTS` items: the batch just chosen, then labeled, reserved and
validation items (up to a quarter of the budget each), then unlabeled items at random (seeded by the
batch), and projects their penultimate features onto two principal components fitted on that sample.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from sqlalchemy.orm import Session, sessionmaker

from selection.heads import TrainedHead
from selection.heads import predict as head_predict
from selection.metrics import classification_metrics, pca_2d, regression_metrics
from service.db import session_scope
from service.store import quality as store
from service.store.models import Pool
from worker import stopping
from worker.pool_data import PoolArrays, PoolDataError, label_decoder

log = logging.getLogger(__name__)

MAP_MAX_POINTS = 20_000


@dataclass
class ValidationSet:
    """Labeled validation items: ``external_ids`` (n_V), ``X`` (n_V x d float32), ``y`` (class indices
    ``(n_V,)`` or ``n_V x m`` targets)."""

    external_ids: list[str]
    X: np.ndarray
    y: np.ndarray

    @property
    def n(self) -> int:
        return int(self.X.shape[0])


@dataclass
class Quality:
    """What the batch job stores with a checkpoint: ``validation`` (``{"n", "metrics"}`` or None) and the
    map's JSON bytes with its number of points."""

    validation: dict[str, Any] | None
    map_json: bytes | None = None
    map_points: int = 0
    val: ValidationSet | None = None  # the items scored, drawn into the map too
    stop_set: stopping.StopSet | None = None  # the head's predictions on the pool's stop set (stopping rule)


def _numpy(t: Any) -> np.ndarray:
    if isinstance(t, torch.Tensor):
        return t.detach().double().cpu().numpy()
    return np.asarray(t, dtype=np.float64)


def load_validation(factory: sessionmaker[Session], pool_id: str) -> ValidationSet | None:
    """The pool's labeled validation items with an embedding (labels that do not fit the pool are
    skipped with a warning), or ``None`` when there are none."""
    with session_scope(factory) as s:
        pool = s.get(Pool, pool_id)
        if pool is None:
            return None
        d = int(pool.embedding_dim)
        decode = label_decoder(pool)
        rows = store.validation_rows(s, pool_id)
        task = pool.task
        m = int(pool.n_outputs)
    ids: list[str] = []
    blobs: list[bytes] = []
    ys: list[Any] = []
    for _, ext, blob, label in rows:
        if blob is None or len(blob) != 4 * d:
            continue
        try:
            ys.append(decode(label))
        except PoolDataError as exc:
            log.warning("pool %s: validation item %r skipped: %s", pool_id, ext, exc)
            continue
        ids.append(ext)
        blobs.append(blob)
    if not ids:
        return None
    X = np.frombuffer(b"".join(blobs), dtype="<f4").reshape(len(ids), d).copy()
    y = np.asarray(ys, dtype=np.int64) if task == "classification" else np.asarray(ys, np.float32).reshape(-1, m)
    return ValidationSet(ids, X, y)


def score(trained: TrainedHead, val: ValidationSet, classes: list[str] | None) -> dict[str, Any]:
    """``{"n", "metrics"}`` of ``trained`` on ``val``."""
    out = head_predict(trained, val.X)
    if out.probs is not None:
        metrics = classification_metrics(_numpy(out.probs), val.y, classes)
    else:
        metrics = regression_metrics(_numpy(out.outputs), val.y)
    return {"n": val.n, "metrics": metrics}


def _sample_rows(data: PoolArrays, chosen: np.ndarray, seed: int, budget: int) -> np.ndarray:
    """Pool rows drawn into the map: chosen first, then labeled and reserved (a quarter of the budget
    each), then the rest at random."""
    rng = np.random.default_rng(seed)
    taken = np.zeros(data.n, dtype=bool)
    picked: list[np.ndarray] = []

    def take(rows: np.ndarray, limit: int) -> None:
        rows = rows[~taken[rows]]
        if rows.shape[0] > limit:
            rows = rng.choice(rows, size=limit, replace=False)
        taken[rows] = True
        picked.append(rows)

    take(np.asarray(chosen, dtype=np.int64), budget)
    take(data.labeled, max(0, min(budget // 4, budget - int(taken.sum()))))
    take(data.reserved, max(0, min(budget // 4, budget - int(taken.sum()))))
    take(np.flatnonzero(~taken), max(0, budget - int(taken.sum())))
    return np.sort(np.concatenate(picked))


def pool_map(
    trained: TrainedHead,
    features: Any,
    probs: Any,
    data: PoolArrays,
    chosen: np.ndarray,
    classes: list[str] | None,
    val: ValidationSet | None,
    seed: int,
    max_points: int = MAP_MAX_POINTS,
) -> tuple[bytes, int]:
    """The map's JSON bytes and its number of points.

    Args:
        features: ``n x d_pen`` penultimate features of every pool row (tensor or array).
        probs: ``n x k`` probabilities (classification) or ``None``.
        chosen: rows of this batch.
        val: validation items, drawn as ``validation`` points (within the budget).
    """
    n_val = 0 if val is None else min(val.n, max_points // 4)
    rows = _sample_rows(data, chosen, seed, max_points - n_val)
    F = _numpy(features)[rows] if rows.shape[0] else np.zeros((0, 1))
    status = np.full(rows.shape[0], "unlabeled", dtype=object)
    status[np.isin(rows, data.reserved)] = "reserved"
    status[np.isin(rows, data.labeled)] = "labeled"
    status[np.isin(rows, chosen)] = "selected"
    labels: list[Any] = [None] * rows.shape[0]
    pos = np.searchsorted(data.labeled, rows)
    is_lab = (pos < data.labeled.shape[0]) & (data.labeled[np.minimum(pos, max(data.labeled.shape[0] - 1, 0))] == rows)
    if classes is not None and data.labeled.shape[0]:
        for i in np.flatnonzero(is_lab):
            labels[int(i)] = classes[int(data.y[pos[i]])]
    predicted: list[Any] = [None] * rows.shape[0]
    confidence: list[Any] = [None] * rows.shape[0]
    if classes is not None and probs is not None and rows.shape[0]:
        P = _numpy(probs)[rows]  # r x k
        predicted = [classes[int(c)] for c in P.argmax(axis=1)]
        confidence = [round(float(v), 4) for v in P.max(axis=1)]
    ids = [data.external_ids[int(r)] for r in rows]
    status_list = list(status)
    if val is not None and n_val:
        out = head_predict(trained, val.X[:n_val])
        F = np.concatenate([F, _numpy(out.features)]) if F.shape[0] else _numpy(out.features)
        ids += val.external_ids[:n_val]
        status_list += ["validation"] * n_val
        if classes is not None:
            labels += [classes[int(c)] for c in val.y[:n_val]]
            if out.probs is not None:
                Pv = _numpy(out.probs)
                predicted += [classes[int(c)] for c in Pv.argmax(axis=1)]
                confidence += [round(float(v), 4) for v in Pv.max(axis=1)]
        else:
            labels += [None] * n_val
            predicted += [None] * n_val
            confidence += [None] * n_val
    fit = np.arange(rows.shape[0]) if rows.shape[0] >= 2 else None
    xy = pca_2d(F, fit) if F.shape[0] else np.zeros((0, 2), dtype=np.float32)
    payload = {
        "total": data.n + (0 if val is None else val.n),
        "n_points": len(ids),
        "classes": classes,
        "method": "pca of penultimate features",
        "points": {
            "id": ids,
            "x": [round(float(v), 4) for v in xy[:, 0]],
            "y": [round(float(v), 4) for v in xy[:, 1]],
            "status": status_list,
            "label": labels,
            "predicted": predicted,
            "confidence": confidence,
        },
    }
    return json.dumps(payload, separators=(",", ":")).encode(), len(ids)


def assess(factory: sessionmaker[Session], pool_id: str, trained: TrainedHead, classes: list[str] | None) -> Quality:
    """Score ``trained`` on the pool's labeled validation items (``validation`` is None without any), and
    predict the pool's stop set (:mod:`worker.stopping`)."""
    val = load_validation(factory, pool_id)
    task = "classification" if classes is not None else "regression"
    stop_set = stopping.predict(factory, pool_id, trained, task)
    return Quality(None if val is None else score(trained, val, classes), val=val, stop_set=stop_set)


def draw_map(
    q: Quality,
    trained: TrainedHead,
    features: Any,
    probs: Any,
    data: PoolArrays,
    chosen: np.ndarray,
    classes: list[str] | None,
    seed: int,
) -> None:
    """Fill ``q.map_json`` (a failure is logged, never fails the batch: the map is a picture)."""
    try:
        q.map_json, q.map_points = pool_map(trained, features, probs, data, np.asarray(chosen), classes, q.val, seed)
    except Exception:
        log.exception("the 2-D map could not be computed; the checkpoint is stored without it")
        q.map_json, q.map_points = None, 0

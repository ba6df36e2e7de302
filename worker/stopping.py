"""The stopping rule around a checkpoint (the numbers come from :mod:`selection.stopping`).

When a batch trains a head, :func:`predict` has it predict the pool's *stop set*: up to
:data:`STOP_SET_SIZE` items, drawn once per pool from its unlabeled training items (those whose
``blake2b(f"{pool id}:{external id}")`` are smallest: reproducible, independent of upload order) and then
carried from checkpoint to checkpoint unchanged (an item labeled later stays in it; a deleted one drops out;
when none is left a new set is drawn). In the transaction that stores the checkpoint, :func:`record` compares
those predictions with the previous round's (the latest earlier checkpoint trained on a different number of
labels) on the items both predicted, and stores the agreement and the stop recommendation for every
validation metric of the pool's task.
"""

from __future__ import annotations

import hashlib
import heapq
import io
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import torch
from sqlalchemy.orm import Session, sessionmaker

from selection.heads import TrainedHead
from selection.heads import predict as head_predict
from selection.stopping import prediction_agreement, stop_from_agreements
from service.db import session_scope
from service.domain.quality import CLASSIFICATION_METRICS, REGRESSION_METRICS
from service.store import content as content_store
from service.store import stopping as store
from service.store.models import Pool

log = logging.getLogger(__name__)

STOP_SET_SIZE = 2000


@dataclass
class StopSet:
    """A head's predictions on the stop set: ``item_ids`` ``(s,)`` internal ids, ascending; ``pred``
    ``(s,)`` class indices (int64) or ``s x m`` targets (float32)."""

    item_ids: np.ndarray
    pred: np.ndarray

    def encode(self) -> bytes:
        buf = io.BytesIO()
        np.savez_compressed(buf, ids=self.item_ids, pred=self.pred)
        return buf.getvalue()

    @classmethod
    def decode(cls, blob: bytes) -> StopSet:
        with np.load(io.BytesIO(blob), allow_pickle=False) as z:
            return cls(item_ids=z["ids"].astype(np.int64), pred=z["pred"])


def draw(pool_id: str, candidates: list[tuple[int, str]], size: int = STOP_SET_SIZE) -> np.ndarray:
    """Internal ids of the ``size`` candidates ``(id, external id)`` with the smallest hash, ascending."""

    def key(c: tuple[int, str]) -> bytes:
        return hashlib.blake2b(f"{pool_id}:{c[1]}".encode(), digest_size=8).digest()

    chosen = heapq.nsmallest(size, candidates, key=key)
    return np.sort(np.asarray([int(c[0]) for c in chosen], dtype=np.int64))


def predict(factory: sessionmaker[Session], pool_id: str, trained: TrainedHead, task: str) -> StopSet | None:
    """The head's predictions on the pool's stop set (None: the pool has no item to put in one). A failure is
    logged, never fails the batch: the checkpoint is then stored without stopping evidence."""
    try:
        with session_scope(factory) as s:
            pool = s.get(Pool, pool_id)
            if pool is None:
                return None
            d = int(pool.embedding_dim)
            carried = store.latest_predictions(s, pool_id)
            ids = StopSet.decode(carried).item_ids if carried is not None else np.zeros(0, dtype=np.int64)
            found = content_store.embeddings_by_id(s, pool_id, ids.tolist()) if ids.size else {}
            if not found:
                ids = draw(pool_id, [(int(i), str(e)) for i, e in store.unlabeled_candidates(s, pool_id)])
                found = content_store.embeddings_by_id(s, pool_id, ids.tolist())
        keep = [
            int(i)
            for i in ids.tolist()
            if (blob := found.get(int(i), ("", None))[1]) is not None and len(blob) == 4 * d
        ]
        if not keep:
            return None
        X = np.frombuffer(b"".join(found[i][1] for i in keep), dtype="<f4").reshape(len(keep), d).copy()  # type: ignore[misc]
        out = head_predict(trained, X)
        if task == "classification":
            pred = _numpy(out.probs).argmax(axis=1).astype(np.int64)
        else:
            pred = _numpy(out.outputs).astype(np.float32).reshape(len(keep), -1)
        return StopSet(item_ids=np.asarray(keep, dtype=np.int64), pred=pred)
    except Exception:
        log.exception("pool %s: the stop set could not be predicted; the checkpoint is stored without it", pool_id)
        return None


def _numpy(t: Any) -> np.ndarray:
    if isinstance(t, torch.Tensor):
        return t.detach().double().cpu().numpy()
    return np.asarray(t, dtype=np.float64)


def agreement(previous: StopSet, current: StopSet, task: str) -> tuple[float | None, int]:
    """Agreement of two rounds' predictions on the items both predicted, and how many those are."""
    common, ia, ib = np.intersect1d(previous.item_ids, current.item_ids, assume_unique=True, return_indices=True)
    if common.size == 0 or previous.pred.shape[1:] != current.pred.shape[1:]:
        return None, 0
    return prediction_agreement(previous.pred[ia], current.pred[ib], task), int(common.size)


def record(
    s: Session,
    pool_id: str,
    checkpoint_id: str,
    checkpoint_round: int,
    n_labels: int,
    task: str,
    stop_set: StopSet | None,
    now: datetime,
) -> None:
    """Store the checkpoint's stop-set predictions, their agreement with the previous round's and the stop
    recommendation per validation metric (in ``s``'s transaction, after the checkpoint row is flushed)."""
    value: float | None = None
    compared = 0
    previous = store.previous_round(s, pool_id, n_labels, checkpoint_round)
    recommendation: dict[str, Any] | None = None
    try:
        if stop_set is not None and previous is not None and previous[1] is not None:
            value, compared = agreement(StopSet.decode(previous[1]), stop_set, task)
        rows = store.history(s, pool_id)
        agreements = [value if cid == checkpoint_id else a for cid, _r, _n, _v, a in rows]
        metrics = CLASSIFICATION_METRICS if task == "classification" else REGRESSION_METRICS
        by_metric = {}
        for metric in metrics:
            curve = [(int(n), _value(v, metric)) for _c, _r, n, v, _a in rows]
            rec = stop_from_agreements(
                agreements, curve, agreement="kappa" if task == "classification" else "r2", metric=metric
            )
            by_metric[metric] = rec.as_dict()
        recommendation = {
            "stop_set": {
                "items": 0 if stop_set is None else int(stop_set.item_ids.shape[0]),
                "compared_with": None if previous is None else previous[0],
                "items_compared": compared,
            },
            "by_metric": by_metric,
        }
    except Exception:
        log.exception("pool %s: the stop recommendation could not be computed", pool_id)
    store.put(
        s,
        checkpoint_id,
        pool_id,
        0 if stop_set is None else int(stop_set.item_ids.shape[0]),
        None if stop_set is None else stop_set.encode(),
        value,
        recommendation,
        now,
    )


def _value(validation: dict[str, Any] | None, metric: str) -> float | None:
    metrics = (validation or {}).get("metrics") or {}
    v = metrics.get(metric)
    return float(v) if isinstance(v, int | float) and np.isfinite(v) else None

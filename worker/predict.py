"""The predict job: class probabilities (or targets) of some items from the pool's latest checkpoint.

Called synchronously (``JobQueue.call``) by the API's predictions and Label Studio's ``/predict``, and
by the Label Studio import for its pre-annotations.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from selection.heads import load_checkpoint
from selection.heads import predict as head_predict
from service.db import session_scope
from service.store import batches as store
from service.store.models import Pool
from worker import context, threads
from worker.runtime import resolve_device


def predict(pool_id: str, item_ids: list[str]) -> dict[str, Any]:
    """Predictions of the pool's latest checkpoint for ``item_ids`` (external ids, in order).

    Returns:
        ``{"checkpoint_id", "round", "predictions": [{"item_id", "probs": {class: p}, "label"}]}``
        (classification) or ``[{"item_id", "target": [m floats]}]`` (regression).
    """
    env = context.env()
    with session_scope(env.sessionmaker) as s:
        pool = s.get(Pool, pool_id)
        if pool is None:
            raise LookupError(f"pool {pool_id} does not exist")
        checkpoint = store.latest_checkpoint(s, pool_id)
        if checkpoint is None:
            raise LookupError("the pool has no checkpoint yet: request a batch first")
        found = store.items_by_external_id(s, pool_id, item_ids)
        blob = checkpoint.weights
        meta = {"checkpoint_id": checkpoint.id, "round": checkpoint.round}
        classes = list(pool.classes or [])
        task = pool.task
        d = int(pool.embedding_dim)
    missing = [i for i in item_ids if i not in found or found[i][1] is None]
    if missing:
        raise LookupError(f"{len(missing)} item(s) not found or without embedding: {missing[:10]}")
    X = np.frombuffer(bytearray(b"".join(found[i][1] or b"" for i in item_ids)), dtype="<f4").reshape(len(item_ids), d)
    with threads.torch_threads(env.settings.job_threads):
        trained = load_checkpoint(blob, device=resolve_device(env.settings.device))
        out = head_predict(trained, X)
    predictions: list[dict[str, Any]] = []
    if task == "classification":
        assert out.probs is not None
        P = out.probs.double().cpu().numpy()
        for ext, p in zip(item_ids, P, strict=True):
            predictions.append(
                {
                    "item_id": ext,
                    "probs": {c: float(v) for c, v in zip(classes, p, strict=True)},
                    "label": classes[int(p.argmax())],
                }
            )
    else:
        assert out.outputs is not None
        T = out.outputs.double().cpu().numpy()
        predictions = [{"item_id": ext, "target": [float(v) for v in t]} for ext, t in zip(item_ids, T, strict=True)]
    return {**meta, "predictions": predictions}

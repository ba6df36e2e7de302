"""Self-steering selection in the batch job: ``auto``'s history from the pool's earlier batches, and the
outlier check (flag, or exclude with ``params.exclude_outliers``) around the strategy.

History: every earlier *succeeded* ``auto`` batch of the pool, oldest first, is one round: the round
``auto`` recorded in its diagnostics (arm per pick, the bandit's probabilities, the model's predictions at
selection time), with the labels its items have now (null while unlabeled), the validation score of the
model that selected it (accuracy, or R^2 for regression, of its checkpoint on the pool's validation
items) and the labels that model was trained on. Batches of other strategies are not rounds of the bandit.

Outliers: :func:`selection.outliers.robust_outliers` on the pool's embeddings. Without
``exclude_outliers`` the picks it flags are named in the batch (``diagnostics.outliers``); with it the
flagged candidates are left out of the pool the strategy sees, so the batch keeps its size with the next
picks the strategy makes. ``auto`` excludes by default (``service.domain.strategies.excludes_outliers``), here,
like every strategy: the worker turns the library's own check of ``auto`` off, and ``diagnostics.auto.outliers``
says what this check did.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from sqlalchemy.orm import Session

from selection.outliers import robust_outliers
from service.domain import coldstart
from service.store import batches as store
from service.store.models import Batch
from worker.pool_data import PoolArrays

#: Earlier auto batches read as rounds (the newest ones).
MAX_ROUNDS = 500
#: ``diagnostics.outliers`` of a batch whose strategy reads no embeddings (random) without ``exclude_outliers``.
NOT_CHECKED = {"checked": False, "reason": "the strategy reads no embeddings (send exclude_outliers to check)"}


def auto_cold(task: str, classes: list[str] | None, data: PoolArrays) -> coldstart.ColdStart | None:
    """The service's cold-start rule on the pool's labels: ``auto`` plays the model-free arms when it fires, and a
    fixed model-based strategy is replaced by the cold-start strategy (``worker.batch.cold_start_choice``, which
    calls this, unless ``params.cold_start`` is false: a parameter ``auto`` refuses)."""
    counts = None
    if task == "classification":
        counts = np.bincount(data.y.astype(np.int64), minlength=len(classes or [])).tolist()
    return coldstart.decide(task, int(data.labeled.shape[0]), counts, classes)


def validation_score(validation: dict[str, Any] | None, task: str) -> float | None:
    """Accuracy (classification) or R^2 (regression) of a checkpoint's validation metrics, if any."""
    metrics = (validation or {}).get("metrics") or {}
    value = metrics.get("accuracy" if task == "classification" else "r2")
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _label(data: PoolArrays, row: int | None, pos: dict[int, int]) -> Any:
    if row is None or row not in pos:
        return None
    y = data.y[pos[row]]
    return y.tolist() if isinstance(y, np.ndarray) else (y.item() if hasattr(y, "item") else y)


def build_history(s: Session, batch_id: str, pool_id: str, data: PoolArrays) -> list[dict[str, Any]]:
    """The rounds of ``auto`` on this pool before ``batch_id`` (see the module), oldest first."""
    me = store.get_batch_by_id(s, batch_id)
    before = None if me is None else me.created_at
    rows: list[Batch] = list(store.list_batches(s, pool_id, status="succeeded", limit=MAX_ROUNDS, before=before))
    row_of = {ext: i for i, ext in enumerate(data.external_ids)}
    pos = {int(r): i for i, r in enumerate(data.labeled.tolist())}
    history: list[dict[str, Any]] = []
    for b in reversed(rows):
        diag = b.diagnostics or {}
        rnd = (diag.get("auto") or {}).get("round")
        ids = b.item_ids or []
        if b.strategy != "auto" or not isinstance(rnd, dict) or len(ids) != len(rnd.get("picks") or []):
            continue
        labels = [_label(data, row_of.get(ext), pos) for ext in ids]
        history.append({**rnd, "labels": labels})
    return history


def _index(a: Any, keep: np.ndarray) -> Any:
    if a is None:
        return None
    if isinstance(a, torch.Tensor):
        return a[torch.as_tensor(keep, device=a.device)]
    return a[keep]


def _note_auto(out: Any, *, excluded: bool, n_excluded: int, n_flagged: int) -> None:
    """``diagnostics.auto.outliers`` of an ``auto`` batch: what the worker's check did (the library's was off)."""
    auto = out.diagnostics.get("auto")
    if isinstance(auto, dict):
        auto["outliers"] = {
            "checked": True,
            "on": "the pool's embeddings (the batch's check: diagnostics.outliers)",
            "excluded": excluded,
            "n_excluded": n_excluded,
            "n_flagged": n_flagged,
        }


def select_checked(
    run: Callable[..., Any],
    *,
    features: Any,
    probs: Any,
    raw: np.ndarray | None,
    labeled: np.ndarray,
    reserved: np.ndarray,
    external_ids: Sequence[str],
    exclude: bool,
    seed: int,
    row_ids: np.ndarray | None = None,
) -> tuple[Any, dict[str, Any]]:
    """Run ``run(embeddings=, probs=, labeled=, reserved=, row_ids=)`` (a bound ``selection.select``) with the
    outlier check; returns the result (indices into the full pool) and ``diagnostics.outliers``.

    ``raw``: the pool's own embeddings (``None`` when the strategy loaded none: nothing is checked).
    ``row_ids``: the rows' item ids (BAIT's pre-filter draws its random stratum by them), or ``None``.
    """
    if raw is None:
        out = run(embeddings=features, probs=probs, labeled=labeled, reserved=reserved, row_ids=row_ids)
        return out, dict(NOT_CHECKED)
    n = raw.shape[0]
    if not exclude:
        out = run(embeddings=features, probs=probs, labeled=labeled, reserved=reserved, row_ids=row_ids)
        rep = robust_outliers(raw, out.indices, seed=seed)
        items = [
            {"item_id": external_ids[int(r)], "distance": float(d)}
            for r, d, f in zip(rep.rows, rep.distances, rep.flagged, strict=True)
            if f
        ]
        _note_auto(out, excluded=False, n_excluded=0, n_flagged=len(items))
        return out, {**rep.as_dict(), "checked": True, "excluded": False, "items": items}
    rep = robust_outliers(raw, seed=seed)
    design = np.zeros(n, dtype=bool)
    design[labeled] = True
    design[reserved] = True
    drop = rep.flagged & ~design  # labeled and reserved rows stay in the pool the strategy sees
    keep = np.flatnonzero(~drop)
    out = run(
        embeddings=_index(features, keep),
        probs=_index(probs, keep),
        labeled=np.searchsorted(keep, labeled),
        reserved=np.searchsorted(keep, reserved),
        row_ids=None if row_ids is None else row_ids[keep],
    )
    out.indices = keep[out.indices]
    auto = out.diagnostics.get("auto")
    if isinstance(auto, dict) and isinstance(auto.get("round"), dict):
        auto["round"]["picks"] = out.indices.tolist()
    _note_auto(out, excluded=True, n_excluded=int(drop.sum()), n_flagged=int(rep.flagged.sum()))
    summary = rep.as_dict()
    summary.update(n_checked=n, n_flagged=int(rep.flagged.sum()))
    return out, {
        **summary,
        "checked": True,
        "excluded": True,
        "n_excluded": int(drop.sum()),
        "excluded_items": [external_ids[int(r)] for r in np.flatnonzero(drop)[:100]],
        "items": [],
    }

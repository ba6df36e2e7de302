"""What the dashboard pages show, read through the same domain functions as the API (tenant checks
included: another tenant's pool or batch is NotFound)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session

from service.domain import batches as batches_domain
from service.domain import integrations as integrations_domain
from service.domain import pools as pools_domain
from service.domain import strategies
from service.domain import webhooks as webhooks_domain
from service.domain.platforms import platform_for
from service.store import quality as store

SNIPPET_CHARS = 280
MAX_THUMBNAIL_CHARS = 400_000  # inline data: URIs larger than this are not embedded in the page
_IMAGE_KEYS = ("image", "image_url", "thumbnail", "img")
_TEXT_KEYS = ("text", "caption", "title", "content")


def pools_overview(session: Session, tenant_id: str) -> list[dict[str, Any]]:
    views = pools_domain.list_pools(session, tenant_id)
    activity = store.last_activity(session, [v.pool.id for v in views])
    out = []
    for v in views:
        c = v.counts
        total = max(int(c.get("items", 0)), 1)
        errors = int(c.get("embedding_error", 0))
        out.append(
            {
                "pool": v.pool,
                "counts": c,
                "embedding_errors": errors,
                "share": {k: round(100.0 * int(c.get(k, 0)) / total, 2) for k in ("labeled", "reserved", "unlabeled")}
                | {"errors": round(100.0 * errors / total, 2)},
                "last_activity": activity.get(v.pool.id, v.pool.updated_at),
            }
        )
    return out


def pool_page(
    session: Session, tenant_id: str, pool_id: str, batch_limit: int = 25, *, admin: bool = True
) -> dict[str, Any]:
    """Everything the pool page shows. Integrations and webhook deliveries (their targets and answers) are
    for ``admin`` keys only, as in the API; for other keys they are ``None``."""
    view = pools_domain.view_pool(session, tenant_id, pool_id)
    pool = view.pool
    dist = dict(store.label_distribution(session, pool.id))
    labels = [{"label": c, "count": int(dist.get(c, 0))} for c in pool.classes] if pool.classes else []
    batches = batches_domain.list_batches(session, tenant_id, pool.id, status=None, limit=batch_limit, before=None)
    integrations = [platform_for(i.kind).health(session, i) for i in integrations_domain.list_integrations(
        session, tenant_id, pool.id
    )] if admin else None  # fmt: skip
    deliveries: list[dict[str, Any]] = []
    for endpoint in webhooks_domain.list_endpoints(session, tenant_id, pool.id) if admin else ():
        for d in webhooks_domain.list_deliveries(session, tenant_id, pool.id, endpoint.id, limit=20):
            last = (d.log or [{}])[-1] if d.log else {}
            deliveries.append(
                {
                    "url": endpoint.url,
                    "event": d.event,
                    "status": d.status,
                    "attempts": d.attempts,
                    "created_at": d.created_at,
                    "last_status_code": last.get("status_code"),
                    "last_error": last.get("error"),
                }
            )
    deliveries.sort(key=lambda d: d["created_at"], reverse=True)
    return {
        "pool": pool,
        "counts": view.counts,
        "labels": labels,
        "batches": [batches_domain.batch_view(b) for b in batches],
        "integrations": integrations,
        "deliveries": deliveries[:20] if admin else None,
        "strategies": strategies.names_for(pool.task),
    }


def batches_table(session: Session, tenant_id: str, pool_id: str, batch_limit: int = 25) -> dict[str, Any]:
    """Just the batches table (polled by the pool page every 2 s: no item counts, which scan the pool)."""
    pool = pools_domain.get_pool(session, tenant_id, pool_id)
    batches = batches_domain.list_batches(session, tenant_id, pool.id, status=None, limit=batch_limit, before=None)
    return {"pool": pool, "batches": [batches_domain.batch_view(b) for b in batches]}


def _content(item: dict[str, Any]) -> dict[str, Any]:
    """Text snippet and image thumbnail of an item: from its ``data`` (when the schema has it), else its
    inline text; images only as inline ``data:image/...`` URIs (a page never loads anything from
    elsewhere); other references are shown as text."""
    data = item.get("data")
    text = item.get("text")
    image = None
    if isinstance(data, dict):
        for k in _TEXT_KEYS:
            if isinstance(data.get(k), str) and text is None:
                text = data[k]
        for k in _IMAGE_KEYS:
            v = data.get(k)
            if isinstance(v, str) and v.startswith("data:image/") and len(v) <= MAX_THUMBNAIL_CHARS:
                image = v
                break
    elif isinstance(data, str) and text is None:
        text = data
    snippet = None if text is None else (text[:SNIPPET_CHARS] + ("…" if len(text) > SNIPPET_CHARS else ""))
    return {"text": snippet, "image": image, "uri": item.get("uri")}


def _predictions(session: Session, pool_id: str, checkpoint_id: str | None) -> dict[str, tuple[Any, Any]]:
    """``item id -> (predicted class, confidence)`` from the checkpoint's stored map (every item of the
    batch is drawn in it)."""
    if checkpoint_id is None:
        return {}
    found = store.get_map(session, pool_id, checkpoint_id)
    if found is None:
        return {}
    pts = json.loads(found[2])["points"]
    conf = pts.get("confidence") or [None] * len(pts["id"])
    return {i: (p, c) for i, p, c in zip(pts["id"], pts["predicted"], conf, strict=True)}


def batch_page(session: Session, tenant_id: str, pool_id: str, batch_id: str) -> dict[str, Any]:
    pool = pools_domain.get_pool(session, tenant_id, pool_id)
    batch = batches_domain.get_batch(session, tenant_id, pool.id, batch_id)
    ids = list(batch.item_ids or [])
    items = store.batch_items(session, pool.id, ids, datetime.now(UTC))
    preds = _predictions(session, pool.id, batch.checkpoint_id)
    flagged = set(batches_domain.outlier_ids(batch) or [])
    rows = []
    for pos, ext in enumerate(ids, start=1):
        item = items.get(ext, {})
        predicted, confidence = preds.get(ext, (None, None))
        rows.append(
            {
                "position": pos,
                "item_id": ext,
                "status": item.get("status", "deleted"),
                "label": item.get("label"),
                "split": item.get("split"),
                "predicted": predicted,
                "confidence": confidence,
                "content": _content(item),
                "outlier": ext in flagged,
            }
        )
    return {"pool": pool, "batch": batches_domain.batch_view(batch), "rows": rows}


def export_rows(page: dict[str, Any]) -> list[dict[str, Any]]:
    """The batch's rows as flat records (CSV / JSONL export)."""
    return [
        {
            "position": r["position"],
            "item_id": r["item_id"],
            "status": r["status"],
            "label": r["label"] if not isinstance(r["label"], list) else json.dumps(r["label"]),
            "predicted": r["predicted"],
            "confidence": r["confidence"],
            "text": r["content"]["text"],
            "uri": r["content"]["uri"],
        }
        for r in page["rows"]
    ]

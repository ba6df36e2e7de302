"""Test data written straight into the database (pools, items, labels), so batch and worker tests do
not depend on the upload routes; the end-to-end tests go through HTTP instead."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy import insert, select
from sqlalchemy.orm import Session, sessionmaker

from service.db import session_scope
from service.store.models import Batch, Item, Pool, Tenant

CLASSES = ["ant", "bee", "cat"]


@dataclass
class PoolData:
    pool_id: str
    X: np.ndarray
    y: np.ndarray  # class index per row
    external_ids: list[str]


def blobs(n: int, d: int, k: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n x d`` float32 Gaussian blobs around ``k`` centres, and the blob of each row."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0.0, 3.0, size=(k, d))
    y = rng.integers(0, k, size=n)
    X = (centres[y] + rng.normal(0.0, 1.0, size=(n, d))).astype(np.float32)
    return X, y


def tenant_id(factory: sessionmaker[Session], name: str = "acme") -> str:
    """The tenant's id (created when no key made it yet)."""
    with session_scope(factory) as s:
        found = s.execute(select(Tenant.id).where(Tenant.name == name)).scalar_one_or_none()
        if found is not None:
            return str(found)
        tenant = Tenant(name=name, created_at=datetime.now(UTC))
        s.add(tenant)
        s.flush()
        return tenant.id


def make_pool(
    factory: sessionmaker[Session],
    *,
    tenant: str = "acme",
    n: int = 200,
    d: int = 8,
    task: str = "classification",
    n_labeled: int = 12,
    head: dict[str, Any] | None = None,
    seed: int = 0,
    name: str = "pool",
) -> PoolData:
    """A pool of ``n`` items (ids ``item-00000``...), the first ``n_labeled`` labeled with their blob."""
    k = len(CLASSES)
    X, y = blobs(n, d, k, seed)
    ext = [f"item-{i:05d}" for i in range(n)]
    tid = tenant_id(factory, tenant)
    now = datetime.now(UTC)
    with session_scope(factory) as s:
        pool = Pool(
            tenant_id=tid,
            name=name,
            task=task,
            classes=CLASSES if task == "classification" else None,
            n_outputs=k if task == "classification" else 1,
            embedding_dim=d,
            head=head or {"kind": "linear", "max_epochs": 50},
            created_at=now,
            updated_at=now,
        )
        s.add(pool)
        s.flush()
        rows = []
        for i in range(n):
            labeled = i < n_labeled
            label: Any = None
            if labeled:
                label = CLASSES[int(y[i])] if task == "classification" else [float(X[i, 0])]
            rows.append(
                {
                    "pool_id": pool.id,
                    "external_id": ext[i],
                    "embedding": X[i].astype("<f4").tobytes(),
                    "status": "labeled" if labeled else "unlabeled",
                    "label": label,
                    "labeled_at": now if labeled else None,
                    "created_at": now,
                    "updated_at": now,
                }
            )
        s.execute(insert(Item), rows)
        pool_id = pool.id
    return PoolData(pool_id=pool_id, X=X, y=y, external_ids=ext)


def reserve(factory: sessionmaker[Session], pool_id: str, external_ids: list[str], *, seconds: float) -> str:
    """Reserve items for a (succeeded) batch made up here, until now + ``seconds`` (negative: expired)."""
    now = datetime.now(UTC)
    with session_scope(factory) as s:
        batch = Batch(
            pool_id=pool_id, size=len(external_ids), strategy="random", params={}, status="succeeded",
            item_ids=external_ids, attempts=1, created_at=now, finished_at=now,
        )  # fmt: skip
        s.add(batch)
        s.flush()
        for item in s.execute(
            select(Item).where(Item.pool_id == pool_id, Item.external_id.in_(external_ids))
        ).scalars():
            item.status = "reserved"
            item.batch_id = batch.id
            item.reserved_until = now + timedelta(seconds=seconds)
        return batch.id


def item_states(factory: sessionmaker[Session], pool_id: str) -> dict[str, tuple[str, str | None]]:
    """``external id -> (stored status, batch id)``."""
    with session_scope(factory) as s:
        rows = s.execute(select(Item.external_id, Item.status, Item.batch_id).where(Item.pool_id == pool_id)).all()
    return {r[0]: (r[1], r[2]) for r in rows}


def label_items(factory: sessionmaker[Session], pool_id: str, external_ids: list[str], y: dict[str, int]) -> None:
    now = datetime.now(UTC)
    with session_scope(factory) as s:
        for item in s.execute(
            select(Item).where(Item.pool_id == pool_id, Item.external_id.in_(external_ids))
        ).scalars():
            item.status = "labeled"
            item.label = CLASSES[y[item.external_id]]
            item.labeled_at = now
            item.batch_id = None
            item.reserved_until = None

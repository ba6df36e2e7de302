"""Pools too large for one process (issue 26): a batch whose strategy would load the pool into one worker process
is refused before 202 when the pool's embeddings exceed ``BAIT_LOCAL_POOL_MAX_BYTES`` (400 ``pool_too_large``, the
size, the limit and what runs instead in the message, nothing written); with a Dask cluster configured the
strategies whose passes run there take the pool; a batch that would still run in the worker's process (a cold
start) fails with the same message instead of loading the pool."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from service import catalog
from service.config import Settings
from service.db import session_scope
from service.domain import batches as batches_domain
from service.errors import BadRequest
from service.main import create_app
from service.store.models import Pool
from tests.conftest import RunJobs
from tests.service.conftest import assert_error, make_pool, put_items

D = 8
N = 40  # 40 x 8 x 4 = 1,280 bytes of embeddings
LIMIT = 1000


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"local_pool_max_bytes": LIMIT})


@pytest.fixture
def cluster_settings(settings: Settings) -> Settings:
    """A scheduler configured (nothing listens there: a batch that goes to it fails fast, which these tests never
    wait for, except the cold start, which runs in the worker's process and is refused before it connects)."""
    return settings.model_copy(update={"dask_scheduler": "tcp://127.0.0.1:9", "dask_connect_timeout_seconds": 1.0})


def _pool(client: TestClient, auth: dict[str, str], labeled: int = 12) -> str:
    pool = make_pool(client, auth, embedding_dim=D, name=f"big-{np.random.default_rng().integers(1 << 40)}")
    ids = [f"i{i:03d}" for i in range(N)]
    put_items(client, auth, pool["id"], ids, np.random.default_rng(0).normal(size=(N, D)).astype(np.float32))
    labels = [{"item_id": ids[i], "label": ["cat", "dog", "bird"][i % 3]} for i in range(labeled)]
    if labels:
        assert client.put(f"/v1/pools/{pool['id']}/labels", json={"labels": labels}, headers=auth).status_code == 200
    return str(pool["id"])


def _post(client: TestClient, auth: dict[str, str], pool: str, strategy: str, **params: Any) -> Any:
    body = {"size": 3, "strategy": strategy, "params": {"seed": 1, **params}}
    return client.post(f"/v1/pools/{pool}/batches", json=body, headers=auth)


def _batches(client: TestClient, auth: dict[str, str], pool: str) -> list[Any]:
    resp = client.get(f"/v1/pools/{pool}/batches", headers=auth)
    assert resp.status_code == 200, resp.text
    return list(resp.json()["batches"])


def test_a_pool_larger_than_one_process_takes_is_refused_with_what_to_do_instead(
    client: TestClient, auth: dict[str, str]
) -> None:
    pool = _pool(client, auth)
    for strategy in ("badge", "bait", "margin", "coreset"):
        err = assert_error(
            _post(client, auth, pool, strategy),
            400,
            "pool_too_large",
            f"{N} items x {D} dimensions",
            "BAIT_LOCAL_POOL_MAX_BYTES",
            f"strategy '{strategy}' would run in one process",
            "an operator can add a Dask cluster (BAIT_DASK_SCHEDULER)",
        )
        assert "random, margin, confidence, entropy, bait" in err["message"]
    assert _batches(client, auth, pool) == []  # nothing written
    # random reads no embeddings in the worker's process (ids only): it is not refused, unless it excludes outliers
    assert_error(_post(client, auth, pool, "random", exclude_outliers=True), 400, "pool_too_large")
    assert _post(client, auth, pool, "random").status_code == 202


def test_below_the_limit_and_with_no_limit_nothing_changes(
    settings: Settings, db: sessionmaker[Session], auth: dict[str, str]
) -> None:
    for limit in (N * D * 4, 0):
        with TestClient(create_app(settings.model_copy(update={"local_pool_max_bytes": limit}))) as app:
            pool = _pool(app, auth)
            assert _post(app, auth, pool, "badge").status_code == 202, limit


def test_with_a_cluster_its_strategies_take_the_pool_and_the_others_are_refused(
    cluster_settings: Settings, db: sessionmaker[Session], auth: dict[str, str]
) -> None:
    with TestClient(create_app(cluster_settings)) as app:
        pool = _pool(app, auth)
        for strategy in catalog.CLUSTER_STRATEGIES:
            assert _post(app, auth, pool, strategy).status_code == 202, strategy
        for strategy in ("badge", "coreset", "typiclust"):
            assert_error(
                _post(app, auth, pool, strategy),
                400,
                "pool_too_large",
                "on this service's Dask cluster, run a strategy whose passes go there",
            )
        # an attacker cannot route bait around the check: with fisher_weights it runs in the worker's process
        weights = {"kind": "uniform"}
        resp = _post(app, auth, pool, "bait", fisher_weights=weights)
        assert resp.status_code == 400 and resp.json()["error"]["code"] in ("pool_too_large", "bad_request")
        assert len(_batches(app, auth, pool)) == len(catalog.CLUSTER_STRATEGIES)  # the refused ones wrote nothing


def test_a_cold_pool_s_batch_that_would_run_here_fails_with_the_message_instead_of_loading_it(
    cluster_settings: Settings, db: sessionmaker[Session], auth: dict[str, str], run_jobs: RunJobs
) -> None:
    """bait on the cluster is accepted, but an unlabeled pool is cold: the cold start runs in the worker's
    process, which refuses the pool with the api's message (the batch fails; nothing is reserved)."""
    with TestClient(create_app(cluster_settings)) as app:
        pool = _pool(app, auth, labeled=0)
        resp = _post(app, auth, pool, "bait")
        assert resp.status_code == 202, resp.text
        url = resp.headers["Location"]

        def done() -> bool:
            return app.get(url, headers=auth).json()["status"] in ("succeeded", "failed")

        run_jobs(until=done, app_client=app)
        batch = app.get(url, headers=auth).json()
        assert batch["status"] == "failed", batch
        assert "BAIT_LOCAL_POOL_MAX_BYTES" in batch["error"] and f"{N} items x {D} dimensions" in batch["error"]
        counts = app.get(f"/v1/pools/{pool}", headers=auth).json()["counts"]
        assert counts["reserved"] == 0


def test_another_tenant_gets_404_and_the_limit_is_no_request_parameter(
    client: TestClient, auth: dict[str, str], other_auth: dict[str, str]
) -> None:
    pool = _pool(client, auth)
    assert _post(client, other_auth, pool, "badge").status_code == 404
    resp = _post(client, auth, pool, "badge", local_pool_max_bytes=0)
    assert resp.status_code == 400 and resp.json()["error"]["code"] != "pool_too_large"  # an unknown parameter
    assert _batches(client, auth, pool) == []


def test_the_label_studio_auto_batch_path_is_refused_the_same_way(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], settings: Settings
) -> None:
    pool_id = _pool(client, auth)
    with session_scope(db) as s:
        pool = s.get(Pool, pool_id)
        assert pool is not None
        req = batches_domain.BatchRequest(size=3, strategy="bait", params={})
        with pytest.raises(BadRequest, match="BAIT_LOCAL_POOL_MAX_BYTES"):
            batches_domain.new_batch_row(s, pool, req, datetime.now(UTC), settings)

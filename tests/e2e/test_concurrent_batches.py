"""Concurrent batch requests on one pool, served by several RQ worker processes: each batch runs its
selection exactly once (selections on a pool take turns under a PostgreSQL advisory lock, from
reading the reserved set to committing the reservation) and the batches get disjoint items."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from service.config import Settings
from tests.conftest import PG_ADMIN_URL, REDIS_URL
from tests.e2e.procs import Proc, bait_env, wait_for
from tests.e2e.test_faults import _batch, _pool

pytestmark = [pytest.mark.slow, pytest.mark.e2e, pytest.mark.postgres, pytest.mark.redis]


@pytest.mark.skipif(
    not (PG_ADMIN_URL and REDIS_URL),
    reason="needs PostgreSQL + Redis (BAIT_TEST_DATABASE_URL, BAIT_TEST_REDIS_URL): several worker processes; "
    "the embedded runner runs one job at a time",
)
def test_concurrent_batches_on_one_pool_select_once_each_and_get_disjoint_items(
    client: TestClient, auth: dict[str, str], settings: Settings, tmp_path: Path
) -> None:
    pool_id = _pool(client, auth, n=8000, d=32, classes=[f"c{i}" for i in range(10)])
    env = bait_env(settings.database_url, REDIS_URL, settings.queue_name)
    workers = [Proc(["worker", "--name", f"conc-{i}-{uuid.uuid4().hex[:6]}"], env, tmp_path / f"w{i}.log")
               for i in range(3)]  # fmt: skip
    try:
        ids = []
        for _ in range(6):
            r = client.post(f"/v1/pools/{pool_id}/batches", json={"size": 40, "strategy": "bait"}, headers=auth)
            assert r.status_code == 202, r.text
            ids.append(r.json()["id"])

        def finished() -> bool:
            return all(_batch(client, auth, pool_id, b)["status"] in ("succeeded", "failed") for b in ids)

        wait_for(finished, 240, "the batches did not finish")
    finally:
        for w in workers:
            w.stop()
    batches = [_batch(client, auth, pool_id, b) for b in ids]
    assert all(b["status"] == "succeeded" for b in batches), [(b["status"], b["error"]) for b in batches]
    assert [b["diagnostics"]["selection_runs"] for b in batches] == [1] * 6
    chosen = [i for b in batches for i in b["item_ids"]]
    assert len(chosen) == len(set(chosen)) == 240
    # they ran concurrently on several workers (the lock serialised only their selections)
    assert len({b["attempt_history"][0]["worker"] for b in batches}) >= 2
    overlapping = sum(
        a["started_at"] < b["finished_at"] and b["started_at"] < a["finished_at"]
        for k, a in enumerate(batches)
        for b in batches[k + 1 :]
    )
    assert overlapping >= 1
    waited = [b["diagnostics"]["timings"]["lock_wait"] for b in batches]
    print(f"lock waits (s): {[round(w, 2) for w in waited]}")

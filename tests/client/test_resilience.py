"""The client against a live service under the conditions a real loop meets, for the sync and the async
client alike: the per-key rate limit, a PostgreSQL restart, an answer lost on the way back, uploads
larger than the service's limit, and an upload cut off half way. Nothing is mocked: the service runs for
real (tests/client/conftest.py), faults come from a real PostgreSQL server being crashed and from a real
proxy that drops connections (tests/client/faultproxy.py)."""

from __future__ import annotations

import io
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from bait_client import ConnectionFailed, RateLimited, UploadFailed

from service.config import Settings
from service.db import make_engine, make_sessionmaker
from service.main import create_app
from service.migrate import upgrade
from tests.client.conftest import LiveFactory, start_worker
from tests.client.faultproxy import fault_proxy, nth
from tests.client.scenarios import KINDS, aw, blobs, collect, labeling_loop, run
from tests.conftest import REDIS_URL, make_key
from tests.e2e.procs import PrivatePostgres, postgres_bin
from tests.service.live import serve_in_thread

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("kind", KINDS)
def test_a_loop_that_hits_the_rate_limit_completes(kind: str, live_service: LiveFactory) -> None:
    statuses: list[int] = []
    with live_service(rate_limit="15/second", rate_limit_expensive="2/second") as live:
        run(kind, live.url, live.key, lambda bait: labeling_loop(bait, rounds=4), statuses=statuses)
        assert 429 in statuses, "the loop never met the rate limit: the test proves nothing"

        # With retries off the same limit is an exception that says when to come back.
        async def hammer(bait: Any) -> None:
            for _ in range(20):
                await aw(bait.limits())

        with pytest.raises(RateLimited) as err:
            run(kind, live.url, live.key, hammer, retry=False)
    assert err.value.status_code == 429 and err.value.code == "rate_limited"
    assert err.value.retry_after is not None and err.value.retry_after >= 1
    assert err.value.details["limit"] == "15 per 1 second"


@pytest.mark.parametrize("kind", KINDS)
def test_a_retried_batch_request_makes_one_batch(kind: str, live: Any) -> None:
    # The first answer to POST .../batches is lost after the service created the batch.
    with fault_proxy(live.url, nth("POST", "/batches", {1}, "lose_answer")) as proxy:

        async def scenario(bait: Any) -> tuple[str, list[str]]:
            X, ids, _ = blobs(20)
            pool = await aw(bait.create_pool("idem", classes=["a", "b"], embedding_dim=X.shape[1]))
            await aw(bait.upload(pool.id, X, ids=ids, progress=False))
            batch = await aw(bait.request_batch(pool.id, size=4, strategy="random"))
            listed = await collect(bait.batches(pool.id))
            return batch.id, [b.id for b in listed]

        batch_id, listed = run(kind, proxy.url, live.key, scenario)
    posts = [s for s in proxy.seen if s.method == "POST" and s.path.endswith("/batches")]
    assert [(s.status, s.passed_on) for s in posts] == [(202, False), (200, True)]  # created, then the same one
    assert posts[0].headers["Idempotency-Key"] == posts[1].headers["Idempotency-Key"]
    assert listed == [batch_id]


@pytest.mark.parametrize("kind", KINDS)
def test_a_lost_answer_is_an_error_when_retries_are_off(kind: str, live: Any) -> None:
    with fault_proxy(live.url, nth("GET", "/v1/strategies", {1}, "lose_answer")) as proxy:

        async def scenario(bait: Any) -> None:
            await aw(bait.strategies())

        with pytest.raises(ConnectionFailed):
            run(kind, proxy.url, live.key, scenario, retry=False)
        # the default policy sends the (idempotent) GET again and gets its answer
        names = run(kind, proxy.url, live.key, lambda b: _strategy_names(b))
    assert "bait" in names and "random" in names


async def _strategy_names(bait: Any) -> list[str]:
    listed = await aw(bait.strategies())
    names: list[str] = listed.names()
    return names


SMALL_LIMIT = 64 * 1024


@pytest.mark.parametrize("kind", KINDS)
def test_an_upload_larger_than_the_limit_lands_whole(kind: str, live_service: LiveFactory, tmp_path: Path) -> None:
    n, d = 3000, 16
    X, ids, _ = blobs(n, d)
    requests: list[tuple[str, str]] = []
    with live_service(max_upload_bytes=SMALL_LIMIT, max_upload_inflated_bytes=SMALL_LIMIT) as live:
        buf = io.BytesIO()
        np.savez(buf, ids=np.asarray(ids), embeddings=X)
        assert len(buf.getvalue()) > 4 * SMALL_LIMIT
        table = _table(ids, X)
        parquet = tmp_path / "items.parquet"
        import pyarrow.parquet as pq

        pq.write_table(table, parquet)
        assert parquet.stat().st_size > SMALL_LIMIT

        async def scenario(bait: Any) -> None:
            # sent as one body, the service refuses it: the limit is real
            pool = await aw(bait.create_pool("big", classes=["a", "b"], embedding_dim=d))
            raw = httpx.post(f"{live.url}/v1/pools/{pool.id}/items:bulk", content=buf.getvalue(),
                             headers={"Authorization": f"Bearer {live.key}"})  # fmt: skip
            assert raw.status_code == 413, raw.text
            for source in (X, table, parquet):
                target = await aw(bait.create_pool(f"big-{uuid.uuid4().hex[:6]}", classes=["a", "b"], embedding_dim=d))
                out = await aw(bait.upload(target.id, source, ids=ids if source is X else None, progress=False))
                assert (out.created, out.updated) == (n, 0)
                stored = await collect(bait.items(target.id, include_embedding=True))
                assert [it.id for it in stored] == ids  # every row, in upload order
                np.testing.assert_array_equal(np.asarray([it.embedding for it in stored], dtype=np.float32), X)

        run(kind, live.url, live.key, scenario, requests=requests)
    bulk = [p for m, p in requests if p.endswith("items:bulk")]
    assert len(bulk) >= 3 * 4 + 1  # each of the three sources went in several requests


def _table(ids: list[str], X: np.ndarray) -> Any:
    import pyarrow as pa

    return pa.table({"id": ids, "embedding": pa.array(list(X), type=pa.list_(pa.float32()))})


@pytest.mark.parametrize("kind", KINDS)
def test_an_upload_cut_off_resumes_without_sending_stored_rows_again(kind: str, live_service: LiveFactory) -> None:
    n, d = 2000, 16
    X, ids, _ = blobs(n, d)
    with live_service(max_upload_bytes=SMALL_LIMIT, max_upload_inflated_bytes=SMALL_LIMIT) as live:
        pool_id = run(kind, live.url, live.key, lambda b: _new_pool(b, d))
        # the third chunk never reaches the service, and this client does not retry
        with fault_proxy(live.url, nth("POST", "items:bulk", {3}, "refuse")) as proxy:
            with pytest.raises(UploadFailed) as err:
                run(kind, proxy.url, live.key, lambda b: aw(b.upload(pool_id, X, ids=ids, progress=False)), retry=False)
            done = err.value.uploaded
            first = [s for s in proxy.seen if s.passed_on and "items:bulk" in s.path]
            assert 0 < done < n and done == sum(len(s.npz_ids()) for s in first)
            assert err.value.total == n and isinstance(err.value.cause, ConnectionFailed)
            assert run(kind, live.url, live.key, lambda b: _count(b, pool_id)) == done
            proxy.seen.clear()
            out = run(
                kind, proxy.url, live.key, lambda b: aw(b.upload(pool_id, X, ids=ids, start=done, progress=False))
            )
            resent = [i for s in proxy.seen if "items:bulk" in s.path for i in s.npz_ids()]
        assert out.created == n - done and resent == ids[done:]  # the stored rows were not sent again
        assert run(kind, live.url, live.key, lambda b: _count(b, pool_id)) == n

        # After a crash (no error object to resume from): the service says which ids it has.
        other = run(kind, live.url, live.key, lambda b: _new_pool(b, d))
        run(kind, live.url, live.key, lambda b: aw(b.upload(other, X[:700], ids=ids[:700], progress=False)))
        with fault_proxy(live.url, lambda m, p: None) as proxy:
            out = run(kind, proxy.url, live.key,
                      lambda b: aw(b.upload(other, X, ids=ids, skip_existing=True, progress=False)))  # fmt: skip
            sent = [i for s in proxy.seen if "items:bulk" in s.path for i in s.npz_ids()]
        assert out.created == n - 700 and sent == ids[700:]


async def _new_pool(bait: Any, d: int) -> str:
    pool = await aw(bait.create_pool(f"resume-{uuid.uuid4().hex[:6]}", classes=["a", "b"], embedding_dim=d))
    return str(pool.id)


async def _count(bait: Any, pool_id: str) -> int:
    return int((await aw(bait.pool(pool_id))).counts.items)


# ------------------------------------------------------------------------------------------------
# A PostgreSQL restart mid-loop, on a private cluster (the shared server is never touched)
# ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def private_pg() -> Any:
    if postgres_bin() is None:
        if os.environ.get("CI") or os.environ.get("BAIT_TEST_DATABASE_URL"):
            # CI and the PostgreSQL pass have the server binaries: their absence there is a failure
            pytest.fail("the PostgreSQL server binaries (initdb, pg_ctl) are missing for a private server")
        pytest.skip("needs the PostgreSQL server binaries (initdb, pg_ctl) for a private server")
    pg = PrivatePostgres()
    pg.start()
    try:
        upgrade(pg.url)
        yield pg
    finally:
        pg.stop()


@pytest.mark.postgres
@pytest.mark.parametrize("kind", KINDS)
def test_a_postgres_restart_mid_loop_is_ridden_out(
    kind: str, private_pg: PrivatePostgres, settings: Settings, tmp_path: Path
) -> None:
    queue = f"bait-client-pg-{uuid.uuid4().hex[:6]}"
    changed = settings.model_copy(update={"database_url": private_pg.url, "queue_name": queue})
    engine = make_engine(changed)
    key = make_key(make_sessionmaker(engine), f"pg-{kind}")
    engine.dispose()
    worker = start_worker(private_pg.url, queue, tmp_path / "worker.log", tmp_path / "cache") if REDIS_URL else None
    statuses: list[int] = []
    restarted = threading.Event()

    def crash_and_restart() -> None:
        private_pg.crash()
        time.sleep(2.0)
        private_pg.start()
        restarted.set()

    def on_round(r: int) -> None:
        if r == 2:  # mid-loop, right after a batch was labeled
            threading.Thread(target=crash_and_restart, daemon=True).start()

    try:
        with serve_in_thread(create_app(changed)) as url:
            run(kind, url, key, lambda bait: labeling_loop(bait, rounds=4, on_round=on_round), statuses=statuses)
    finally:
        if worker is not None:
            worker.stop()
    assert restarted.wait(60)
    assert 503 in statuses, "the loop never met the outage: the test proves nothing"


@pytest.mark.parametrize("kind", KINDS)
def test_an_upload_planned_above_the_real_limit_is_halved_until_it_fits(kind: str, live_service: LiveFactory) -> None:
    """A client that believes the limit is higher than it is (an operator lowered it since) meets 413s;
    it halves the refused chunk until the service takes it, and every row lands."""
    n, d = 1500, 16
    X, ids, _ = blobs(n, d)
    requests: list[tuple[str, str]] = []
    statuses: list[int] = []

    async def scenario(bait: Any) -> Any:
        bait._ops._limits = (await aw(bait.limits())).model_copy(
            update={"max_upload_bytes": 2**30, "max_upload_inflated_bytes": 2**30}
        )
        pool = await aw(bait.create_pool(f"halve-{uuid.uuid4().hex[:6]}", classes=["a", "b"], embedding_dim=d))
        out = await aw(bait.upload(pool.id, X, ids=ids, progress=False))
        stored = await collect(bait.items(pool.id))
        return out, [it.id for it in stored]

    with live_service(max_upload_bytes=SMALL_LIMIT, max_upload_inflated_bytes=SMALL_LIMIT) as live:
        out, stored = run(kind, live.url, live.key, scenario, requests=requests, statuses=statuses)
    assert out.created == n and stored == ids
    assert 413 in statuses and sum(p.endswith("items:bulk") for _, p in requests) > 2

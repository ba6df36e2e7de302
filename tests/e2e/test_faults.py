"""Fault injection against real processes: a worker killed mid-select, the API killed mid-upload, and
Redis and PostgreSQL restarted under label writes and batches. Afterwards every acknowledged label is
there, no batch is stuck, and nobody had to step in.

Redis and PostgreSQL here are private servers the tests start themselves (``redis-server`` on a free
port without persistence; a PostgreSQL cluster made by ``initdb`` in a temp folder, run as the
``postgres`` user when the tests run as root), so killing them disturbs nothing else. The tests of the
production stack (PostgreSQL + Redis + RQ worker processes) run in the PostgreSQL + Redis pass; the
embedded mode's counterpart of the worker kill is tests/worker/test_worker_death.py.
"""

from __future__ import annotations

import io
import random
import shutil
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.store.models import Item
from tests.conftest import PG_ADMIN_URL, REDIS_URL
from tests.e2e.procs import PrivatePostgres, PrivateRedis, Proc, bait, bait_env, postgres_bin, serve, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.e2e]

STACK = bool(PG_ADMIN_URL and REDIS_URL)
needs_stack = pytest.mark.skipif(
    not STACK,
    reason="the production stack under faults: PostgreSQL + Redis + RQ worker processes (set BAIT_TEST_DATABASE_URL "
    "and BAIT_TEST_REDIS_URL); in embedded mode there is no worker to lose nor Redis to restart",
)
CLASSES = ["ant", "bee", "cat"]
# Fast recovery for the restart tests (the worker-kill test runs with the defaults).
# Rate limits stay on (the limiter still counts in Redis through the outages) but far above what these tests
# send: three label writers in a tight loop plus polling passed the default 600/minute per key on a fast CPU.
QUICK = {
    "job_heartbeat_seconds": 0.5,
    "job_stale_seconds": 3,
    "sweep_interval_seconds": 1,
    "rate_limit": "100000/minute",
    "rate_limit_expensive": "100000/minute",
}


def _pool(client: TestClient | httpx.Client, auth: dict[str, str], n: int, d: int, classes: list[str]) -> str:
    r = client.post(
        "/v1/pools",
        json={"name": f"faults-{uuid.uuid4().hex[:6]}", "task": "classification", "classes": classes,
              "embedding_dim": d, "head": {"kind": "linear", "max_epochs": 30}},
        headers=auth,
    )  # fmt: skip
    assert r.status_code == 201, r.text
    pool_id: str = r.json()["id"]
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, d)).astype(np.float32)
    r = client.post(f"/v1/pools/{pool_id}/items:bulk", content=_npz([f"it-{i:06d}" for i in range(n)], X), headers=auth)
    assert r.status_code == 200 and r.json()["created"] == n, r.text
    seed = [{"item_id": f"it-{i:06d}", "label": classes[i % len(classes)]} for i in range(0, n, max(1, n // 200))]
    r = client.put(f"/v1/pools/{pool_id}/labels", json={"labels": seed}, headers=auth)
    assert r.status_code == 200, r.text
    return pool_id


def _npz(ids: list[str], X: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, ids=np.asarray(ids), embeddings=X)
    return buf.getvalue()


def _batch(client: TestClient | httpx.Client, auth: dict[str, str], pool_id: str, batch_id: str) -> dict[str, Any]:
    r = client.get(f"/v1/pools/{pool_id}/batches/{batch_id}", headers=auth)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


# ------------------------------------------------------------------------------------------------
# A worker killed mid-select
# ------------------------------------------------------------------------------------------------


@needs_stack
@pytest.mark.postgres
@pytest.mark.redis
def test_worker_killed_mid_select_is_finished_by_another_worker_within_30_s(
    client: TestClient, auth: dict[str, str], settings: Settings, tmp_path: Path
) -> None:
    # Selection of 100 from 20,000 items with 10 classes takes seconds: long enough to be killed in.
    classes = [f"c{i}" for i in range(10)]
    pool_id = _pool(client, auth, n=20_000, d=64, classes=classes)
    env = bait_env(settings.database_url, REDIS_URL, settings.queue_name)  # default heartbeat, stale, sweep
    workers = [Proc(["worker", "--name", f"fault-{i}-{uuid.uuid4().hex[:6]}"], env, tmp_path / f"w{i}.log")
               for i in range(2)]  # fmt: skip
    try:
        r = client.post(f"/v1/pools/{pool_id}/batches", json={"size": 100, "strategy": "bait"}, headers=auth)
        assert r.status_code == 202, r.text
        batch_id = r.json()["id"]

        def selecting() -> dict[str, Any] | None:
            b = _batch(client, auth, pool_id, batch_id)
            return b if b["status"] == "running" and b["progress"]["stage"] == "select" else None

        running = wait_for(selecting, 180, "the batch never got to its selection")
        victim_name = running["attempt_history"][0]["worker"]
        victim = next(w for w in workers if victim_name.endswith(f":{w.p.pid}"))
        victim.kill9()
        killed_at = time.monotonic()

        def taken_over() -> bool:
            return _batch(client, auth, pool_id, batch_id)["attempts"] == 2

        wait_for(taken_over, 60, "the batch of the killed worker was never re-queued")
        requeued_after = time.monotonic() - killed_at
        survivor = next(w for w in workers if w is not victim)
        wait_for(
            lambda: _batch(client, auth, pool_id, batch_id)["status"] == "succeeded", 120, "never finished", survivor
        )
    finally:
        for w in workers:
            w.stop()
    # re-queued within stale + sweep (15 s + 5 s) and some slack for a busy machine
    print(f"re-queued {requeued_after:.1f} s after the kill")
    assert requeued_after <= 30, f"re-queued {requeued_after:.1f} s after the kill"
    batch = _batch(client, auth, pool_id, batch_id)
    first, second = batch["attempt_history"]
    assert first["outcome"] == "worker_lost" and first["worker"] == victim_name
    assert first["reason"].startswith("no heartbeat for ")
    assert second["outcome"] == "succeeded" and second["worker"].endswith(f":{survivor.p.pid}")
    assert batch["diagnostics"]["selection_runs"] == 1
    assert len(set(batch["item_ids"])) == 100
    r = client.get(f"/v1/pools/{pool_id}", headers=auth)
    assert r.json()["counts"]["reserved"] == 100  # the dead attempt reserved nothing


# ------------------------------------------------------------------------------------------------
# The API killed mid-upload
# ------------------------------------------------------------------------------------------------


def _count_items(db: sessionmaker[Session], pool_id: str) -> int:
    with db() as s:
        return int(s.execute(select(func.count()).select_from(Item).where(Item.pool_id == pool_id)).scalar_one())


def test_api_killed_mid_upload_writes_nothing_and_the_upload_can_be_sent_again(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], settings: Settings, tmp_path: Path
) -> None:
    r = client.post(
        "/v1/pools",
        json={"name": "upload", "task": "classification", "classes": CLASSES, "embedding_dim": 16},
        headers=auth,
    )
    pool_id = r.json()["id"]
    n = 200_000
    body = _npz([f"u-{i:06d}" for i in range(n)], np.random.default_rng(1).standard_normal((n, 16)).astype("<f4"))
    path = f"/v1/pools/{pool_id}/items:bulk"
    env = bait_env(settings.database_url, REDIS_URL, settings.queue_name)

    # 1. killed while the body streams in
    api, base = serve(env, tmp_path / "api1.log")
    port = int(base.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: {auth['Authorization']}\r\n"
            f"Content-Type: application/octet-stream\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        sock.sendall(head.encode() + body[: len(body) // 2])
        time.sleep(0.5)
        api.kill9()
    assert _count_items(db, pool_id) == 0

    # 2. killed while it writes the rows (the body has arrived; the transaction is open)
    api, base = serve(env, tmp_path / "api2.log")
    answered: list[Any] = []

    def upload() -> None:
        try:
            answered.append(httpx.post(base + path, content=body, headers=auth, timeout=120))
        except httpx.HTTPError as exc:  # the connection dies with the process
            answered.append(exc)

    sender = threading.Thread(target=upload)
    sender.start()
    wait_for(_writing(settings), 120, "the upload never got to writing rows", api)
    api.kill9()
    sender.join(30)
    assert answered and isinstance(answered[0], httpx.HTTPError), answered  # no answer: never acknowledged
    assert _count_items(db, pool_id) == 0  # all or nothing: nothing

    # 3. sent again to a running API, the upload is whole
    r = client.post(path, content=body, headers=auth)
    assert r.status_code == 200 and r.json()["created"] == n, r.text
    assert _count_items(db, pool_id) == n


def _writing(settings: Settings) -> Any:
    """A condition that holds once another process is writing item rows in an open transaction."""
    if settings.database_url.startswith("postgresql"):
        engine = create_engine(settings.database_url)
        sql = text(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state = 'active' "
            "AND pid <> pg_backend_pid() AND (query ILIKE 'COPY%' OR query ILIKE 'INSERT INTO items%')"
        )

        def pg() -> bool:
            with engine.connect() as c:
                return bool(c.execute(sql).scalar_one())

        return pg
    wal = Path(str(settings.sqlite_path()) + "-wal")
    start = wal.stat().st_size if wal.exists() else 0

    def sqlite() -> bool:  # the writer's pages go to the WAL before its commit
        return wal.exists() and wal.stat().st_size > start + 2**20

    return sqlite


# ------------------------------------------------------------------------------------------------
# Redis and PostgreSQL restarted under label writes and batches
# ------------------------------------------------------------------------------------------------


class LabelWriters:
    """Threads that PUT labels over HTTP until stopped; they record every acknowledged write."""

    def __init__(
        self, base: str, auth: dict[str, str], pool_id: str, ids: list[str], classes: list[str], n_threads: int = 3
    ) -> None:
        self.base, self.auth, self.pool_id, self.ids, self.classes = base, auth, pool_id, ids, classes
        self.acknowledged: list[tuple[str, dict[str, str]]] = []  # (annotator tag, item -> label)
        self.refused = 0
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._run, args=(t,)) for t in range(n_threads)]

    def __enter__(self) -> LabelWriters:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)

    def _run(self, t: int) -> None:
        rng = random.Random(t)
        with httpx.Client(base_url=self.base, timeout=30) as http:
            k = 0
            while not self._stop.is_set():
                tag = f"w{t}-{k}"
                k += 1
                values = {i: rng.choice(self.classes) for i in rng.sample(self.ids, 50)}
                body = {"labels": [{"item_id": i, "label": v} for i, v in values.items()], "annotator": tag}
                try:
                    r = http.put(f"/v1/pools/{self.pool_id}/labels", json=body, headers=self.auth)
                except httpx.HTTPError:
                    r = None
                if r is not None and r.status_code == 200:
                    self.acknowledged.append((tag, values))
                else:
                    self.refused += 1
                    time.sleep(0.1)

    def check(self, db_url: str) -> None:
        """Every acknowledged write is in the history of every item it labeled."""
        assert self.acknowledged, "no label write was acknowledged"
        engine = create_engine(db_url)
        with engine.connect() as c:
            rows = c.execute(
                text(
                    "SELECT i.external_id, l.annotator, l.value FROM labels l JOIN items i ON i.id = l.item_id "
                    "WHERE l.pool_id = :p"
                ),
                {"p": self.pool_id},
            ).all()
        engine.dispose()
        stored = {(str(r[0]), str(r[1])) for r in rows}
        missing = [(tag, i) for tag, values in self.acknowledged for i in values if (i, tag) not in stored]
        assert not missing, f"{len(missing)} acknowledged labels lost, e.g. {missing[:3]}"


def _wait_batches_done(http: httpx.Client, auth: dict[str, str], pool_id: str, ids: list[str], timeout: float) -> None:
    def done() -> bool:
        return all(_batch(http, auth, pool_id, b)["status"] in ("succeeded", "failed", "cancelled") for b in ids)

    wait_for(done, timeout, lambda: f"batches stuck: {[_batch(http, auth, pool_id, b) for b in ids]}")


def _post_batches(http: httpx.Client, auth: dict[str, str], pool_id: str, n: int) -> list[str]:
    out = []
    for _ in range(n):
        r = http.post(f"/v1/pools/{pool_id}/batches", json={"size": 10, "strategy": "bait"}, headers=auth)
        assert r.status_code == 202, r.text
        out.append(r.json()["id"])
    return out


def _assert_batches_succeeded(http: httpx.Client, auth: dict[str, str], pool_id: str, ids: list[str]) -> None:
    batches = [_batch(http, auth, pool_id, b) for b in ids]
    assert all(b["status"] == "succeeded" for b in batches), [(b["status"], b["error"]) for b in batches]
    chosen = [i for b in batches for i in b["item_ids"]]
    assert len(chosen) == len(set(chosen)) == 10 * len(ids)


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    if shutil.which("redis-server") is None:
        pytest.skip("needs redis-server on PATH (a private Redis the test can kill)")
    redis = PrivateRedis(tmp_path)
    redis.start()
    yield redis
    redis.stop()


SLOW_POOL = {"n": 10_000, "d": 32, "classes": [f"c{i}" for i in range(10)]}  # a batch runs for seconds


def _outage_under_load(
    http: httpx.Client, auth: dict[str, str], base: str, outage: Any, restore: Any, *, post_during: bool
) -> tuple[str, list[str], LabelWriters]:
    """Label writers and batches run; once a batch is mid-job, ``outage()``, 2 s (with ``post_during``,
    a batch is requested meanwhile), ``restore()``; then more of both. Returns the pool, the batch ids
    and the writers (stopped)."""
    pool_id = _pool(http, auth, **SLOW_POOL)
    ids = [f"it-{i:06d}" for i in range(600)]  # rewritten again and again; the rest is for batches
    with LabelWriters(base, auth, pool_id, ids, SLOW_POOL["classes"]) as writers:
        batches = _post_batches(http, auth, pool_id, 2)

        def mid_job() -> bool:
            return any(_batch(http, auth, pool_id, b)["progress"]["stage"] in ("train", "embed", "select")
                       for b in batches)  # fmt: skip

        wait_for(mid_job, 120, "no batch got going")
        outage()
        if post_during:
            batches += _post_batches(http, auth, pool_id, 1)
        time.sleep(2.0)
        restore()
        wait_for(lambda: _answers(http, auth, pool_id), 60, "the API never recovered")
        batches += _post_batches(http, auth, pool_id, 2)
        time.sleep(2.0)
    return pool_id, batches, writers


@needs_stack
@pytest.mark.postgres
@pytest.mark.redis
def test_redis_restart_during_label_writes_and_batches_loses_nothing(
    client: TestClient, auth: dict[str, str], settings: Settings, private_redis: PrivateRedis, tmp_path: Path
) -> None:
    env = bait_env(settings.database_url, private_redis.url, settings.queue_name, **QUICK)
    api, base = serve(env, tmp_path / "api.log")
    worker = Proc(["worker"], env, tmp_path / "worker.log")
    try:
        with httpx.Client(base_url=base, timeout=30) as http:
            # Redis dies with every queued job (no persistence); a batch requested meanwhile is committed
            # but cannot be submitted: the sweep submits it once Redis is back.
            pool_id, batches, writers = _outage_under_load(
                http, auth, base, private_redis.kill9, private_redis.start, post_during=True
            )
            writers.check(settings.database_url)  # label writes never touch Redis
            _wait_batches_done(http, auth, pool_id, batches, 120)
            _assert_batches_succeeded(http, auth, pool_id, batches)
            assert "could not submit job" in api.output()  # the outage was real
            assert worker.alive(), worker.output()[-3000:]
    finally:
        worker.stop()
        api.stop()


@pytest.mark.postgres
@pytest.mark.redis
@needs_stack
def test_postgres_restart_during_label_writes_and_batches_loses_nothing(
    settings: Settings, private_redis: PrivateRedis, tmp_path: Path
) -> None:
    if postgres_bin() is None:
        pytest.skip("needs the PostgreSQL server binaries (initdb, pg_ctl) for a private server")
    pg = PrivatePostgres()
    pg.start()
    try:
        env = bait_env(pg.url, private_redis.url, settings.queue_name, **QUICK)
        bait("migrate", env=env)
        key = bait("keys", "create", "--tenant", "faults", env=env).split()[-1]
        auth = {"Authorization": f"Bearer {key}"}
        api, base = serve(env, tmp_path / "api.log")
        worker = Proc(["worker"], env, tmp_path / "worker.log")
        try:
            with httpx.Client(base_url=base, timeout=30) as http:
                pool_id, batches, writers = _outage_under_load(http, auth, base, pg.crash, pg.start, post_during=False)
                assert writers.refused > 0  # the outage was real: some writes were refused meanwhile
                writers.check(pg.url)
                _wait_batches_done(http, auth, pool_id, batches, 120)
                _assert_batches_succeeded(http, auth, pool_id, batches)
                # the batch that was mid-job lost its attempt and was re-queued by itself
                histories = [_batch(http, auth, pool_id, b)["attempt_history"] for b in batches]
                assert any(a["outcome"] == "worker_lost" for h in histories for a in h), histories
                assert worker.alive() and api.alive()
        finally:
            worker.stop()
            api.stop()
    finally:
        pg.stop()


def _answers(http: httpx.Client, auth: dict[str, str], pool_id: str) -> bool:
    try:
        return http.get(f"/v1/pools/{pool_id}", headers=auth).status_code == 200
    except httpx.HTTPError:
        return False


def _sleeping_job_then_redis_dies(settings: Settings, private_redis: PrivateRedis, tmp_path: Path) -> Proc:
    """A `bait worker` whose Redis is killed while it runs a job: rq's bookkeeping at the job's end then fails
    and rq's work loop quits. Returns the worker (Redis left down) once its log says it is waiting for Redis."""
    from redis import Redis
    from rq import Queue
    from rq.serializers import JSONSerializer

    env = bait_env(settings.database_url, private_redis.url, settings.queue_name, **QUICK)
    worker = Proc(["worker"], env, tmp_path / "worker.log")
    conn = Redis.from_url(private_redis.url)
    q = Queue(settings.queue_name, connection=conn, serializer=JSONSerializer)
    job = q.enqueue("time.sleep", 3.0, job_id=f"sleep-{uuid.uuid4().hex[:6]}")
    started = lambda: job.get_status(refresh=True) == "started"  # noqa: E731
    wait_for(started, 60, f"the job never started:\n{worker.output()}", worker)
    conn.close()
    private_redis.kill9()
    wait_for(lambda: "rq worker stopped" in worker.output() or not worker.alive(), 60, worker.output()[-3000:])
    return worker


@needs_stack
@pytest.mark.postgres
@pytest.mark.redis
def test_worker_rides_out_redis_dying_at_the_end_of_a_job(
    settings: Settings, private_redis: PrivateRedis, tmp_path: Path
) -> None:
    from redis import Redis
    from rq import Queue
    from rq.serializers import JSONSerializer

    worker = _sleeping_job_then_redis_dies(settings, private_redis, tmp_path)
    try:
        assert worker.alive(), f"the worker exited with Redis:\n{worker.output()[-3000:]}"
        time.sleep(2.0)
        assert worker.alive(), worker.output()[-3000:]  # still waiting, not spinning out
        private_redis.start()
        wait_for(lambda: "starting a new rq worker" in worker.output(), 60, worker.output()[-3000:], worker)
        conn = Redis.from_url(private_redis.url)
        job = Queue(settings.queue_name, connection=conn, serializer=JSONSerializer).enqueue("math.sqrt", 16.0)
        wait_for(lambda: job.get_status(refresh=True) == "finished", 60, worker.output()[-3000:], worker)
        assert job.return_value() == 4.0  # the new rq worker runs jobs
        conn.close()
    finally:
        worker.stop()
    assert worker.p.returncode == 0, worker.output()[-3000:]  # SIGTERM still ends it cleanly


@needs_stack
@pytest.mark.postgres
@pytest.mark.redis
def test_worker_waiting_for_redis_stops_on_sigterm(
    settings: Settings, private_redis: PrivateRedis, tmp_path: Path
) -> None:
    worker = _sleeping_job_then_redis_dies(settings, private_redis, tmp_path)
    assert worker.alive(), worker.output()[-3000:]
    t0 = time.monotonic()
    worker.stop()
    assert time.monotonic() - t0 < 15 and worker.p.returncode == 0, worker.output()[-3000:]
    assert "stop requested while waiting for Redis" in worker.output()

"""Shared fixtures. The backend is chosen by the environment, so the same suite runs twice:

- embedded defaults (nothing set): a SQLite file migrated by Alembic, the in-process job runner;
- production parts: ``BAIT_TEST_DATABASE_URL=postgresql+psycopg://postgres@127.0.0.1:5432/test`` (a fresh
  database named ``bait_test_<pid>`` is created next to it and migrated by Alembic) and
  ``BAIT_TEST_REDIS_URL=redis://127.0.0.1:6379/0`` (jobs go to RQ on a queue private to this run).

Every test starts from empty tables (deleted after each test), because the app, the worker threads and
worker processes commit on their own connections: a rolled-back outer transaction cannot see those.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.db import make_engine, make_sessionmaker, session_scope
from service.domain.keys import create_key
from service.main import create_app
from service.migrate import upgrade
from service.store.models import Base

PG_ADMIN_URL = os.environ.get("BAIT_TEST_DATABASE_URL")
REDIS_URL = os.environ.get("BAIT_TEST_REDIS_URL")
REPO = Path(__file__).resolve().parents[1]
# Data sets shared between projects: ../shared/data beside the repository, or where BAIT_SHARED_DATA says.
SHARED_DATA = Path(os.environ.get("BAIT_SHARED_DATA") or REPO.parent / "shared" / "data").resolve()


def shared_data(name: str) -> Path:
    """A file of the shared data folder; the test is skipped, saying where it looked, when it is absent
    (a fresh clone has no ../shared: set BAIT_SHARED_DATA to where the data is)."""
    path = SHARED_DATA / name
    if not path.is_file():
        pytest.skip(f"shared data {name} not found in {SHARED_DATA} (set BAIT_SHARED_DATA to its folder)")
    return path


def pytest_report_header(config: pytest.Config) -> str:
    db = "postgresql (BAIT_TEST_DATABASE_URL)" if PG_ADMIN_URL else "sqlite file"
    queue = "redis + rq (BAIT_TEST_REDIS_URL)" if REDIS_URL else "in-process runner"
    return f"bait-service backends: database={db}, queue={queue}"


def _is_loopback(host: str) -> bool:
    try:
        addr = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """No test sends a packet outside 127.0.0.0/8 or ::1, even when the code under test is broken: every
    Python-level connect to another address is refused and recorded (the list, for tests that assert on it)."""
    attempts: list[Any] = []

    def guarded(method: Callable[..., Any]) -> Callable[..., Any]:
        def connect(sock: socket.socket, address: Any) -> Any:
            if sock.family in (socket.AF_INET, socket.AF_INET6) and not _is_loopback(str(address[0])):
                attempts.append(address)
                raise OSError(f"test stub: connect to {address!r} blocked (tests stay on loopback)")
            return method(sock, address)

        return connect

    monkeypatch.setattr(socket.socket, "connect", guarded(socket.socket.connect))
    monkeypatch.setattr(socket.socket, "connect_ex", guarded(socket.socket.connect_ex))
    return attempts


@contextmanager
def scratch_postgres_database(prefix: str) -> Iterator[str]:
    """A new, empty PostgreSQL database next to BAIT_TEST_DATABASE_URL (dropped afterwards): its URL."""
    assert PG_ADMIN_URL
    admin = make_url(PG_ADMIN_URL)
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    admin_engine = create_engine(admin, isolation_level="AUTOCOMMIT")
    with admin_engine.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield admin.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin_engine.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin_engine.dispose()


@pytest.fixture(scope="session")
def database_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A new, Alembic-migrated database for this test session."""
    if PG_ADMIN_URL:
        admin = make_url(PG_ADMIN_URL)
        name = f"bait_test_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        admin_engine = create_engine(admin, isolation_level="AUTOCOMMIT")
        with admin_engine.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        url = admin.set(database=name).render_as_string(hide_password=False)
        upgrade(url)
        yield url
        with admin_engine.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin_engine.dispose()
    else:
        path = tmp_path_factory.mktemp("db") / "bait.db"
        url = f"sqlite:///{path}"
        upgrade(url)
        yield url


@pytest.fixture(scope="session")
def queue_name() -> str:
    return f"bait-test-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="session")
def worker_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The workers' pool cache of this test session (pools have unique ids, so tests can share it)."""
    return tmp_path_factory.mktemp("worker-cache")


@pytest.fixture
def settings(database_url: str, queue_name: str, worker_cache_dir: Path) -> Settings:
    return Settings(
        database_url=database_url,
        worker_cache_dir=worker_cache_dir,
        redis_url=REDIS_URL,
        queue_name=queue_name,
        print_bootstrap_key=False,
        device="cpu",
        secret_key="test-secret-key-0123456789",  # required with PostgreSQL (encrypts tokens and secrets)
        # Tests drive one key hard (polling, fuzzing); tests/service/test_rate_limits.py sets its own rates.
        rate_limit="off",
        rate_limit_expensive="off",
    )


@pytest.fixture(scope="session")
def engine(database_url: str) -> Iterator[Engine]:
    eng = make_engine(Settings(database_url=database_url))
    yield eng
    eng.dispose()


@pytest.fixture
def db(engine: Engine) -> Iterator[sessionmaker[Session]]:
    """A session factory on the test database; every table is emptied after the test."""
    yield make_sessionmaker(engine)
    _empty_tables(engine)


def _empty_tables(engine: Engine) -> None:
    tables = [t.name for t in Base.metadata.sorted_tables]
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.execute(text("TRUNCATE " + ", ".join(f'"{t}"' for t in tables) + " RESTART IDENTITY CASCADE"))
        else:
            for t in reversed(tables):
                conn.execute(text(f'DELETE FROM "{t}"'))


def make_key(factory: sessionmaker[Session], tenant: str) -> str:
    with session_scope(factory) as s:
        key, _ = create_key(s, tenant)
    return key


@pytest.fixture
def api_key(db: sessionmaker[Session]) -> str:
    """A key of tenant 'acme'."""
    return make_key(db, "acme")


@pytest.fixture
def other_key(db: sessionmaker[Session]) -> str:
    """A key of another tenant, 'globex'."""
    return make_key(db, "globex")


@pytest.fixture
def auth(api_key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"}


@pytest.fixture
def other_auth(other_key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {other_key}"}


@pytest.fixture
def client(settings: Settings, db: sessionmaker[Session]) -> Iterator[TestClient]:
    """The app over HTTP (lifespan run, so the job runner/queue is started and stopped)."""
    with TestClient(create_app(settings)) as c:
        yield c


# ------------------------------------------------------------------------------------------ job queue


RunJobs = Callable[..., None]


@pytest.fixture
def run_jobs(client: TestClient, settings: Settings) -> RunJobs:
    """Run the jobs submitted so far to completion: with Redis, a real ``rq.SimpleWorker`` in burst mode
    (in this thread; repeated until ``until()`` holds when given); otherwise wait for the in-process
    runner to be idle (and for ``until()``). ``app_client``: another app than ``client``."""

    def run(
        until: Callable[[], bool] | None = None, timeout: float = 120.0, app_client: TestClient | None = None
    ) -> None:
        queue = (app_client or client).app.state.queue  # type: ignore[attr-defined]
        deadline = time.monotonic() + timeout
        if REDIS_URL:
            from rq import SimpleWorker
            from rq.serializers import JSONSerializer

            from worker import context

            context.configure(settings)
            while True:
                SimpleWorker([queue.rq_queue], connection=queue.connection, serializer=JSONSerializer).work(
                    burst=True, with_scheduler=False
                )
                if until is None or until():
                    return
                assert time.monotonic() < deadline, "jobs did not finish in time"
                time.sleep(0.02)
        while True:
            assert queue.wait_idle(max(0.0, deadline - time.monotonic())), "in-process jobs did not finish in time"
            if until is None or until():
                return
            assert time.monotonic() < deadline, "jobs did not finish in time"
            time.sleep(0.02)

    return run

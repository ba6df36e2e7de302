"""The client package lives in client/ (its own distribution); import it from there without installing.

Live services for the client's tests: the real app served by uvicorn on a loopback port, on the test
session's backend (a SQLite file and the in-process runner; or PostgreSQL with Redis and a real
`bait worker` process when BAIT_TEST_DATABASE_URL and BAIT_TEST_REDIS_URL are set). No HTTP is mocked.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from service.config import Settings
from service.main import create_app
from tests.conftest import REDIS_URL
from tests.e2e.procs import Proc, bait_env, wait_for
from tests.service.live import serve_in_thread

CLIENT = Path(__file__).resolve().parents[2] / "client"
if str(CLIENT) not in sys.path:
    sys.path.insert(0, str(CLIENT))


@dataclass
class Live:
    """A running service: its URL, a key of tenant ``acme`` (every scope) and its settings."""

    url: str
    key: str
    settings: Settings


LiveFactory = Callable[..., AbstractContextManager[Live]]


@pytest.fixture(scope="package")
def client_queue() -> str:
    """The client tests' own RQ queue: their `bait worker` must never take the jobs of the rest of the
    suite (which runs its jobs in-thread from the session's queue), nor outlive the client tests."""
    return f"bait-client-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="package")
def client_data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """BAIT_DATA_ROOT of the client tests' service and of their `bait worker` (file:// sources lie here)."""
    return tmp_path_factory.mktemp("client-data")


@pytest.fixture(scope="package")
def rq_worker(
    database_url: str,
    client_queue: str,
    worker_cache_dir: Path,
    client_data_root: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Proc | None]:
    """A real `bait worker` process on the session's database and the client tests' queue (the PostgreSQL
    + Redis pass), stopped when the client tests end; None in embedded mode, where the app's in-process
    runner does the jobs."""
    if not REDIS_URL:
        yield None
        return
    log = tmp_path_factory.mktemp("worker") / "worker.log"
    worker = start_worker(database_url, client_queue, log, worker_cache_dir, data_root=client_data_root)
    try:
        yield worker
    finally:
        worker.stop()


def start_worker(database_url: str, queue_name: str, log: Path, cache_dir: Path, data_root: Path | None = None) -> Proc:
    env = bait_env(
        database_url,
        REDIS_URL,
        queue_name,
        secret_key="test-secret-key-0123456789",  # the tests' settings: webhook secrets decrypt alike
        worker_cache_dir=str(cache_dir),
        warm_up="false",
        **({"data_root": str(data_root)} if data_root is not None else {}),
    )
    worker = Proc(["worker", "--name", f"client-{uuid.uuid4().hex[:6]}"], env, log)
    wait_for(lambda: "Listening on" in worker.output() or "listening" in worker.output().lower(), 90,
             "`bait worker` did not start", worker)  # fmt: skip
    return worker


@pytest.fixture
def live_service(settings: Settings, api_key: str, rq_worker: Proc | None, client_queue: str) -> LiveFactory:
    """``with live_service(rate_limit="5/second") as live: ...``: the app with these settings changed,
    served over a real socket until the block ends (its jobs go to the client tests' queue)."""

    @contextmanager
    def start(**overrides: Any) -> Iterator[Live]:
        changed = settings.model_copy(update={"queue_name": client_queue, **overrides})
        with serve_in_thread(create_app(changed)) as url:
            yield Live(url=url, key=api_key, settings=changed)

    return start


@pytest.fixture
def live(live_service: LiveFactory) -> Iterator[Live]:
    """The service with the test settings (rate limits off)."""
    with live_service() as service:
        yield service

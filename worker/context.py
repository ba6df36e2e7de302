"""The settings and database a job runs against.

``bait worker`` and the in-process runner call :func:`configure` with their settings (and their queue)
before running jobs; a job calls :func:`env`. Without a prior ``configure`` (an RQ worker started by
other means), the settings come from the environment. The engine is rebuilt in a forked child, whose
inherited connections belong to the parent.

A job that creates another (the Label Studio auto-batch) submits it through :func:`queue`: the runner's
own queue, or with ``BAIT_REDIS_URL`` an RQ queue of this process; never by running it inline.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings, get_settings
from service.db import make_engine, make_sessionmaker
from service.queue import JobQueue, RQQueue


@dataclass(frozen=True)
class JobEnv:
    settings: Settings
    engine: Engine
    sessionmaker: sessionmaker[Session]
    pid: int
    queue: JobQueue | None = None  # where jobs created by a job go (None: RQ on settings.redis_url)


_lock = threading.Lock()
_env: JobEnv | None = None


def configure(settings: Settings, queue: JobQueue | None = None) -> JobEnv:
    """Make ``settings`` the jobs' settings (reusing the engine when the database is the same) and ``queue``
    the queue their follow-up jobs go to (without one, the queue configured before is kept while the
    settings are the same: a test or bench re-configuring the settings does not detach the runner)."""
    global _env
    with _lock:
        old = _env
        same_process = old is not None and old.pid == os.getpid()
        if old is not None and same_process and old.settings.database_url == settings.database_url:
            engine = old.engine
        else:
            if old is not None:
                old.engine.dispose(close=same_process)
            engine = make_engine(settings)
        if queue is None and old is not None and same_process and old.settings == settings:
            queue = old.queue
        _env = JobEnv(
            settings=settings, engine=engine, sessionmaker=make_sessionmaker(engine), pid=os.getpid(), queue=queue
        )
        return _env


def env() -> JobEnv:
    current = _env
    if current is None or current.pid != os.getpid():
        return configure(current.settings if current is not None else get_settings())
    return current


_rq_queues: dict[tuple[int, str, str], RQQueue] = {}


def queue() -> JobQueue:
    """The queue a job submits the jobs it creates to: the one its runner configured, else (an RQ worker
    started by other means) one RQ queue per process on ``BAIT_REDIS_URL``.

    Raises:
        RuntimeError: no runner configured a queue and ``BAIT_REDIS_URL`` is unset.
    """
    current = env()
    if current.queue is not None:
        return current.queue
    settings = current.settings
    if not settings.redis_url:
        raise RuntimeError("no job queue: run jobs under `bait serve`'s runner or `bait worker` (BAIT_REDIS_URL)")
    key = (os.getpid(), settings.redis_url, settings.queue_name)
    with _lock:
        if key not in _rq_queues:
            _rq_queues[key] = RQQueue(settings)
        return _rq_queues[key]


def queue_or_none() -> JobQueue | None:
    """:func:`queue`, or None when there is none (logged by the caller): for follow-up work that is optional."""
    try:
        return queue()
    except RuntimeError:
        return None

"""The settings and database a job runs against.

``bait worker`` and the in-process runner call :func:`configure` with their settings before running
jobs; a job calls :func:`env`. Without a prior ``configure`` (an RQ worker started by other means), the
settings come from the environment. The engine is rebuilt in a forked child, whose inherited
connections belong to the parent.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings, get_settings
from service.db import make_engine, make_sessionmaker


@dataclass(frozen=True)
class JobEnv:
    settings: Settings
    engine: Engine
    sessionmaker: sessionmaker[Session]
    pid: int


_lock = threading.Lock()
_env: JobEnv | None = None


def configure(settings: Settings) -> JobEnv:
    """Make ``settings`` the jobs' settings (reusing the engine when the database is the same)."""
    global _env
    with _lock:
        old = _env
        if old is not None and old.pid == os.getpid() and old.settings.database_url == settings.database_url:
            engine = old.engine
        else:
            if old is not None:
                old.engine.dispose(close=old.pid == os.getpid())
            engine = make_engine(settings)
        _env = JobEnv(settings=settings, engine=engine, sessionmaker=make_sessionmaker(engine), pid=os.getpid())
        return _env


def env() -> JobEnv:
    current = _env
    if current is None or current.pid != os.getpid():
        return configure(current.settings if current is not None else get_settings())
    return current

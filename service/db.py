"""Engine and sessions. One transaction per request or job, committed in exactly one place."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings

log = logging.getLogger(__name__)
T = TypeVar("T")

# A transaction that lost a deadlock or a serialization conflict did nothing: run it again.
RETRYABLE_SQLSTATES = frozenset({"40001", "40P01"})  # serialization_failure, deadlock_detected
TRANSACTION_ATTEMPTS = 4  # runs of one transaction (or request) before the error is answered
RETRY_BASE_SECONDS = 0.05  # full jitter: the n-th retry waits uniform(0, min(cap, base * 2**n))
RETRY_CAP_SECONDS = 1.0


def make_engine(settings: Settings) -> Engine:
    """Create the engine; for SQLite make the folder, enable WAL and foreign keys."""
    kwargs: dict[str, Any] = {"pool_pre_ping": True}
    if settings.is_sqlite:
        path = settings.sqlite_path()
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        kwargs["connect_args"] = {"check_same_thread": False, "timeout": 30}
    engine = create_engine(settings.database_url, **kwargs)
    if settings.is_sqlite:

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

    return engine


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(bind=engine, expire_on_commit=False, autoflush=False)


@contextmanager
def session_scope(factory: sessionmaker[Session]) -> Iterator[Session]:
    """The one place a job's transaction is committed or rolled back."""
    session = factory()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()


def is_retryable(exc: BaseException) -> bool:
    """A deadlock or serialization failure (PostgreSQL rolled the transaction back; running it again is safe)."""
    return isinstance(exc, DBAPIError) and getattr(exc.orig, "sqlstate", None) in RETRYABLE_SQLSTATES


def retry_delay(retry: int) -> float:
    """Seconds to wait before retry number ``retry`` (0-based): exponential with full jitter, so writers
    that collided do not collide again in step."""
    return random.uniform(0.0, min(RETRY_CAP_SECONDS, RETRY_BASE_SECONDS * 2**retry))


def begin_write(session: Session) -> None:
    """Make the session's transaction a writer from its first statement on SQLite (``BEGIN IMMEDIATE``): what it
    reads then stays true until it commits. Python's sqlite3 starts a transaction only at the first write, so a
    read-then-write transaction (a recovery sweep) could read a row, wait for another writer's lock, and then
    overwrite what that writer committed meanwhile (it re-queued an import that had just succeeded, after the
    import held the lock for 12 minutes). PostgreSQL's row locks (``FOR UPDATE``) already give this; nothing is
    done there."""
    conn = session.connection()
    if conn.dialect.name != "sqlite":
        return
    raw: Any = conn.connection.driver_connection
    if not raw.in_transaction:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


def run_transaction(
    factory: sessionmaker[Session], fn: Callable[[Session], T], *, attempts: int = TRANSACTION_ATTEMPTS
) -> T:
    """``fn(session)`` in one transaction (:func:`session_scope`), run again after a deadlock or
    serialization failure, at most ``attempts`` times in all. ``fn`` must be safe to run again: it
    only touches the session (its writes were rolled back)."""
    for retry in range(attempts):
        try:
            with session_scope(factory) as session:
                return fn(session)
        except DBAPIError as exc:
            if not is_retryable(exc) or retry == attempts - 1:
                raise
            log.info("transaction %s (retry %d of %d)", exc.orig.__class__.__name__, retry + 1, attempts - 1)
            time.sleep(retry_delay(retry))
    raise AssertionError("unreachable")

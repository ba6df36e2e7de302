"""The job runtime: what every job with attempts shares (batch, embed, select).

- :func:`start_job`: the prologue of a job: move its row ``queued -> running`` with one conditional
  UPDATE (so a duplicate delivery is a no-op) and read what the job needs in the same transaction.
- :class:`Tracker`: throttled progress writes, a heartbeat from a side thread, and cancellation checks
  for one attempt; a job whose row is no longer its own to run raises :class:`Stopped`.
- :func:`describe_error`: the message a failed job stores; :func:`jsonable`: diagnostics as JSON.
- :func:`configure`: the runners' start hook (settings, the queue follow-up jobs go to, warm-up).

Every write of a running attempt is conditioned on ``status = 'running'`` and its attempt number, so a
worker presumed dead that wakes up again can never write over a newer attempt.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import numpy as np
import torch
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from selection.errors import SelectionError
from service.config import Settings
from service.db import session_scope
from service.queue import JobQueue
from service.store import batches as store
from worker import context, pool_store, threads
from worker.pool_data import PoolDataError

log = logging.getLogger(__name__)
T = TypeVar("T")

PROGRESS_EVERY_S = 0.5  # at most this often a progress write


def utcnow() -> datetime:
    return datetime.now(UTC)


def configure(settings: Settings, queue: JobQueue | None = None) -> None:
    """Runner start hook: importing this module loads the numerics; then point jobs at ``settings`` (and
    at ``queue``, where the jobs they create go) and warm up head training (once per process, unless
    ``BAIT_WARM_UP=false``)."""
    env = context.configure(settings, queue=queue)
    pool_store.sweep_at_start(settings, env.sessionmaker)  # folders of pools deleted while no runner ran
    if settings.warm_up:
        threads.warm_up(settings.job_threads, resolve_device(settings.device))


def resolve_device(setting: str) -> str:
    """``auto`` -> ``cuda`` when a GPU is present, else ``cpu``."""
    if setting == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return setting


class Stopped(Exception):
    """The job is no longer this attempt's to run (cancelled, taken over, or deleted)."""


def describe_error(exc: BaseException) -> str:
    """Selection and data errors verbatim (they are written for users); others with their type."""
    if isinstance(exc, SelectionError | PoolDataError):
        return str(exc)
    return f"internal error: {type(exc).__name__}: {exc}"


class Tracker:
    """Throttled progress writes and a heartbeat thread for one attempt of one batch."""

    def __init__(self, factory: sessionmaker[Session], batch_id: str, attempt: int, heartbeat_s: float) -> None:
        self.factory = factory
        self.batch_id = batch_id
        self.attempt = attempt
        self.heartbeat_s = heartbeat_s
        self.stage_name = "load"
        self._last_write = 0.0
        self._stopped = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat-{batch_id}", daemon=True)

    def __enter__(self) -> Tracker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join(5)

    def _beat(self) -> None:
        while not self._done.wait(self.heartbeat_s):
            try:
                with session_scope(self.factory) as s:
                    if not self._touch(s, None):
                        self._stopped.set()
                        return
            except OperationalError as exc:  # e.g. SQLite's write lock, held by this very job's long write
                log.warning("heartbeat of job %s missed: %s", self.batch_id, str(exc.orig).splitlines()[0])
            except Exception:  # a missed heartbeat is not fatal; the next one may pass
                log.warning("heartbeat of job %s failed", self.batch_id, exc_info=True)

    def _touch(self, s: Session, progress: tuple[str, int, int] | None) -> bool:
        """Heartbeat (and progress) of this attempt; False when the job is no longer its to run.
        Subclasses track other job tables (:class:`worker.embed.EmbedTracker`)."""
        return store.touch_batch(s, self.batch_id, self.attempt, utcnow(), progress)

    def check(self) -> None:
        if self._stopped.is_set():
            raise Stopped(self.batch_id)

    def write(self, done: int, total: int) -> None:
        """Write progress now; raise :class:`Stopped` if the batch was cancelled or taken over."""
        self.check()
        with session_scope(self.factory) as s:
            ok = self._touch(s, (self.stage_name, int(done), int(total)))
        self._last_write = time.monotonic()
        if not ok:
            self._stopped.set()
            raise Stopped(self.batch_id)

    def stage(self, name: str, done: int = 0, total: int = 0) -> None:
        self.stage_name = name
        self.write(done, total)

    def callback(self, done: int, total: int) -> None:
        """Progress callback for the numerics: throttled, and a cancellation point."""
        self.check()
        if time.monotonic() - self._last_write >= PROGRESS_EVERY_S or (total and done >= total):
            self.write(done, total)


def start_job(
    factory: sessionmaker[Session],
    what: str,
    job_id: str,
    start: Callable[[Session, str, datetime], int | None],
    get: Callable[[Session, str], Any],
    read: Callable[[Any, int, datetime], T],
) -> T | None:
    """The prologue of every job with attempts: move the row ``queued -> running`` with one conditional
    UPDATE (so a duplicate delivery is a no-op) and ``read(row, attempt, now)`` what the job needs in the
    same transaction. None when there is nothing to run; LookupError when the row is gone."""
    with session_scope(factory) as s:
        now = utcnow()
        attempt = start(s, job_id, now)
        row = get(s, job_id)
        if row is None:
            raise LookupError(f"{what} {job_id} does not exist (its pool was deleted?); nothing to run")
        if attempt is None:
            log.info("%s %s is %s, not queued: nothing to run", what, job_id, row.status)
            return None
        return read(row, attempt, now)


def jsonable(value: Any) -> Any:
    """Diagnostics as JSON primitives (numpy scalars, tuples and non-finite floats converted)."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return jsonable(value.item())
    if isinstance(value, float) and not np.isfinite(value):
        return None
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)

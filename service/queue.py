"""Job submission: one interface, two implementations.

- :class:`InProcessQueue` (embedded default): a worker thread inside the api process runs jobs one at a
  time, first in first out; a job that raises is logged and the thread goes on with the next one.
- :class:`RQQueue` (``BAIT_REDIS_URL`` set): jobs go to Redis and ``bait worker`` processes run them.

Jobs are named by dotted path (every path is in :mod:`service.catalog`) and take JSON-compatible keyword
arguments (ids, never ORM objects), so the web process never imports the numerics: RQ resolves the path in the
worker, the in-process runner resolves it with :mod:`importlib` when the job runs. The job id is the id
of the database row the job works on, so a retried submission cannot run twice (and the job itself
refuses to start a row that is no longer ``queued``).

A job is submitted only once the transaction that created its row has committed:
:func:`enqueue_on_commit` hooks the submission to the session's commit, and drops it on rollback.
"""

from __future__ import annotations

import importlib
import json
import logging
import queue as stdlib_queue
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import event
from sqlalchemy.orm import Session

from service import catalog
from service.config import Settings

log = logging.getLogger(__name__)

# Called with the settings by the in-process runner thread before its first job, so jobs use the app's
# settings (and the numerics are imported in the background, not in the first request's job).
WORKER_CONFIGURE = catalog.WORKER_CONFIGURE


class JobTimeout(Exception):
    """A job waited on with :meth:`JobQueue.call` did not finish in time."""


class JobFailed(Exception):
    """A job waited on with :meth:`JobQueue.call` raised; the message is the job's error."""


def resolve(func_path: str) -> Callable[..., Any]:
    """The function named ``package.module.function``."""
    module_name, _, attr = func_path.rpartition(".")
    if not module_name:
        raise ValueError(f"job function must be a dotted path, got {func_path!r}")
    fn = getattr(importlib.import_module(module_name), attr)
    if not callable(fn):
        raise TypeError(f"{func_path} is not callable")
    return fn


def _json_roundtrip(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The arguments exactly as a JSON serializer would deliver them (both modes behave alike)."""
    result: dict[str, Any] = json.loads(json.dumps(kwargs))
    return result


class JobQueue(ABC):
    """Submit jobs by dotted path; ``call`` submits and waits for the return value."""

    mode: str

    def start(self) -> None:  # noqa: B027  (optional hook)
        """Start background machinery (the runner thread); called by the app lifespan."""

    def stop(self, timeout: float = 30.0) -> None:  # noqa: B027  (optional hook)
        """Stop background machinery, letting a running job finish for up to ``timeout`` seconds."""

    @abstractmethod
    def enqueue(self, func_path: str, job_id: str, /, **kwargs: Any) -> None:
        """Submit ``func_path(**kwargs)`` under ``job_id``; a job id already waiting is not added again."""

    def requeue(self, func_path: str, job_id: str, /, **kwargs: Any) -> None:
        """Submit again a job whose previous run died (any record of that run is replaced)."""
        self.enqueue(func_path, job_id, **kwargs)

    @abstractmethod
    def call(self, func_path: str, job_id: str, /, *, timeout: float, **kwargs: Any) -> Any:
        """Submit a job and wait for its return value.

        Raises:
            JobTimeout: no result within ``timeout`` seconds (the job is withdrawn if it has not started).
            JobFailed: the job raised.
        """

    @abstractmethod
    def is_pending(self, job_id: str) -> bool:
        """Whether a job with this id is waiting or running (known to the queue)."""


@dataclass
class _Task:
    func_path: str
    job_id: str
    kwargs: dict[str, Any]
    future: Future[Any] | None = None


@dataclass
class InProcessQueue(JobQueue):
    """A FIFO worker thread in the api process (the embedded default)."""

    settings: Settings
    configure_path: str | None = WORKER_CONFIGURE
    mode: str = "inprocess"
    _tasks: stdlib_queue.Queue[_Task | None] = field(default_factory=stdlib_queue.Queue)
    _pending: set[str] = field(default_factory=set)
    _lock: threading.Condition = field(default_factory=threading.Condition)
    _running: str | None = None
    _thread: threading.Thread | None = None
    _stopping: bool = False

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="bait-job-runner", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Finish the running job (up to ``timeout``); jobs still waiting stay ``queued`` in the database
        and are picked up again by the next start (see :func:`service.domain.jobs.recover_jobs`)."""
        thread = self._thread
        if thread is None:
            return
        self._stopping = True
        self._tasks.put(None)
        thread.join(timeout)
        if thread.is_alive():
            log.warning(
                "job runner still busy with %s after %.0f s; leaving it to die with the process", self._running, timeout
            )
        self._thread = None

    def enqueue(self, func_path: str, job_id: str, /, **kwargs: Any) -> None:
        self._submit(_Task(func_path, job_id, _json_roundtrip(kwargs)))

    def call(self, func_path: str, job_id: str, /, *, timeout: float, **kwargs: Any) -> Any:
        future: Future[Any] = Future()
        self._submit(_Task(func_path, job_id, _json_roundtrip(kwargs), future))
        try:
            return future.result(timeout)
        except FutureTimeout as exc:
            future.cancel()  # a job not yet started is skipped
            raise JobTimeout(f"job {job_id} did not finish within {timeout:g} s") from exc
        except Exception as exc:
            raise JobFailed(str(exc)) from exc

    def is_pending(self, job_id: str) -> bool:
        with self._lock:
            return job_id in self._pending

    def wait_idle(self, timeout: float = 60.0) -> bool:
        """Block until no job is waiting or running; False on timeout (tests use it)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._pending:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
        return True

    def _submit(self, task: _Task) -> None:
        if self._thread is None or self._stopping:
            raise RuntimeError("the in-process job runner is not running")
        with self._lock:
            if task.future is None and task.job_id in self._pending:
                log.info("job %s is already waiting; not enqueued twice", task.job_id)
                return
            self._pending.add(task.job_id)
        self._tasks.put(task)

    def _loop(self) -> None:
        if self.configure_path:
            try:
                resolve(self.configure_path)(self.settings, self)
            except BaseException:
                log.exception("job runner could not load %s; jobs will fail", self.configure_path)
        while True:
            task = self._tasks.get()
            if task is None:
                return
            with self._lock:
                self._running = task.job_id
            try:
                if task.future is not None and not task.future.set_running_or_notify_cancel():
                    continue
                try:
                    result = resolve(task.func_path)(**task.kwargs)
                except BaseException as exc:  # the runner survives every job
                    log.exception("job %s (%s) raised", task.job_id, task.func_path)
                    if task.future is not None:
                        task.future.set_exception(exc)
                else:
                    if task.future is not None:
                        task.future.set_result(result)
            finally:
                with self._lock:
                    self._running = None
                    self._pending.discard(task.job_id)
                    self._lock.notify_all()


class RQQueue(JobQueue):
    """Redis + RQ: ``Queue(settings.queue_name)`` with a JSON serializer; ``bait worker`` runs the jobs."""

    mode = "rq"

    def __init__(self, settings: Settings) -> None:
        from redis import Redis
        from rq import Queue
        from rq.serializers import JSONSerializer

        if not settings.redis_url:
            raise ValueError("RQQueue needs BAIT_REDIS_URL")
        self.settings = settings
        self.connection = Redis.from_url(settings.redis_url)
        self.rq_queue = Queue(
            settings.queue_name,
            connection=self.connection,
            serializer=JSONSerializer,
            default_timeout=settings.job_timeout_seconds,
        )

    def stop(self, timeout: float = 30.0) -> None:
        self.connection.close()

    def _job(self, job_id: str) -> Any:
        from rq.exceptions import NoSuchJobError
        from rq.job import Job

        try:
            return Job.fetch(job_id, connection=self.connection, serializer=self.rq_queue.serializer)
        except NoSuchJobError:
            return None

    def is_pending(self, job_id: str) -> bool:
        job = self._job(job_id)
        if job is None:
            return False
        status = job.get_status(refresh=False)
        return str(getattr(status, "value", status)) in ("queued", "started", "deferred", "scheduled")

    def _enqueue(self, func_path: str, job_id: str, kwargs: dict[str, Any], result_ttl: int) -> Any:
        from rq.exceptions import DuplicateJobError

        def put() -> Any:
            return self.rq_queue.enqueue_call(
                func_path,
                kwargs=kwargs,
                job_id=job_id,
                timeout=self.settings.job_timeout_seconds,
                result_ttl=result_ttl,
                failure_ttl=7 * 24 * 3600,
                description=f"{func_path}({job_id})",
                unique=True,
            )

        try:
            return put()
        except DuplicateJobError:
            if self.is_pending(job_id):
                log.info("job %s is already waiting or running; not enqueued twice", job_id)
                return None
            # A finished or failed run of the same id (e.g. a re-queue after a worker died): replace it.
            old = self._job(job_id)
            if old is not None:
                old.delete()
            return put()

    def enqueue(self, func_path: str, job_id: str, /, **kwargs: Any) -> None:
        self._enqueue(func_path, job_id, _json_roundtrip(kwargs), result_ttl=600)

    def requeue(self, func_path: str, job_id: str, /, **kwargs: Any) -> None:
        # The dead run may still sit in the started registry; the job refuses to run twice anyway.
        old = self._job(job_id)
        if old is not None:
            old.delete()
        self.enqueue(func_path, job_id, **kwargs)

    def call(self, func_path: str, job_id: str, /, *, timeout: float, **kwargs: Any) -> Any:
        job = self._enqueue(func_path, job_id, _json_roundtrip(kwargs), result_ttl=max(60, int(timeout) * 2))
        if job is None:
            raise JobFailed(f"job {job_id} is already running")
        deadline = time.monotonic() + timeout
        delay = 0.01
        try:
            while True:
                status = str(getattr(s := job.get_status(refresh=True), "value", s))
                if status == "finished":
                    return job.return_value(refresh=True)
                if status in ("failed", "stopped", "canceled"):
                    result = job.latest_result()
                    message = (result.exc_string or "").strip().splitlines() if result is not None else []
                    raise JobFailed(message[-1] if message else f"job {job_id} {status}")
                if time.monotonic() >= deadline:
                    raise JobTimeout(f"job {job_id} did not finish within {timeout:g} s (is a `bait worker` running?)")
                time.sleep(delay)
                delay = min(delay * 2, 0.1)
        except JobTimeout:
            if status == "queued":
                job.cancel()
            raise


def make_queue(settings: Settings) -> JobQueue:
    """RQ when ``BAIT_REDIS_URL`` is set, else the in-process runner."""
    if settings.redis_url:
        return RQQueue(settings)
    return InProcessQueue(settings)


def enqueue_on_commit(
    session: Session, queue: JobQueue, func_path: str, job_id: str, /, *, replace: bool = False, **kwargs: Any
) -> None:
    """Submit the job when ``session`` commits (and never if it rolls back); ``replace`` re-submits a job
    whose previous run died (:meth:`JobQueue.requeue`).

    A submission that fails after the commit is logged, not raised: the row stays ``queued`` and the
    recovery sweep (:func:`service.domain.jobs.recover_jobs`) submits it again.
    """
    pending: list[tuple[JobQueue, str, str, bool, dict[str, Any]]] = session.info.setdefault("bait_enqueue", [])
    pending.append((queue, func_path, job_id, replace, kwargs))
    if session.info.get("bait_enqueue_hooked"):
        return
    session.info["bait_enqueue_hooked"] = True

    @event.listens_for(session, "after_commit")
    def _submit(sess: Session) -> None:
        jobs = sess.info.pop("bait_enqueue", [])
        for q, path, jid, again, kw in jobs:
            try:
                (q.requeue if again else q.enqueue)(path, jid, **kw)
            except Exception:
                log.exception("could not submit job %s after commit; the recovery sweep will retry it", jid)

    @event.listens_for(session, "after_rollback")
    def _drop(sess: Session) -> None:
        sess.info.pop("bait_enqueue", None)

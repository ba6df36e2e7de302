"""``bait worker``: an RQ worker on ``settings.queue_name`` (CUDA when present, else CPU).

It runs jobs in its own process (rq's ``SimpleWorker``: no fork per job, so the CUDA context, the
imported numerics and the database pool stay warm; a crash takes the worker down and the recovery
sweep below re-queues what it was running). At start, and every ``sweep_interval_seconds`` from a side
thread, it re-queues or fails the jobs of dead workers (:func:`service.domain.jobs.recover_jobs`).

A Redis outage does not end the process. rq retries a lost connection while it waits for a job, but Redis
dying while a job is being finished (its result and heartbeat written back) makes rq's work loop quit; the
worker then waits for Redis to answer again and starts a fresh rq worker on the same queue. The batch the
job ran was committed to the database before rq's bookkeeping, so nothing of it is lost.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import uuid
from typing import Any

import redis

from service.config import Settings
from service.crypto import check_secret_key
from service.domain.jobs import recover_jobs
from service.queue import RQQueue
from worker import context, pool_store, threads
from worker.runtime import resolve_device

log = logging.getLogger(__name__)

#: Seconds between an rq worker quitting on an error and the next one starting.
RESTART_PAUSE_S = 1.0


def sweep_forever(queue: RQQueue, settings: Settings, stop: threading.Event) -> None:
    factory = context.env().sessionmaker
    while not stop.wait(settings.sweep_interval_seconds):
        try:
            recover_jobs(factory, queue, settings, assume_dead=False)
        except Exception:
            log.exception("job recovery sweep failed; retrying in %.0f s", settings.sweep_interval_seconds)


def run(settings: Settings, burst: bool = False, name: str | None = None) -> int:
    """Run an RQ worker until stopped (or, with ``burst``, until the queue is empty). Returns 0."""
    from rq import SimpleWorker
    from rq.serializers import JSONSerializer

    if not settings.redis_url:
        print("error: `bait worker` needs BAIT_REDIS_URL (without it `bait serve` runs jobs in-process)")
        return 2
    check_secret_key(settings)  # PostgreSQL without BAIT_SECRET_KEY: refuse to start
    queue = RQQueue(settings)
    env = context.configure(settings, queue=queue)  # jobs that create jobs submit them here
    pool_store.sweep_at_start(settings, env.sessionmaker)  # folders of pools deleted while no worker ran
    device = resolve_device(settings.device)
    if settings.warm_up:  # a first batch should not pay torch's start-up nor the rates' measurement
        threads.warm_up(settings.job_threads, device)
    log.info(
        "worker on queue %r, device %s, database %s", settings.queue_name, device, settings.database_url.split("@")[-1]
    )
    recover_jobs(env.sessionmaker, queue, settings, assume_dead=False)
    stop = threading.Event()
    sweeper = threading.Thread(target=sweep_forever, args=(queue, settings, stop), name="bait-sweeper", daemon=True)
    sweeper.start()
    base_name = name or f"bait-{socket.gethostname()}-{os.getpid()}"
    try:
        while True:
            # A fresh name per start: rq refuses a name whose earlier worker is still registered in Redis.
            worker = SimpleWorker(
                [queue.rq_queue],
                connection=queue.connection,
                serializer=JSONSerializer,
                name=f"{base_name}-{uuid.uuid4().hex[:6]}",
            )
            try:
                worker.work(burst=burst, logging_level=settings.log_level, with_scheduler=False)
                why = "rq's work loop quit (see its log above)"
            except redis.exceptions.RedisError as exc:  # rq's own teardown could not reach Redis either
                why = f"Redis unreachable: {exc}"
            # Without --burst, rq's loop ends on its own only after an error it does not handle (e.g. Redis
            # dying while a job's result is written back): only a stop signal ends the process.
            if burst or stop_asked(worker):
                break
            log.error("rq worker stopped (%s); starting a new one once Redis answers", why)
            # rq's signal handlers would write the stop request to Redis (it may be down): ours just stop.
            stop_on_signals(stop)
            stop.wait(RESTART_PAUSE_S)  # never spin, whatever made rq quit
            if not wait_for_redis(queue.connection, stop):
                break
            log.warning("starting a new rq worker on queue %r", settings.queue_name)
    finally:
        stop.set()
    return 0


def stop_on_signals(stop: threading.Event) -> None:
    """SIGTERM / SIGINT set ``stop`` (until the next rq worker installs its own handlers)."""

    def handler(signum: int, frame: Any) -> None:
        log.info("stop requested while waiting for Redis (signal %d)", signum)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def stop_asked(worker: Any) -> bool:
    """Whether SIGTERM / SIGINT reached ``worker`` (rq records the first signal's time, busy or idle)."""
    signalled = getattr(worker, "_shutdown_requested_date", None) is not None
    return signalled or bool(getattr(worker, "_stop_requested", False))


def redis_up(connection: Any) -> bool:
    """Whether Redis answers a PING."""
    try:
        return bool(connection.ping())
    except redis.exceptions.RedisError:
        return False


def wait_for_redis(connection: Any, stop: threading.Event, *, max_delay: float = 10.0) -> bool:
    """Block until Redis answers (True) or ``stop`` is set (False), retrying with a capped backoff."""
    delay = 0.5
    while not stop.is_set():
        if redis_up(connection):
            return True
        stop.wait(delay)
        delay = min(2 * delay, max_delay)
    return False

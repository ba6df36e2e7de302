"""``bait worker``: an RQ worker on ``settings.queue_name`` (CUDA when present, else CPU).

It runs jobs in its own process (rq's ``SimpleWorker``: no fork per job, so the CUDA context, the
imported numerics and the database pool stay warm; a crash takes the worker down and the recovery
sweep below re-queues what it was running). At start, and every ``sweep_interval_seconds`` from a side
thread, it re-queues or fails the jobs of dead workers (:func:`service.domain.jobs.recover_jobs`).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid

from service.config import Settings
from service.crypto import check_secret_key
from service.domain.jobs import recover_jobs
from service.queue import RQQueue
from worker import context, threads
from worker.jobs import resolve_device

log = logging.getLogger(__name__)


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
    env = context.configure(settings)
    if settings.warm_up:  # a first batch should not pay torch's start-up (worker/threads.py)
        threads.warm_up(settings.job_threads)
    queue = RQQueue(settings)
    device = resolve_device(settings.device)
    log.info(
        "worker on queue %r, device %s, database %s", settings.queue_name, device, settings.database_url.split("@")[-1]
    )
    recover_jobs(env.sessionmaker, queue, settings, assume_dead=False)
    stop = threading.Event()
    sweeper = threading.Thread(target=sweep_forever, args=(queue, settings, stop), name="bait-sweeper", daemon=True)
    sweeper.start()
    worker = SimpleWorker(
        [queue.rq_queue],
        connection=queue.connection,
        serializer=JSONSerializer,
        name=name or f"bait-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}",
    )
    try:
        worker.work(burst=burst, logging_level=settings.log_level, with_scheduler=False)
    finally:
        stop.set()
    return 0

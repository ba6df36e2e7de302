"""The batch job (``service.catalog.RUN_BATCH``): start the row, reconcile the pool's annotation
platforms, run the selection where it belongs (the Dask cluster, :mod:`worker.distributed_batch`, or this
process, :mod:`worker.batch`), push the batch, record the outcome, send the outgoing webhooks.

It sits above both engines, so neither imports the other's caller.
"""

from __future__ import annotations

import logging
import traceback

from sqlalchemy.exc import InterfaceError, OperationalError

from service.store import batches as store
from worker import context, distributed_batch
from worker.batch import (
    _after_batch,
    _batch_spec,
    _fail_batch,
    _platforms_before,
    _platforms_deliver,
    _run_batch,
)
from worker.runtime import Stopped, Tracker, describe_error, resolve_device, start_job

log = logging.getLogger(__name__)


def run_batch(batch_id: str) -> None:
    """Run one batch job (the job id is the batch id)."""
    env = context.env()
    settings = env.settings
    factory = env.sessionmaker
    spec = start_job(factory, "batch", batch_id, store.start_batch, store.get_batch_by_id, _batch_spec)
    if spec is None:
        return
    attempt = spec.attempt
    log.info("batch %s: attempt %d, %s of %d", batch_id, attempt, spec.strategy, spec.size)
    try:
        with Tracker(factory, batch_id, attempt, settings.job_heartbeat_seconds) as tracker:
            warnings = _platforms_before(spec, tracker)
            device, ttl_s = resolve_device(settings.device), settings.reservation_ttl_seconds
            # on the Dask cluster when BAIT_DASK_SCHEDULER is set and the strategy has a shard pass (None: done
            # there); else here, with the engine note for its diagnostics
            engine = distributed_batch.run(spec, factory, tracker, device, ttl_s)
            if engine is not None:
                _run_batch(spec, factory, tracker, device, ttl_s, engine)
            _platforms_deliver(spec, factory, warnings)
    except Stopped:
        log.info("batch %s: stopped (cancelled or taken over); nothing written", batch_id)
        return
    except (OperationalError, InterfaceError):
        # The database went away (restart, failover, network): this attempt is lost as if its worker had
        # died. Nothing of it was committed; the sweep re-queues it once its heartbeat is stale.
        log.warning("batch %s: database lost mid-job; the recovery sweep re-queues it", batch_id, exc_info=True)
        return
    except Exception as exc:
        log.error("batch %s failed:\n%s", batch_id, traceback.format_exc())
        _fail_batch(factory, batch_id, attempt, describe_error(exc))
    _after_batch(batch_id)

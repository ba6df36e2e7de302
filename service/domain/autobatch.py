"""The auto-batch policy of an annotation-platform integration: when a train request becomes a batch.

A platform asks for training (Label Studio's ``START_TRAINING``): :func:`request_training` notes the
request on the integration. :func:`evaluate` then creates the next batch when a request is pending and
the integration's ``auto_batch`` policy allows it, and submits its job once the transaction commits; it
is asked again whenever a label arrives from the platform (an annotation, a reconcile) while a request
is pending.

The policy (:func:`effective_auto_batch`): ``{"size", "when", "n", "stop_when_recommended"}``; never while a
batch of the pool is queued or running; after the last auto batch, ``when = "batch_done"`` waits until its
items are all labeled, ``when = "every_n_labels"`` until ``n`` labels arrived since it was created. With
``stop_when_recommended`` (default false) no batch is created while the stopping rule recommends stopping
(at the pool's latest checkpoint, on its default validation metric): the request stays pending, and the
integration's state records why (``auto_batch_stopped``: reason, round, since when), shown by the
integration's GET and on the dashboard. A batch requested by hand trains a new checkpoint, which may lift it.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from service import catalog
from service.domain.batches import BatchRequest, new_batch_row
from service.domain.quality import stop_recommendation
from service.errors import BadRequest, ServiceError
from service.labelstudio import IntegrationConfig
from service.queue import JobQueue, enqueue_on_commit
from service.store import batches as batches_repo
from service.store import integrations as repo
from service.store import pools as pools_repo
from service.store.models import Integration

log = logging.getLogger(__name__)

AUTO_BATCH_WHEN = ("batch_done", "every_n_labels")


def effective_auto_batch(config: IntegrationConfig) -> dict[str, Any]:
    """``auto_batch`` with its defaults: ``{"size": batch_size, "when": "batch_done", "n": size,
    "stop_when_recommended": False}``.

    Raises:
        BadRequest: an unknown key, a size or n below 1, an unknown ``when``, a non-boolean stop switch.
    """
    given = dict(config.auto_batch or {})
    unknown = sorted(set(given) - {"size", "when", "n", "stop_when_recommended"})
    if unknown:
        raise BadRequest(f"auto_batch: unknown key(s) {unknown}; it takes size, when, n and stop_when_recommended")
    stop = given.get("stop_when_recommended", False)
    if not isinstance(stop, bool):
        raise BadRequest(f"auto_batch.stop_when_recommended must be true or false, got {stop!r}")
    size = given.get("size", config.batch_size)
    when = given.get("when", "batch_done")
    n = given.get("n", size)
    if when not in AUTO_BATCH_WHEN:
        raise BadRequest(f"auto_batch.when must be one of {list(AUTO_BATCH_WHEN)}, got {when!r}")
    for name, v in (("size", size), ("n", n)):
        if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= 1_000_000:
            raise BadRequest(f"auto_batch.{name} must be an integer from 1 to 1000000, got {v!r}")
    return {"size": size, "when": when, "n": n, "stop_when_recommended": stop}


def request_training(session: Session, integration_id: str, now: datetime) -> bool:
    """Note a train request on the integration (False: there is no such integration)."""
    return repo.update_state(session, integration_id, train_requested_at=now.isoformat()) is not None


def train_pending(session: Session, integration_id: str) -> bool:
    """Whether a train request of the integration waits for its batch."""
    integration = repo.get_integration_by_id(session, integration_id)
    return integration is not None and bool((integration.state or {}).get("train_requested_at"))


def blocked_by(session: Session, integration: Integration, policy: dict[str, Any], now: datetime) -> str | None:
    """Why a new batch may not be created now (None: it may)."""
    if repo.active_batches(session, integration.pool_id):
        return "a batch of the pool is queued or running"
    last = repo.latest_linked_batch(session, integration.id)
    if last is None:
        return None
    if policy["when"] == "batch_done":
        left = repo.open_items_of_batch(session, last, now)
        return f"{left} item(s) of batch {last.id} are not labeled yet" if left else None
    n = repo.labels_since(session, integration.pool_id, last.created_at)
    return f"{n} of {policy['n']} labels since batch {last.id}" if n < int(policy["n"]) else None


def evaluate(session: Session, queue: JobQueue, integration_id: str, now: datetime, settings: Any) -> str | None:
    """Create the next batch when a train request is pending and the policy allows it; its job is submitted
    to ``queue`` once ``session`` commits. Returns the batch id (None: no batch now).

    A batch that cannot be requested (say, the configured strategy no longer fits the pool) clears the
    request and puts the error on the integration.
    """
    if not train_pending(session, integration_id):
        return None
    integration = repo.lock_integration(session, integration_id)
    if integration is None or not (integration.state or {}).get("train_requested_at"):
        return None
    config = IntegrationConfig.from_dict(integration.config or {})
    try:
        policy = effective_auto_batch(config)
    except ServiceError:
        policy = {"size": config.batch_size, "when": "batch_done", "n": config.batch_size}
    pool = pools_repo.lock_pool(session, integration.pool_id)  # one auto-batch decision at a time per pool
    assert pool is not None
    reason = blocked_by(session, integration, policy, now)
    if reason is not None:
        log.info("integration %s: no new batch yet (%s)", integration_id, reason)
        return None
    state = dict(integration.state or {})
    if policy.get("stop_when_recommended"):
        stop = stop_recommendation(session, pool)
        if stop["recommended"]:
            rnd = stop["evidence"].get("round")
            held = state.get("auto_batch_stopped") or {}
            if held.get("round") != rnd:  # record once per checkpoint (evaluated again at every label)
                state["auto_batch_stopped"] = {"reason": stop["reason"], "round": rnd, "at": now.isoformat()}
                integration.state = state
            log.info("integration %s: no new batch: the stopping rule recommends stopping", integration_id)
            return None
    state.pop("auto_batch_stopped", None)
    size = min(int(policy["size"]), batches_repo.count_available(session, pool.id, now))
    state.pop("train_requested_at", None)
    if size < 1:
        integration.state = state
        return None
    try:
        batch = new_batch_row(
            session, pool, BatchRequest(size=size, strategy=config.strategy, params={}), now, settings
        )
    except ServiceError as exc:
        integration.state = state
        integration.status = "error"
        integration.last_error = f"START_TRAINING: could not request a batch: {exc.message}"
        return None
    state["last_auto_batch"] = batch.id
    integration.state = state
    enqueue_on_commit(session, queue, catalog.RUN_BATCH, batch.id, batch_id=batch.id)
    log.info("integration %s: auto batch %s (%s)", integration_id, batch.id, policy)
    return batch.id

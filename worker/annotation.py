"""Annotation-platform jobs: reconcile runs, annotation events, train requests, a batch pushed again, and
the two steps a batch job of a connected pool takes (reconcile before selecting, push after storing).

Every job looks its integration's platform up by ``kind`` (:func:`service.domain.platforms.platform_for`)
and runs it with a :class:`~service.domain.platforms.PlatformEnv` built from the job context; the
worker's :func:`worker.predict.predict` is how a platform gets the pool model's pre-annotations. The order
of work around a batch (see :mod:`worker.batch`): :func:`before_batch` (reconcile every integration,
bounded in time, so selection sees every label), then train/select/store, then :func:`deliver` (push),
then ``succeeded`` and the outgoing webhook.

``START_TRAINING`` (:func:`train_requested`) and every label a platform brings (:func:`apply_annotation`,
:func:`run_reconcile`) ask the auto-batch policy (:mod:`service.domain.autobatch`) whether a batch is due;
a batch it creates is submitted through this runner's queue (:func:`worker.context.queue`) once its row is
committed.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session

from service.db import session_scope
from service.domain import autobatch
from service.domain.platforms import AnnotationPlatform, PlatformEnv, platform_for
from service.store import batches as batches_repo
from service.store import integrations as repo
from service.store.models import Batch, ReconcileRun
from worker import context
from worker.predict import predict

log = logging.getLogger(__name__)


def utcnow() -> datetime:
    return datetime.now(UTC)


def platform_env() -> PlatformEnv:
    """The job context as a platform sees it (session factory, settings, the predict job)."""
    env = context.env()
    return PlatformEnv(sessionmaker=env.sessionmaker, settings=env.settings, predict=predict)


def _platform(integration_id: str) -> AnnotationPlatform | None:
    """The platform of the integration (None: the integration is gone)."""
    with session_scope(context.env().sessionmaker) as s:
        row = repo.get_integration_by_id(s, integration_id)
        return None if row is None else platform_for(row.kind)


# --------------------------------------------------------------------------------------------------
# Around a batch: reconcile first, push after
# --------------------------------------------------------------------------------------------------


def has_integrations(s: Session, pool_id: str) -> bool:
    return bool(repo.pool_integration_ids(s, pool_id))


def before_batch(pool_id: str, budget_s: float) -> list[str]:
    """Reconcile every integration of the pool, within ``budget_s`` in all; returns warnings (a reconcile
    that failed or ran out of time; the batch goes on with the labels it has)."""
    env = context.env()
    with session_scope(env.sessionmaker) as s:
        ids = repo.pool_integration_ids(s, pool_id)
    warnings: list[str] = []
    deadline = time.monotonic() + budget_s
    for integration_id in ids:
        with session_scope(env.sessionmaker) as s:
            run = ReconcileRun(integration_id=integration_id, trigger="batch", status="queued", created_at=utcnow())
            s.add(run)
            s.flush()
            run_id = run.id
        run_reconcile(run_id, deadline=deadline)
        with session_scope(env.sessionmaker) as s:
            done = s.get(ReconcileRun, run_id)
            if done is not None and done.status != "succeeded":
                warnings.append(f"reconcile of integration {integration_id} before selection: {done.error}")
    return warnings


def deliver(batch_id: str) -> str | None:
    """Push the batch into every integration of its pool; returns ``delivered`` | ``failed`` (None: the pool
    has no integration)."""
    env = context.env()
    with session_scope(env.sessionmaker) as s:
        batch = batches_repo.get_batch_by_id(s, batch_id)
        if batch is None:
            return None
        integration_ids = repo.pool_integration_ids(s, batch.pool_id)
    if not integration_ids:
        return None
    ok = [push_batch(i, batch_id) for i in integration_ids]
    return "delivered" if all(ok) else "failed"


def redeliver(batch_id: str) -> str | None:
    """The retry endpoint's job: reconcile first (tasks imported meanwhile are adopted, not duplicated),
    then push the succeeded batch's items that have no task yet."""
    env = context.env()
    with session_scope(env.sessionmaker) as s:
        batch = batches_repo.get_batch_by_id(s, batch_id)
        if batch is None or batch.status != "succeeded":
            return None
        pool_id = batch.pool_id
    before_batch(pool_id, env.settings.labelstudio_reconcile_budget_seconds)
    outcome = deliver(batch_id)
    if outcome == "delivered":
        with session_scope(env.sessionmaker) as s:
            batch = s.get(Batch, batch_id)
            if batch is not None and (batch.error or "").startswith("Label Studio import failed"):
                batch.error = None
    return outcome


def push_batch(integration_id: str, batch_id: str) -> bool:
    """Push the batch's items that have no task yet into the integration's platform; True when it went
    through (False: it failed, noted on the batch and the integration; or the integration is gone)."""
    platform = _platform(integration_id)
    return False if platform is None else platform.push_batch(platform_env(), integration_id, batch_id)


# --------------------------------------------------------------------------------------------------
# Reconcile and annotation events
# --------------------------------------------------------------------------------------------------


def run_reconcile(run_id: str, deadline: float | None = None) -> dict[str, int] | None:
    """A reconcile run (a readable job): ``queued -> running -> succeeded | failed`` with its counts."""
    env = context.env()
    factory = env.sessionmaker
    with session_scope(factory) as s:
        run = s.get(ReconcileRun, run_id)
        if run is None or run.status != "queued":
            return None
        run.status = "running"
        run.started_at = utcnow()
        integration_id = run.integration_id
    error: str | None = None
    counts: dict[str, int] | None = None
    platform = _platform(integration_id)
    if platform is not None:
        try:
            counts = platform.reconcile(platform_env(), integration_id, deadline=deadline, raise_errors=True)
        except Exception as exc:
            error = platform.describe_error(exc)
    with session_scope(factory) as s:
        run = s.get(ReconcileRun, run_id)
        if run is not None:
            run.status = "failed" if error else "succeeded"
            run.error = error
            run.counts = counts
            run.finished_at = utcnow()
    if error is None:
        evaluate_policy(integration_id)
    return counts


def reconcile(integration_id: str, deadline: float | None = None, raise_errors: bool = False) -> dict[str, int] | None:
    """Make the pool's labels match the annotations in the integration's platform; returns counts (None: the
    integration is gone)."""
    platform = _platform(integration_id)
    if platform is None:
        return None
    return platform.reconcile(platform_env(), integration_id, deadline=deadline, raise_errors=raise_errors)


def apply_annotation(integration_id: str, event: dict[str, Any]) -> str:
    """Apply one annotation event of a platform's webhook; returns what happened. A label written asks the
    auto-batch policy whether a batch is due."""
    platform = _platform(integration_id)
    if platform is None:
        return "no integration"
    outcome = platform.apply_event(platform_env(), integration_id, event)
    if outcome == "written":
        evaluate_policy(integration_id)
    return outcome


# --------------------------------------------------------------------------------------------------
# Auto-batching: the policy is the domain's (service.domain.autobatch); the worker only asks it
# --------------------------------------------------------------------------------------------------


def train_requested(integration_id: str) -> str | None:
    """``START_TRAINING``: note the request, then create a batch if the policy allows it now."""
    env = context.env()
    with session_scope(env.sessionmaker) as s:
        if not autobatch.request_training(s, integration_id, utcnow()):
            return None
    return evaluate_policy(integration_id)


def evaluate_policy(integration_id: str) -> str | None:
    """Create the next batch when a train request is pending and the integration's ``auto_batch`` policy
    allows it (:func:`service.domain.autobatch.evaluate`); its job goes to this runner's queue once the
    batch row is committed. Returns the batch id (None: no batch now)."""
    env = context.env()
    with session_scope(env.sessionmaker) as s:
        if not autobatch.train_pending(s, integration_id):
            return None
        return autobatch.evaluate(s, context.queue(), integration_id, utcnow(), context.env().settings)

"""The batch job: where the database meets the numerics.

:func:`run_batch` loads the pool, trains a head on the labeled items, embeds the pool, selects, then
reserves the chosen items and writes the result in one transaction. A pool connected to an annotation
platform reconciles its projects first and pushes the batch before it is marked ``succeeded``.

A batch job moves ``queued -> running`` with one conditional UPDATE (:func:`worker.runtime.start_job`,
so a duplicate delivery is a no-op), refreshes a heartbeat from a side thread while it runs, and checks
for cancellation at every progress write (:class:`worker.runtime.Tracker`).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy.orm import Session, sessionmaker

import selection
from selection.heads import HeadConfig, TrainedHead, save_checkpoint, train_head
from selection.heads import predict as head_predict
from service.db import session_scope
from service.domain import coldstart, pool_size
from service.domain.strategies import EXCLUDE_OUTLIERS, excludes_outliers
from service.store import batches as store
from service.store import quality as quality_store
from service.store.attempts import close_running, finish_attempt, write_if_running
from service.store.models import Batch, Checkpoint, Pool
from worker import annotation, context, pool_cache, quality, steering, stopping, threads, webhooks
from worker.pool_data import PoolArrays, PoolDataError, current_design, load_pool
from worker.runtime import Stopped, Tracker, jsonable, utcnow

log = logging.getLogger(__name__)

RESERVE_ATTEMPTS = 4  # selections tried when concurrent batches keep taking chosen items (SQLite, several processes)
LOCK_POLL_S = 0.2  # a batch waiting for its pool's selection lock checks for cancellation this often


class ReservationConflict(Exception):
    """A concurrent batch reserved some of the chosen items first."""


@dataclass(frozen=True)
class _BatchSpec:
    batch_id: str
    pool_id: str
    size: int
    strategy: str
    params: dict[str, Any]
    seed: int
    attempt: int
    queued_for: float


def batch_seed(batch_id: str, params: dict[str, Any]) -> int:
    """``params.seed`` (the service stores one in every new batch), else a seed derived from the batch id
    (batches created before it did; stable across retries)."""
    seed = params.get("seed")
    return int(seed) if seed is not None else zlib.crc32(batch_id.encode()) & 0x7FFFFFFF


def head_config(pool: Pool) -> HeadConfig:
    """The pool's head: ``kind`` and any extra HeadConfig fields stored with it."""
    extra = {k: v for k, v in (pool.head or {}).items() if k not in ("input_dim", "n_outputs", "task")}
    return HeadConfig.from_dict(
        {"input_dim": int(pool.embedding_dim), "n_outputs": int(pool.n_outputs), "task": pool.task, **extra}
    )


def _batch_spec(batch: Batch, attempt: int, now: datetime) -> _BatchSpec:
    return _BatchSpec(
        batch_id=batch.id,
        pool_id=batch.pool_id,
        size=int(batch.size),
        strategy=batch.strategy,
        params=dict(batch.params or {}),
        seed=batch_seed(batch.id, dict(batch.params or {})),
        attempt=attempt,
        queued_for=(now - batch.created_at).total_seconds(),
    )


def _after_batch(batch_id: str) -> None:
    """Once the batch's outcome is committed: outgoing webhooks (a connected pool's batch was pushed to its
    annotation platforms before it succeeded). Their failures are recorded on the deliveries, never on the run."""
    try:
        webhooks.batch_finished(batch_id)
    except Exception:
        log.exception("batch %s: outgoing webhooks failed", batch_id)


# --------------------------------------------------------------------------------------------------
# Annotation platforms around a batch (order of work: reconcile, train, select, store, push, succeeded,
# webhook)
# --------------------------------------------------------------------------------------------------


def _platforms_before(spec: _BatchSpec, tracker: Tracker) -> list[str]:
    """Reconcile the pool's integrations first (bounded), so selection sees every label."""
    with session_scope(tracker.factory) as s:
        if not annotation.has_integrations(s, spec.pool_id):
            return []
    tracker.stage("reconcile")
    warnings = annotation.before_batch(spec.pool_id, context.env().settings.labelstudio_reconcile_budget_seconds)
    for w in warnings:
        log.warning("batch %s: %s; selecting with the labels we have", spec.batch_id, w)
    return warnings


def _hold_for_delivery(s: Session, pool_id: str) -> dict[str, Any]:
    """Fields that keep a stored batch ``running`` (stage ``push``) until its annotation platforms have it."""
    if not annotation.has_integrations(s, pool_id):
        return {}
    return {"status": "running", "progress_stage": "push", "finished_at": None}


def _platforms_deliver(spec: _BatchSpec, factory: sessionmaker[Session], warnings: list[str]) -> None:
    """Push a stored batch into the pool's annotation platforms, then mark it ``succeeded``
    (a failed push leaves it succeeded with ``delivery: failed``, see the retry endpoint)."""
    with session_scope(factory) as s:
        batch = store.get_batch_by_id(s, spec.batch_id)
        if batch is None or batch.status != "running" or batch.progress_stage != "push":
            return
    outcome = annotation.deliver(spec.batch_id)
    with session_scope(factory) as s:
        batch = store.get_batch_by_id(s, spec.batch_id)
        if batch is None:
            raise Stopped(spec.batch_id)
        diagnostics = dict(batch.diagnostics or {})
        if warnings:
            diagnostics["labelstudio_warnings"] = warnings
        now = utcnow()
        done = {"status": "succeeded", "progress_stage": "done", "finished_at": now, "heartbeat_at": now}
        values = {**done, "diagnostics": diagnostics}
        if not finish_attempt(s, Batch, spec.batch_id, spec.attempt, values, outcome="succeeded"):
            raise Stopped(spec.batch_id)
    log.info("batch %s: delivery to annotation platforms %s", spec.batch_id, outcome)


def _fail_batch(factory: sessionmaker[Session], batch_id: str, attempt: int, message: str) -> None:
    with session_scope(factory) as s:
        batch = store.get_batch_by_id(s, batch_id, for_update=True)
        if batch is None or batch.status != "running" or batch.attempts != attempt:
            return
        now = utcnow()
        batch.status = "failed"
        batch.error = message
        batch.finished_at = now
        close_running(batch, "failed", message, now)
        store.release_reservations(s, batch_id, now)


@dataclass(frozen=True)
class _Loaded:
    """What the load step read: the pool's arrays and what the later steps need of the pool row."""

    data: PoolArrays
    config: HeadConfig
    task: str
    classes: list[str] | None
    needs_model: bool


@dataclass
class _Model:
    """What the strategy reads (the pool's embeddings, or the head's features and probabilities) and the
    trained head with its validation scores (None when the strategy needs no model)."""

    features: Any
    probs: Any = None
    trained: TrainedHead | None = None
    assessed: quality.Quality | None = None


def _run_batch(
    spec: _BatchSpec,
    factory: sessionmaker[Session],
    tracker: Tracker,
    device: str,
    ttl_s: int,
    engine: dict[str, Any],
) -> None:
    """The steps of a batch in the job's process: load, (cold start?), train + embed + validate, then select
    and store. ``engine`` says where it runs and why (``{"engine": "local", ...}``), for its diagnostics."""
    timings: dict[str, float] = {"queued": spec.queued_for}
    t0 = time.perf_counter()
    loaded = _load(spec, factory, tracker)
    timings["load"] = time.perf_counter() - t0

    strategy, cold = cold_start_choice(spec.strategy, spec.params, loaded.task, loaded.classes, loaded.data)
    if cold is not None:
        log.info("batch %s: cold start (%s): %s instead of %s", spec.batch_id, cold.rule, strategy, spec.strategy)
    # auto plays the model-free arms while the pool is cold (the same rule), and needs a model otherwise
    auto_cold = steering.auto_cold(loaded.task, loaded.classes, loaded.data) if strategy == "auto" else None
    model = _Model(features=selection_inputs(loaded.data, loaded.needs_model))
    if strategy == "auto":
        if auto_cold is None:
            model = _train_embed_validate(spec, factory, tracker, loaded, device, timings)
    elif selection.STRATEGIES[strategy].inputs and strategy not in coldstart.MODEL_FREE:
        model = _train_embed_validate(spec, factory, tracker, loaded, device, timings)
    # else: the strategy reads no model output (random; typiclust and kmeanspp, which read the pool's own
    # embeddings, and a cold start): no head is trained, no checkpoint stored.

    skip = ("seed", coldstart.PARAM, EXCLUDE_OUTLIERS)
    params = {} if cold is not None else {k: v for k, v in spec.params.items() if k not in skip}
    if strategy == "auto":
        params["cold"] = auto_cold is not None  # the history is read under the selection lock
        # the outliers are left out (or only flagged) by the one check every strategy gets here, on the pool's own
        # embeddings (steering.select_checked, on by default for auto): the library's auto must not check again
        params[EXCLUDE_OUTLIERS] = False
    chosen: dict[str, Any] = {"strategy_requested": spec.strategy, "strategy_used": strategy, "cold_start": None}
    chosen.update(engine)  # where the batch ran (worker/batch_job.py chose)
    if cold is not None:
        chosen.update(cold_start=cold.as_dict(), note=coldstart.note(spec.strategy, strategy, cold))
    if auto_cold is not None:
        chosen.update(cold_start=auto_cold.as_dict())
    _select_and_store(spec, factory, tracker, loaded, model, (strategy, params, chosen), device, ttl_s, timings, t0)


def _load(spec: _BatchSpec, factory: sessionmaker[Session], tracker: Tracker) -> _Loaded:
    """Load the pool: from the worker's pool cache when it has one (memory-mapped, refreshed from the rows that
    changed); a strategy that reads no embeddings (random) loads ids only."""
    # the outlier check reads the pool's embeddings too (a random batch loads them only to exclude outliers)
    needs_model = bool(selection.STRATEGIES[spec.strategy].inputs) or excludes_outliers(spec.strategy, spec.params)
    with session_scope(factory) as s:
        pool = s.get(Pool, spec.pool_id)
        if pool is None:
            raise Stopped(spec.batch_id)
        config = head_config(pool)
        task = pool.task
        classes = list(pool.classes or []) if task == "classification" else None
        settings = context.env().settings
        if needs_model:  # the api refused what does not fit before 202; this catches what still runs here
            why = pool_size.refusal(
                settings, store.count_items(s, pool.id), int(pool.embedding_dim), spec.strategy, local=True
            )
            if why is not None:
                raise PoolDataError(why)
        cache = pool_cache.for_settings(settings)
        data = load_pool(s, pool, utcnow(), progress=tracker.callback, cache=cache, embeddings=needs_model)
    tracker.write(data.n, data.n)
    return _Loaded(data=data, config=config, task=task, classes=classes, needs_model=needs_model)


def _train_embed_validate(
    spec: _BatchSpec,
    factory: sessionmaker[Session],
    tracker: Tracker,
    loaded: _Loaded,
    device: str,
    timings: dict[str, float],
) -> _Model:
    """Train the head from scratch on the labeled rows (seeded per batch), embed every row with it (BAIT's
    embedding is its penultimate layer), and score it on the labeled validation items."""
    data = loaded.data
    # small ops on BAIT_JOB_THREADS torch threads (worker/threads.py: the OpenMP pool only slows them)
    with threads.torch_threads(context.env().settings.job_threads):
        t = time.perf_counter()
        tracker.stage("train", 0, loaded.config.max_epochs)
        trained = train_head(
            loaded.config, data.X[data.labeled], data.y, device=device, seed=spec.seed, progress=tracker.callback
        )
        timings["train"] = time.perf_counter() - t

        t = time.perf_counter()
        tracker.stage("embed", 0, data.n)
        out = head_predict(trained, data.X)
        probs = out.probs if loaded.task == "classification" else None
        tracker.write(data.n, data.n)
        timings["embed"] = time.perf_counter() - t

        t = time.perf_counter()
        assessed = quality.assess(factory, spec.pool_id, trained, loaded.classes)
        timings["validate"] = time.perf_counter() - t
    return _Model(features=out.features, probs=probs, trained=trained, assessed=assessed)


def _select_and_store(
    spec: _BatchSpec,
    factory: sessionmaker[Session],
    tracker: Tracker,
    loaded: _Loaded,
    model: _Model,
    plan: tuple[str, dict[str, Any], dict[str, Any]],
    device: str,
    ttl_s: int,
    timings: dict[str, float],
    t0: float,
) -> None:
    """Select and reserve under the pool's selection lock, in one transaction: read the design as it is now
    (labels and reservations committed since the load), select around it, reserve, commit. The next batch
    on the pool selects only after that commit, so a batch runs its selection once. ``plan`` is the
    strategy that runs, its parameters, and what the diagnostics say about the choice."""
    strategy, params, chosen = plan
    data = loaded.data
    timings.update(lock_wait=0.0, select=0.0, store=0.0)
    for run in range(1, RESERVE_ATTEMPTS + 1):
        t = time.perf_counter()
        # The strategy reports its own total (BAIT: setup chunks + forward and backward steps): announce the
        # stage with an unknown total (0) rather than a guess that the first report would contradict.
        tracker.stage("select", 0, 0)
        try:
            with pool_selection_lock(spec.pool_id, tracker), session_scope(factory) as s:
                wait_for_selection_lock(s, spec.pool_id, tracker)
                timings["lock_wait"] += time.perf_counter() - t
                t = time.perf_counter()
                labeled_now, reserved_now = current_design(s, spec.pool_id, data.item_ids, utcnow())
                # New labels since training are not trained on; they count as in the design (reserved).
                reserved = np.setdiff1d(np.union1d(reserved_now, labeled_now), data.labeled)
                run_params = dict(params)
                if strategy == "auto":
                    run_params["history"] = steering.build_history(s, spec.batch_id, spec.pool_id, data)

                run_select = functools.partial(
                    selection.select,
                    strategy,
                    batch_size=spec.size,
                    task=loaded.task,
                    seed=spec.seed,
                    device=device,
                    progress=tracker.callback,
                    **run_params,
                )
                result, outliers = steering.select_checked(
                    run_select,
                    features=model.features,
                    probs=model.probs,
                    raw=data.X if loaded.needs_model else None,
                    labeled=data.labeled,
                    reserved=reserved,
                    external_ids=data.external_ids,
                    exclude=excludes_outliers(spec.strategy, spec.params),
                    seed=spec.seed,
                    row_ids=data.item_ids,
                )
                timings["select"] += time.perf_counter() - t
                noted = {**chosen, "outliers": outliers}
                auto = result.diagnostics.pop("auto", None)
                if auto is not None:
                    score = None if model.assessed is None else model.assessed.validation
                    auto["round"].update(
                        validation=steering.validation_score(score, loaded.task), n_labels=int(data.labeled.shape[0])
                    )
                    noted.update(auto=auto, strategy_used=auto["arm"])
                if model.assessed is not None and model.trained is not None:
                    t = time.perf_counter()
                    with threads.torch_threads(context.env().settings.job_threads):
                        quality.draw_map(
                            model.assessed,
                            model.trained,
                            model.features,
                            model.probs,
                            data,
                            result.indices,
                            loaded.classes,
                            spec.seed,
                        )
                    timings["map"] = time.perf_counter() - t
                t = time.perf_counter()
                tracker.stage("store", 0, spec.size)
                _store_batch(
                    s,
                    spec,
                    data,
                    model.trained,
                    result,
                    timings,
                    run,
                    ttl_s,
                    (t0, t),
                    int(reserved.shape[0]),
                    model.assessed,
                    noted,
                )
            return
        except ReservationConflict:
            # Only where the lock cannot reach: SQLite shared by several worker processes.
            timings["store"] += time.perf_counter() - t
            log.info("batch %s: chosen items were taken concurrently; selecting again", spec.batch_id)
    raise RuntimeError(
        f"could not reserve a batch after {RESERVE_ATTEMPTS} selections: "
        "concurrent batches kept taking the chosen items"
    )


def selection_inputs(data: PoolArrays, needs_model: bool) -> Any:
    """The embeddings handed to the strategy: the pool's, or for a strategy that reads none (random, which
    counts rows only) one column of zeros, so its validation does not scan an ``n x d`` matrix."""
    return data.X if needs_model else np.zeros((data.n, 1), dtype=np.float32)


def cold_start_choice(
    requested: str, params: dict[str, Any], task: str, classes: list[str] | None, data: PoolArrays
) -> tuple[str, coldstart.ColdStart | None]:
    """The strategy a batch runs: the requested one, or the cold-start strategy when the requested one needs a
    model, the pool has too few labels for one (:func:`service.domain.coldstart.decide`) and the request did not
    opt out with ``params.cold_start = false``."""
    if params.get(coldstart.PARAM) is False or not coldstart.is_model_based(selection.STRATEGIES[requested].inputs):
        return requested, None
    decision = steering.auto_cold(task, classes, data)  # the one rule: auto is cold exactly when this fires
    return (requested, None) if decision is None else (coldstart.COLD_START_STRATEGY[task], decision)


_POOL_LOCKS: dict[str, threading.Lock] = {}
_POOL_LOCKS_GUARD = threading.Lock()


@contextmanager
def pool_selection_lock(pool_id: str, tracker: Tracker) -> Iterator[None]:
    """One selection at a time per pool in this process (all SQLite has: one process, one writer),
    held until the reservation is committed. Waiting is a cancellation point."""
    with _POOL_LOCKS_GUARD:
        lock = _POOL_LOCKS.setdefault(pool_id, threading.Lock())
    while not lock.acquire(timeout=LOCK_POLL_S):
        tracker.check()
    try:
        yield
    finally:
        lock.release()


def wait_for_selection_lock(s: Session, pool_id: str, tracker: Tracker) -> None:
    """One selection at a time per pool across worker processes: PostgreSQL's advisory lock, held by
    ``s``'s transaction until it commits the reservation (or rolls back; a dead worker's connection
    drops it). Polled, so that a cancelled batch stops waiting."""
    while not store.try_lock_selection(s, pool_id):
        tracker.check()
        time.sleep(LOCK_POLL_S)


def _store_batch(
    s: Session,
    spec: _BatchSpec,
    data: PoolArrays,
    trained: TrainedHead | None,
    result: Any,
    timings: dict[str, float],
    run: int,
    ttl_s: int,
    started: tuple[float, float],
    n_reserved: int,
    assessed: quality.Quality | None = None,
    chosen: dict[str, Any] | None = None,
) -> None:
    """Reserve the chosen items and write checkpoint + result in ``s``'s transaction (all or nothing)."""
    rows = np.asarray(result.indices, dtype=np.int64)
    chosen_ids = data.item_ids[rows]
    weights = None if trained is None else save_checkpoint(trained)
    batch = store.get_batch_by_id(s, spec.batch_id, for_update=True)
    if batch is None or batch.status != "running" or batch.attempts != spec.attempt:
        raise Stopped(spec.batch_id)
    now = utcnow()
    n = store.reserve_items(s, spec.pool_id, spec.batch_id, chosen_ids.tolist(), now, now + timedelta(seconds=ttl_s))
    if n != len(chosen_ids):
        raise ReservationConflict()  # rolls the partial reservation back
    checkpoint = None
    if trained is not None and weights is not None:
        checkpoint = Checkpoint(
            pool_id=spec.pool_id,
            batch_id=spec.batch_id,
            round=store.count_checkpoints(s, spec.pool_id) + 1,
            n_labels=int(data.labeled.shape[0]),
            config=trained.config.to_dict(),
            metrics=dict(trained.metrics),
            validation_metrics=None if assessed is None else jsonable(assessed.validation),
            weights=weights,
            created_at=now,
        )
        s.add(checkpoint)
        s.flush()
        if assessed is not None and assessed.map_json is not None:
            quality_store.put_map(s, checkpoint.id, spec.pool_id, assessed.map_json, assessed.map_points, now)
        task = "regression" if trained.config.task == "regression" else "classification"
        stop_set = None if assessed is None else assessed.stop_set
        stopping.record(s, spec.pool_id, checkpoint.id, checkpoint.round, checkpoint.n_labels, task, stop_set, now)
    end = time.perf_counter()
    timings["store"] += end - started[1]  # without the commit itself
    timings["total"] = end - started[0]
    finished = {
        "item_ids": [data.external_ids[int(r)] for r in rows],
        "objective": result.objective,
        "diagnostics": jsonable(
            {
                # which strategy ran (a cold start replaces a model-based one: see service.domain.coldstart)
                **(chosen or {"strategy_requested": spec.strategy, "strategy_used": spec.strategy, "cold_start": None}),
                "timings": timings,
                "selection": result.diagnostics,
                "head": None if trained is None else dict(trained.metrics),
                "n_pool": data.n,
                "pool_cache": data.cache,
                "n_labeled": int(data.labeled.shape[0]),
                "n_reserved_by_others": n_reserved,
                "selection_runs": run,
                "reselections": run - 1,
                "attempt": spec.attempt,
                "seed": spec.seed,
                # every seed this batch used: the head's initialisation and minibatch order, the strategy's
                "seeds": {"train": None if trained is None else spec.seed, "select": spec.seed},
            }
        ),
        "checkpoint_id": None if checkpoint is None else checkpoint.id,
        "status": "succeeded",
        "progress_stage": "done",
        "progress_done": len(rows),
        "progress_total": len(rows),
        "finished_at": now,
        "heartbeat_at": now,
    }
    hold = _hold_for_delivery(s, spec.pool_id)
    if hold:  # still running (stage push): the attempt ends once the annotation platforms have the batch
        written = write_if_running(s, Batch, spec.batch_id, spec.attempt, {**finished, **hold})
    else:
        written = finish_attempt(s, Batch, spec.batch_id, spec.attempt, finished, outcome="succeeded")
    if not written:
        raise Stopped(spec.batch_id)  # cancelled meanwhile: the reservation and checkpoint roll back

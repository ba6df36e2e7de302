"""Job functions: where the database meets the numerics.

Each job takes ids (JSON), opens its own short transactions, and runs the same way under the
in-process runner and under RQ:

- :func:`run_batch`: load the pool, train a head on the labeled items, embed the pool, select, then
  reserve the chosen items and write the result in one transaction. A pool connected to Label Studio
  reconciles its projects first and pushes the batch before it is marked ``succeeded``.
- :func:`run_select`: the stateless ``POST /v1/select`` job.
- :func:`predict`: class probabilities (or targets) of some items from the pool's latest checkpoint.

A batch job moves ``queued -> running`` with one conditional UPDATE (so a duplicate delivery is a
no-op), refreshes a heartbeat from a side thread while it runs, and checks for cancellation at every
progress write. Every write of a running attempt is conditioned on ``status = 'running'`` and its
attempt number, so a worker presumed dead that wakes up again can never write over a newer attempt.
"""

from __future__ import annotations

import io
import logging
import threading
import time
import traceback
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import numpy as np
import torch
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

import selection
from selection.errors import SelectionError
from selection.heads import HeadConfig, TrainedHead, load_checkpoint, save_checkpoint, train_head
from selection.heads import predict as head_predict
from service.db import session_scope
from service.domain import coldstart
from service.store import batches as store
from service.store import quality as quality_store
from service.store.attempts import close_running, finish_attempt, write_if_running
from service.store.models import Batch, Checkpoint, Pool
from worker import context, pool_cache, quality, threads
from worker.pool_data import PoolArrays, PoolDataError, current_design, load_pool

log = logging.getLogger(__name__)
T = TypeVar("T")

PROGRESS_EVERY_S = 0.5  # at most this often a progress write
RESERVE_ATTEMPTS = 4  # selections tried when concurrent batches keep taking chosen items (SQLite, several processes)
LOCK_POLL_S = 0.2  # a batch waiting for its pool's selection lock checks for cancellation this often


def utcnow() -> datetime:
    return datetime.now(UTC)


def configure(settings: Any) -> None:
    """Runner start hook: importing this module loads the numerics; then point jobs at ``settings`` and warm
    up head training (once per process, unless ``BAIT_WARM_UP=false``)."""
    context.configure(settings)
    if settings.warm_up:
        threads.warm_up(settings.job_threads)


def resolve_device(setting: str) -> str:
    """``auto`` -> ``cuda`` when a GPU is present, else ``cpu``."""
    if setting == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return setting


class Stopped(Exception):
    """The batch is no longer this attempt's to run (cancelled, taken over, or deleted)."""


class ReservationConflict(Exception):
    """A concurrent batch reserved some of the chosen items first."""


def describe_error(exc: BaseException) -> str:
    """Selection and data errors verbatim (they are written for users); others with their type."""
    if isinstance(exc, SelectionError | PoolDataError):
        return str(exc)
    return f"internal error: {type(exc).__name__}: {exc}"


# --------------------------------------------------------------------------------------------------
# Progress, heartbeat and cancellation of a running batch
# --------------------------------------------------------------------------------------------------


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
            except Exception:  # a missed heartbeat is not fatal; the next one may pass
                log.warning("heartbeat of batch %s failed", self.batch_id, exc_info=True)

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


# --------------------------------------------------------------------------------------------------
# Batch job
# --------------------------------------------------------------------------------------------------


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
            warnings = _labelstudio_before(spec, tracker)
            _run_batch(spec, factory, tracker, resolve_device(settings.device), settings.reservation_ttl_seconds)
            _labelstudio_deliver(spec, factory, warnings)
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


def _after_batch(batch_id: str) -> None:
    """Once the batch's outcome is committed: outgoing webhooks (a connected pool's batch was pushed to
    Label Studio before it succeeded). Their failures are recorded on the deliveries, never on the run."""
    from worker import webhooks

    try:
        webhooks.batch_finished(batch_id)
    except Exception:
        log.exception("batch %s: outgoing webhooks failed", batch_id)


# --------------------------------------------------------------------------------------------------
# Label Studio around a batch (order of work: reconcile, train, select, store, push, succeeded, webhook)
# --------------------------------------------------------------------------------------------------


def _labelstudio_before(spec: _BatchSpec, tracker: Tracker) -> list[str]:
    """Reconcile the pool's Label Studio projects first (bounded), so selection sees every label."""
    from worker import labelstudio

    with session_scope(tracker.factory) as s:
        if not labelstudio.has_integrations(s, spec.pool_id):
            return []
    tracker.stage("reconcile")
    warnings = labelstudio.before_batch(spec.pool_id, context.env().settings.labelstudio_reconcile_budget_seconds)
    for w in warnings:
        log.warning("batch %s: %s; selecting with the labels we have", spec.batch_id, w)
    return warnings


def _hold_for_delivery(s: Session, pool_id: str) -> dict[str, Any]:
    """Fields that keep a stored batch ``running`` (stage ``push``) until Label Studio has it."""
    from worker import labelstudio

    if not labelstudio.has_integrations(s, pool_id):
        return {}
    return {"status": "running", "progress_stage": "push", "finished_at": None}


def _labelstudio_deliver(spec: _BatchSpec, factory: sessionmaker[Session], warnings: list[str]) -> None:
    """Push a stored batch into the pool's Label Studio projects, then mark it ``succeeded``
    (a failed push leaves it succeeded with ``delivery: failed``, see the retry endpoint)."""
    from worker import labelstudio

    with session_scope(factory) as s:
        batch = store.get_batch_by_id(s, spec.batch_id)
        if batch is None or batch.status != "running" or batch.progress_stage != "push":
            return
    outcome = labelstudio.deliver(spec.batch_id)
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
    log.info("batch %s: Label Studio delivery %s", spec.batch_id, outcome)


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


def _run_batch(spec: _BatchSpec, factory: sessionmaker[Session], tracker: Tracker, device: str, ttl_s: int) -> None:
    # ---- issue 26 hook: distributed selection (worker/distributed_batch.py). With BAIT_DASK_SCHEDULER set,
    # random/margin/confidence/entropy run on the Dask cluster there (None: done); every other batch runs below,
    # as before, and `engine` ({"engine": "local", ...}) goes into its diagnostics.
    from worker import distributed_batch

    engine = distributed_batch.run(spec, factory, tracker, device, ttl_s)
    if engine is None:
        return
    # ---- end of the issue 26 hook
    timings: dict[str, float] = {"queued": spec.queued_for}
    t0 = time.perf_counter()

    # load: from the worker's pool cache when it has one (memory-mapped, refreshed from the rows that changed);
    # a strategy that reads no embeddings (random) loads ids only
    needs_model = bool(selection.STRATEGIES[spec.strategy].inputs)
    with session_scope(factory) as s:
        pool = s.get(Pool, spec.pool_id)
        if pool is None:
            raise Stopped(spec.batch_id)
        config = head_config(pool)
        task = pool.task
        classes = list(pool.classes or []) if task == "classification" else None
        settings = context.env().settings
        cache = pool_cache.for_settings(settings)
        data = load_pool(s, pool, utcnow(), progress=tracker.callback, cache=cache, embeddings=needs_model)
    tracker.write(data.n, data.n)
    timings["load"] = time.perf_counter() - t0

    strategy, cold = cold_start_choice(spec.strategy, spec.params, task, classes, data)
    if cold is not None:
        log.info("batch %s: cold start (%s): %s instead of %s", spec.batch_id, cold.rule, strategy, spec.strategy)
    trained: TrainedHead | None = None
    assessed: quality.Quality | None = None
    features: Any = selection_inputs(data, needs_model)
    probs: Any = None
    if selection.STRATEGIES[strategy].inputs and strategy not in coldstart.MODEL_FREE:
        # small ops on BAIT_JOB_THREADS torch threads (worker/threads.py: the OpenMP pool only slows them)
        with threads.torch_threads(settings.job_threads):
            # train: from scratch on the labeled rows, seeded per batch
            t = time.perf_counter()
            tracker.stage("train", 0, config.max_epochs)
            trained = train_head(
                config, data.X[data.labeled], data.y, device=device, seed=spec.seed, progress=tracker.callback
            )
            timings["train"] = time.perf_counter() - t

            # embed: penultimate features (BAIT's embedding) and probabilities of every row
            t = time.perf_counter()
            tracker.stage("embed", 0, data.n)
            out = head_predict(trained, data.X)
            features = out.features
            probs = out.probs if task == "classification" else None
            tracker.write(data.n, data.n)
            timings["embed"] = time.perf_counter() - t

            # validate: scores on the labeled validation items, stored with the checkpoint
            t = time.perf_counter()
            assessed = quality.assess(factory, spec.pool_id, trained, classes)
            timings["validate"] = time.perf_counter() - t
    # else: the strategy reads no model output (random; typiclust and kmeanspp, which read the pool's own
    # embeddings, and a cold start): no head is trained, no checkpoint stored.

    # Select and reserve under the pool's selection lock, in one transaction: read the design as it is
    # now (labels and reservations committed since the load), select around it, reserve, commit. The
    # next batch on the pool selects only after that commit, so a batch runs its selection once.
    params = {} if cold is not None else {k: v for k, v in spec.params.items() if k not in ("seed", coldstart.PARAM)}
    chosen: dict[str, Any] = {"strategy_requested": spec.strategy, "strategy_used": strategy, "cold_start": None}
    chosen.update(engine)  # issue 26: where the batch ran
    if cold is not None:
        chosen.update(cold_start=cold.as_dict(), note=coldstart.note(spec.strategy, strategy, cold))
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
                result = selection.select(
                    strategy,
                    embeddings=features,
                    probs=probs,
                    labeled=data.labeled,
                    reserved=reserved,
                    batch_size=spec.size,
                    task=task,
                    seed=spec.seed,
                    device=device,
                    progress=tracker.callback,
                    **params,
                )
                timings["select"] += time.perf_counter() - t
                if assessed is not None and trained is not None:
                    t = time.perf_counter()
                    with threads.torch_threads(settings.job_threads):
                        quality.draw_map(assessed, trained, features, probs, data, result.indices, classes, spec.seed)
                    timings["map"] = time.perf_counter() - t
                t = time.perf_counter()
                tracker.stage("store", 0, spec.size)
                _store_batch(
                    s,
                    spec,
                    data,
                    trained,
                    result,
                    timings,
                    run,
                    ttl_s,
                    (t0, t),
                    int(reserved.shape[0]),
                    assessed,
                    chosen,
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
    counts = None
    if task == "classification":
        counts = np.bincount(data.y.astype(np.int64), minlength=len(classes or [])).tolist()
    decision = coldstart.decide(task, int(data.labeled.shape[0]), counts, classes)
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
            validation_metrics=None if assessed is None else _jsonable(assessed.validation),
            weights=weights,
            created_at=now,
        )
        s.add(checkpoint)
        s.flush()
        if assessed is not None and assessed.map_json is not None:
            quality_store.put_map(s, checkpoint.id, spec.pool_id, assessed.map_json, assessed.map_points, now)
    end = time.perf_counter()
    timings["store"] += end - started[1]  # without the commit itself
    timings["total"] = end - started[0]
    finished = {
        "item_ids": [data.external_ids[int(r)] for r in rows],
        "objective": result.objective,
        "diagnostics": _jsonable(
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
    if hold:  # still running (stage push): the attempt ends once Label Studio has the batch
        written = write_if_running(s, Batch, spec.batch_id, spec.attempt, {**finished, **hold})
    else:
        written = finish_attempt(s, Batch, spec.batch_id, spec.attempt, finished, outcome="succeeded")
    if not written:
        raise Stopped(spec.batch_id)  # cancelled meanwhile: the reservation and checkpoint roll back


def _jsonable(value: Any) -> Any:
    """Diagnostics as JSON primitives (numpy scalars, tuples and non-finite floats converted)."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return _jsonable(value.item())
    if isinstance(value, float) and not np.isfinite(value):
        return None
    if isinstance(value, np.ndarray):
        return _jsonable(value.tolist())
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


# --------------------------------------------------------------------------------------------------
# Stateless select job
# --------------------------------------------------------------------------------------------------


def run_select(job_id: str) -> None:
    """Run a ``POST /v1/select`` job: arrays from the job row, indices back into it."""
    env = context.env()
    factory = env.sessionmaker
    started = start_job(
        factory,
        "select job",
        job_id,
        store.start_select_job,
        lambda s, jid: store.get_select_job(s, None, jid),
        lambda job, attempt, _now: (attempt, dict(job.request), job.arrays or b"", job.strategy),
    )
    if started is None:
        return
    attempt, request, blob, strategy = started
    last = [0.0]

    def progress(done: int, total: int) -> None:
        if time.monotonic() - last[0] >= PROGRESS_EVERY_S:
            last[0] = time.monotonic()
            with session_scope(factory) as s:
                store.select_job_progress(s, job_id, attempt, done, total)

    try:
        with np.load(io.BytesIO(blob), allow_pickle=False) as npz:
            arrays = {name: npz[name] for name in npz.files}
        params = dict(request.get("params") or {})
        seed = params.pop("seed", 0)
        result = selection.select(
            strategy,
            embeddings=arrays["embeddings"],
            probs=arrays.get("probs"),
            labeled=arrays.get("labeled"),
            reserved=arrays.get("reserved"),
            batch_size=int(request["batch_size"]),
            task=request.get("task", "classification"),
            seed=int(seed or 0),
            device=resolve_device(env.settings.device),
            progress=progress,
            **params,
        )
        outcome: dict[str, Any] = {
            "status": "succeeded",
            "result": _jsonable(
                {"indices": result.indices.tolist(), "objective": result.objective, "diagnostics": result.diagnostics}
            ),
            "error": None,
        }
    except Exception as exc:
        if not isinstance(exc, SelectionError):
            log.error("select job %s failed:\n%s", job_id, traceback.format_exc())
        outcome = {"status": "failed", "result": {"error_type": type(exc).__name__}, "error": describe_error(exc)}
    with session_scope(factory) as s:
        job = store.get_select_job(s, None, job_id, for_update=True)
        if job is None or job.status != "running" or job.attempts != attempt:
            return
        job.status = outcome["status"]
        job.result = outcome["result"]
        job.error = outcome["error"]
        job.finished_at = utcnow()
        job.arrays = None  # the inputs are not kept once answered
        if outcome["status"] == "succeeded":
            job.progress_done = job.progress_total = int(request["batch_size"])


# --------------------------------------------------------------------------------------------------
# Predictions
# --------------------------------------------------------------------------------------------------


def predict(pool_id: str, item_ids: list[str]) -> dict[str, Any]:
    """Predictions of the pool's latest checkpoint for ``item_ids`` (external ids, in order).

    Returns:
        ``{"checkpoint_id", "round", "predictions": [{"item_id", "probs": {class: p}, "label"}]}``
        (classification) or ``[{"item_id", "target": [m floats]}]`` (regression).
    """
    env = context.env()
    with session_scope(env.sessionmaker) as s:
        pool = s.get(Pool, pool_id)
        if pool is None:
            raise LookupError(f"pool {pool_id} does not exist")
        checkpoint = store.latest_checkpoint(s, pool_id)
        if checkpoint is None:
            raise LookupError("the pool has no checkpoint yet: request a batch first")
        found = store.items_by_external_id(s, pool_id, item_ids)
        blob = checkpoint.weights
        meta = {"checkpoint_id": checkpoint.id, "round": checkpoint.round}
        classes = list(pool.classes or [])
        task = pool.task
        d = int(pool.embedding_dim)
    missing = [i for i in item_ids if i not in found or found[i][1] is None]
    if missing:
        raise LookupError(f"{len(missing)} item(s) not found or without embedding: {missing[:10]}")
    X = np.frombuffer(bytearray(b"".join(found[i][1] or b"" for i in item_ids)), dtype="<f4").reshape(len(item_ids), d)
    with threads.torch_threads(env.settings.job_threads):
        trained = load_checkpoint(blob, device=resolve_device(env.settings.device))
        out = head_predict(trained, X)
    predictions: list[dict[str, Any]] = []
    if task == "classification":
        assert out.probs is not None
        P = out.probs.double().cpu().numpy()
        for ext, p in zip(item_ids, P, strict=True):
            predictions.append(
                {
                    "item_id": ext,
                    "probs": {c: float(v) for c, v in zip(classes, p, strict=True)},
                    "label": classes[int(p.argmax())],
                }
            )
    else:
        assert out.outputs is not None
        T = out.outputs.double().cpu().numpy()
        predictions = [{"item_id": ext, "target": [float(v) for v in t]} for ext, t in zip(item_ids, T, strict=True)]
    return {**meta, "predictions": predictions}

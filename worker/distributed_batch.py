"""A batch whose pool-wide passes run on the Dask cluster (issue 26): the hook of the batch job.

:func:`run` is called at the start of every batch (one marked call site in the batch job). It returns None when
it ran the batch here (stored, or failed with ``engine_unavailable``), or the engine diagnostics of a batch that
runs in the job's own process as before (``{"engine": "local", ...}``, with the reason when a cluster is
configured).

With ``BAIT_DASK_SCHEDULER`` set and a strategy of :data:`selection.passes.TOP_B_STRATEGIES`:

1. the pool's store version is made sure of (written from the worker's reader when missing: the lazy migration);
2. the head is trained here on the labeled rows only (read by id), exactly as the single-process path trains it;
3. under the pool's selection lock, the design is read as it is now and every shard's top ``B`` is computed on
   the cluster, each Dask worker reading its shard from the store; the merge is the batch, reserved and stored
   by the same code as a single-process batch.

``bait`` runs its pool-wide passes on the cluster (:mod:`worker.distributed_bait`: scores, the pool Fisher's tree
reduction, the gather of the kept and design rows) and the exact greedy here on the gathered rows
(:func:`_select_and_store_bait`); see docs/distributed.md.

The outlier check (:mod:`worker.distributed_outliers`) runs on the cluster too, before the selection lock: the
statistics from the single-process check's sample, read by the shards; with ``exclude_outliers`` a pass over every
shard finds the rows above the cut, which the selection then leaves out of the pool (:func:`_prepare_outliers`).
Without it the picks are checked against the statistics (:func:`_outliers_diagnostics`). ``random`` without
``exclude_outliers`` is not checked, as in the single-process path.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any

import numpy as np
import torch
from sqlalchemy.orm import Session, sessionmaker

import selection
from selection.api import SelectionResult
from selection.bait import DEFAULT_LAM, design_weights
from selection.bait_passes import objective_with_fisher, stratum_weights
from selection.heads import HeadConfig, TrainedHead, predict, save_checkpoint, train_head
from selection.outliers import OutlierStats, row_distances
from service.db import session_scope
from service.domain import coldstart
from service.domain.strategies import EXCLUDE_OUTLIERS, excludes_outliers
from service.store import content as content_store
from service.store.models import Pool
from worker import context, distributed, distributed_bait, distributed_outliers, pool_store, quality, steering, threads
from worker.batch import (
    RESERVE_ATTEMPTS,
    ReservationConflict,
    _BatchSpec,
    _fail_batch,
    _store_batch,
    head_config,
    pool_selection_lock,
    wait_for_selection_lock,
)
from worker.pool_data import PoolArrays, PoolDataError, label_decoder
from worker.runtime import Stopped, Tracker, utcnow

log = logging.getLogger(__name__)


def _design(session: Session, pool: Pool, now: datetime) -> tuple[np.ndarray, list[Any], np.ndarray]:
    """Item ids of the labeled rows (ascending) with their decoded labels, and of the live reservations."""
    decode = label_decoder(pool)
    labeled: list[int] = []
    targets: list[Any] = []
    reserved: list[int] = []
    for iid, status, until, label in content_store.design(session, pool.id):
        if status == "labeled":
            labeled.append(int(iid))
            targets.append(decode(label))
        elif until is not None and until >= now:
            reserved.append(int(iid))
    return np.asarray(labeled, dtype=np.int64), targets, np.asarray(reserved, dtype=np.int64)


def _stored_embeddings(session: Session, pool: Pool, ids: np.ndarray) -> np.ndarray:
    """The embeddings of the rows ``ids`` (item ids), read by id: the labeled rows, the picks."""
    d = int(pool.embedding_dim)
    found = content_store.embeddings_by_id(session, pool.id, ids.tolist())
    X = np.empty((ids.shape[0], d), dtype=np.float32)
    for row, iid in enumerate(ids.tolist()):
        ext, blob = found.get(int(iid), ("?", None))
        if blob is None or len(blob) != 4 * d:
            raise PoolDataError(f"item {ext!r} has no stored embedding of {d} values")
        X[row] = np.frombuffer(blob, dtype="<f4")
    return X


def run(
    spec: _BatchSpec, factory: sessionmaker[Session], tracker: Tracker, device: str, ttl_s: int
) -> dict[str, Any] | None:
    """Run the batch on the cluster when it should (see the module); else the engine note of a local run."""
    settings = context.env().settings
    if not settings.dask_scheduler:
        return {"engine": "local"}
    if spec.strategy == "bait" and "fisher_weights" in spec.params:
        return {"engine": "local", "engine_note": "bait with fisher_weights runs in the worker's process"}
    if not distributed.handles(spec.strategy):
        return {
            "engine": "local",
            "engine_note": f"{spec.strategy} runs in the worker's process; on the Dask cluster so far: "
            + ", ".join(distributed.CLUSTER_STRATEGIES),
        }
    t0 = time.perf_counter()
    timings: dict[str, float] = {"queued": spec.queued_for}
    now = utcnow()
    with session_scope(factory) as s:
        pool = s.get(Pool, spec.pool_id)
        if pool is None:
            raise Stopped(spec.batch_id)
        config = head_config(pool)
        task = pool.task
        classes = list(pool.classes or []) if task == "classification" else None
        labeled_ids, targets, _reserved = _design(s, pool, now)
        y = (
            np.asarray(targets, dtype=np.int64)
            if task == "classification"
            else np.asarray(targets, dtype=np.float32).reshape(len(targets), int(pool.n_outputs))
        )
        needs_model = bool(selection.STRATEGIES[spec.strategy].inputs)
        if needs_model and spec.params.get(coldstart.PARAM) is not False:
            counts = np.bincount(y, minlength=len(classes or [])).tolist() if task == "classification" else None
            cold = coldstart.decide(task, int(labeled_ids.shape[0]), counts, classes)
            if cold is not None:
                return {"engine": "local", "engine_note": f"cold start ({cold.rule}) runs in the worker's process"}
        X_labeled = _stored_embeddings(s, pool, labeled_ids) if needs_model else None

    t = time.perf_counter()
    tracker.stage("connect")
    try:
        client = distributed.connect(settings)
    except distributed.EngineUnavailable as exc:
        if settings.dask_fallback_local:
            log.warning("batch %s: %s; running it in this process (BAIT_DASK_FALLBACK_LOCAL)", spec.batch_id, exc)
            return {"engine": "local", "engine_note": "the Dask scheduler was unreachable (BAIT_DASK_FALLBACK_LOCAL)"}
        log.error("batch %s: %s", spec.batch_id, exc)
        _fail_batch(factory, spec.batch_id, spec.attempt, str(exc))
        return None
    timings["connect"] = time.perf_counter() - t
    try:
        trained, assessed = _train(spec, factory, tracker, device, config, X_labeled, y, classes, timings)
        if spec.strategy == "bait":
            assert trained is not None
            _select_and_store_bait(
                spec, factory, tracker, ttl_s, client, labeled_ids, trained, assessed, t0, timings, device
            )
        else:
            _select_and_store(spec, factory, tracker, ttl_s, client, labeled_ids, trained, assessed, t0, timings)
    except distributed.EngineUnavailable as exc:
        log.error("batch %s: %s", spec.batch_id, exc)
        _fail_batch(factory, spec.batch_id, spec.attempt, str(exc))
    finally:
        client.close(timeout=5)
    return None


def _train(
    spec: _BatchSpec,
    factory: sessionmaker[Session],
    tracker: Tracker,
    device: str,
    config: HeadConfig,
    X_labeled: np.ndarray | None,
    y: np.ndarray,
    classes: list[str] | None,
    timings: dict[str, float],
) -> tuple[TrainedHead | None, quality.Quality | None]:
    """The head, trained as the single-process path trains it (same rows in id order, same seed), and its
    validation scores; None for a strategy that reads no model (random)."""
    if X_labeled is None:
        return None, None
    settings = context.env().settings
    with threads.torch_threads(settings.job_threads):
        t = time.perf_counter()
        tracker.stage("train", 0, config.max_epochs)
        trained = train_head(config, X_labeled, y, device=device, seed=spec.seed, progress=tracker.callback)
        timings["train"] = time.perf_counter() - t
        t = time.perf_counter()
        assessed = quality.assess(factory, spec.pool_id, trained, classes)
        timings["validate"] = time.perf_counter() - t
    return trained, assessed


Chooser = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, list[str], SelectionResult]]
"""``(excluded item ids (the design), dropped item ids (outliers left out of the pool)) -> (picked or gathered item
ids, their external ids, the result)``: a cluster selection run under the pool's selection lock."""


@dataclass
class _Outliers:
    """What the batch's outlier check found before the selection: the statistics (None: not checked, a ``random``
    batch without ``exclude_outliers``), the flagged rows of the whole store version (``exclude_outliers`` only)
    and what the passes did."""

    exclude: bool
    stats: OutlierStats | None = None
    flagged: distributed_outliers.Flagged | None = None
    passes: dict[str, Any] = field(default_factory=dict)

    def dropped(self, excluded: np.ndarray) -> np.ndarray:
        """The flagged rows left out of the pool: all but the design's (labeled and reserved rows stay)."""
        if self.flagged is None:
            return np.zeros(0, dtype=np.int64)
        return np.setdiff1d(self.flagged.ids, excluded)


def _prepare_outliers(
    spec: _BatchSpec, client: Any, manifest: pool_store.Manifest, tracker: Tracker, timings: dict[str, float]
) -> _Outliers:
    """The outlier check's cluster passes (see the module): the sample and its statistics, and with
    ``exclude_outliers`` the rows of the whole pool above the cut."""
    exclude = excludes_outliers(spec.strategy, spec.params)
    if spec.strategy == "random" and not exclude:  # reads no embeddings: not checked, as in the worker's process
        return _Outliers(exclude=False)
    settings = context.env().settings
    lost_after_s = float(settings.dask_connect_timeout_seconds)
    t = time.perf_counter()
    tracker.stage("outliers", 0, 0)

    def cluster_pass(fn: Any, arg: Any) -> Any:
        """One outlier pass over the store's shards, rerun when the cluster lost its inputs."""
        return distributed.rerun_when_inputs_lost(
            partial(
                fn, client, manifest, arg, check=tracker.check, progress=tracker.callback, lost_after_s=lost_after_s
            )
        )

    sampled = cluster_pass(distributed_outliers.pool_stats, spec.seed)
    out = _Outliers(exclude=exclude, stats=sampled.stats, passes={"sample": sampled.diagnostics})
    if exclude:
        out.flagged = cluster_pass(distributed_outliers.flag_pool, sampled.stats)
        out.passes["flag"] = out.flagged.diagnostics
    timings["outliers"] = time.perf_counter() - t
    return out


def _outliers_diagnostics(
    s: Session,
    pool: Pool,
    outliers: _Outliers,
    dropped: np.ndarray,
    picks: tuple[np.ndarray, list[str]],
    n_pool: int,
) -> dict[str, Any]:
    """``diagnostics.outliers`` of a cluster batch, with the keys the single-process check writes
    (:func:`worker.steering.select_checked`): the picks (item ids, in pick order) checked against the statistics
    (their embeddings read by id), or with ``exclude_outliers`` what was left out."""
    stats = outliers.stats
    if stats is None:
        return dict(steering.NOT_CHECKED)
    if outliers.exclude:
        flagged = outliers.flagged
        assert flagged is not None
        name_of = dict(zip(flagged.ids.tolist(), flagged.external_ids, strict=True))
        return {
            **stats.summary(n_pool, int(flagged.ids.shape[0])),
            "checked": True,
            "excluded": True,
            "n_excluded": int(dropped.shape[0]),
            "excluded_items": [name_of[int(i)] for i in dropped[:100]],
            "items": [],
        }
    ids, names = picks
    dist = row_distances(_stored_embeddings(s, pool, ids), stats)
    hit = stats.flagged(dist)
    items = [{"item_id": names[int(j)], "distance": float(dist[j])} for j in np.flatnonzero(hit)]
    return {**stats.summary(int(ids.shape[0]), int(hit.sum())), "checked": True, "excluded": False, "items": items}


def _ensure_store(
    spec: _BatchSpec, factory: sessionmaker[Session], tracker: Tracker, timings: dict[str, float]
) -> tuple[pool_store.Manifest, str]:
    """The pool store's version of the pool as it is now (written first when missing)."""
    settings = context.env().settings
    t = time.perf_counter()
    tracker.stage("store", 0, 0)
    with session_scope(factory) as s:
        pool = s.get(Pool, spec.pool_id)
        if pool is None:
            raise Stopped(spec.batch_id)
        manifest, store_how = pool_store.ensure_version(s, settings, pool, tracker.callback)
    timings["pool_store"] = time.perf_counter() - t
    return manifest, store_how


def _reserve_and_store(
    spec: _BatchSpec,
    factory: sessionmaker[Session],
    tracker: Tracker,
    ttl_s: int,
    labeled_ids: np.ndarray,
    trained: TrainedHead | None,
    assessed: quality.Quality | None,
    t0: float,
    timings: dict[str, float],
    store: tuple[pool_store.Manifest, str],
    select_total: int,
    choose: Chooser,
    outliers: _Outliers,
) -> None:
    """Under the pool's selection lock: read the design as it is now, ``choose`` on the cluster (without the flagged
    rows outside the design, with ``exclude_outliers``), check the picks for outliers, reserve and store the batch
    with the single-process code; again when the chosen items were taken concurrently."""
    manifest, store_how = store
    chosen = {"strategy_requested": spec.strategy, "strategy_used": spec.strategy, "cold_start": None, "engine": "dask"}
    timings.update(lock_wait=0.0, select=0.0, store=0.0)
    for run in range(1, RESERVE_ATTEMPTS + 1):
        t = time.perf_counter()
        tracker.stage("select", 0, select_total)
        try:
            with pool_selection_lock(spec.pool_id, tracker), session_scope(factory) as s:
                wait_for_selection_lock(s, spec.pool_id, tracker)
                timings["lock_wait"] += time.perf_counter() - t
                t = time.perf_counter()
                pool = s.get(Pool, spec.pool_id)
                if pool is None:
                    raise Stopped(spec.batch_id)
                labeled_now, _targets, reserved_now = _design(s, pool, utcnow())
                # as the single-process path: rows labeled since training count as in the design (never picked)
                excluded = np.union1d(np.union1d(labeled_now, reserved_now), labeled_ids)
                dropped = outliers.dropped(excluded)
                ids, external_ids, result = choose(excluded, dropped)
                rows = np.asarray(result.indices, dtype=np.int64)
                picks = (ids[rows], [external_ids[int(r)] for r in rows])
                noted = {**chosen, "outliers": _outliers_diagnostics(s, pool, outliers, dropped, picks, manifest.rows)}
                if outliers.passes:
                    result.diagnostics["outlier_passes"] = outliers.passes
                timings["select"] += time.perf_counter() - t
                t = time.perf_counter()
                tracker.stage("store", 0, spec.size)
                data = _store_view(ids, external_ids, manifest, labeled_ids, reserved_now, store_how)
                n_others = int(np.setdiff1d(excluded, labeled_ids).shape[0])
                _store_batch(s, spec, data, trained, result, timings, run, ttl_s, (t0, t), n_others, assessed, noted)
            return
        except ReservationConflict:
            timings["store"] += time.perf_counter() - t
            log.info("batch %s: chosen items were taken concurrently; selecting again", spec.batch_id)
    raise RuntimeError(
        f"could not reserve a batch after {RESERVE_ATTEMPTS} selections: "
        "concurrent batches kept taking the chosen items"
    )


def _select_and_store(
    spec: _BatchSpec,
    factory: sessionmaker[Session],
    tracker: Tracker,
    ttl_s: int,
    client: Any,
    labeled_ids: np.ndarray,
    trained: TrainedHead | None,
    assessed: quality.Quality | None,
    t0: float,
    timings: dict[str, float],
) -> None:
    """A top-``B`` strategy (random, margin, confidence, entropy) wholly on the cluster."""
    settings = context.env().settings
    store = _ensure_store(spec, factory, tracker, timings)
    manifest = store[0]
    outliers = _prepare_outliers(spec, client, manifest, tracker, timings)
    head_blob = None if trained is None else save_checkpoint(trained)

    def choose(excluded: np.ndarray, dropped: np.ndarray) -> tuple[np.ndarray, list[str], SelectionResult]:
        picks = distributed.rerun_when_inputs_lost(
            partial(
                distributed.select_top,
                client,
                manifest,
                spec.strategy,
                spec.size,
                # never candidates; for random, every row still draws its key (the sample does not move)
                np.union1d(excluded, dropped),
                head_blob,
                spec.seed,
                check=tracker.check,
                progress=tracker.callback,
                lost_after_s=float(settings.dask_connect_timeout_seconds),
            )
        )
        result = SelectionResult(
            indices=np.arange(picks.ids.shape[0], dtype=np.int64),
            objective=None,
            diagnostics={
                **picks.diagnostics,
                "strategy": spec.strategy,
                "batch_size": spec.size,
                "seed": spec.seed,
                "score_first": float(picks.scores[0]) if picks.scores.size else None,
                "score_last": float(picks.scores[-1]) if picks.scores.size else None,
            },
        )
        return picks.ids, picks.external_ids, result

    _reserve_and_store(
        spec,
        factory,
        tracker,
        ttl_s,
        labeled_ids,
        trained,
        assessed,
        t0,
        timings,
        store,
        len(manifest.shards),
        choose,
        outliers,
    )


def _store_view(
    ids: np.ndarray,
    external_ids: list[str],
    manifest: pool_store.Manifest,
    labeled_ids: np.ndarray,
    reserved_now: np.ndarray,
    store_how: str,
) -> PoolArrays:
    """The batch's view of the pool: only the rows the job received (the picks, or the gathered rows; the pool's
    rows stay in the store). ``X`` has the store version's row count and no columns, so n_pool reads it."""
    return PoolArrays(
        item_ids=ids,
        external_ids=external_ids,
        X=np.empty((manifest.rows, 0), dtype=np.float32),
        labeled=labeled_ids,
        y=np.empty(0),
        reserved=reserved_now,
        cache={"how": "pool_store", "store": store_how, "version": manifest.version},
    )


def _select_and_store_bait(
    spec: _BatchSpec,
    factory: sessionmaker[Session],
    tracker: Tracker,
    ttl_s: int,
    client: Any,
    labeled_ids: np.ndarray,
    trained: TrainedHead,
    assessed: quality.Quality | None,
    t0: float,
    timings: dict[str, float],
    device: str,
) -> None:
    """BAIT with its pool-wide passes on the cluster (:mod:`worker.distributed_bait`) and the greedy here, on the
    gathered rows, with the single-process code (:func:`selection.select`)."""
    settings = context.env().settings
    store = _ensure_store(spec, factory, tracker, timings)
    manifest = store[0]
    outliers = _prepare_outliers(spec, client, manifest, tracker, timings)
    head_blob = save_checkpoint(trained)
    task = trained.config.task
    probe = predict(trained, np.zeros((1, manifest.d), dtype=np.float32)).features
    d_pen, sel_dtype = int(probe.shape[1]), probe.dtype  # the greedy runs in the head's features' dtype
    r = 1 if task == "regression" else int(trained.config.n_outputs) - 1
    params = {k: v for k, v in spec.params.items() if k not in ("seed", coldstart.PARAM, EXCLUDE_OUTLIERS)}

    def choose(excluded: np.ndarray, dropped: np.ndarray) -> tuple[np.ndarray, list[str], SelectionResult]:
        workers = len(client.scheduler_info(n_workers=-1).get("workers", {}))
        n_pool = manifest.rows - int(dropped.shape[0])  # the dropped rows are not in the pool BAIT sees
        prefilter, fisher, why = distributed_bait.plan(
            params,
            task=task,
            n_pool=n_pool,
            n_cand=max(0, n_pool - int(excluded.shape[0])),
            n_design=int(excluded.shape[0]),
            d=d_pen,
            r=r,
            batch_size=spec.size,
            device=device,
            workers=workers,
            dtype=sel_dtype,
        )
        g = distributed.rerun_when_inputs_lost(
            partial(
                distributed_bait.gather_bait,
                client,
                manifest,
                excluded,
                head_blob,
                spec.seed,
                prefilter,
                fisher,
                dropped=dropped,
                check=tracker.check,
                progress=tracker.callback,
                lost_after_s=float(settings.dask_connect_timeout_seconds),
            )
        )
        result = _greedy(spec, tracker, g, labeled_ids, excluded, params, device, why)
        return g.ids, g.external_ids, result

    _reserve_and_store(
        spec, factory, tracker, ttl_s, labeled_ids, trained, assessed, t0, timings, store, 0, choose, outliers
    )


def _greedy(
    spec: _BatchSpec,
    tracker: Tracker,
    g: distributed_bait.Gathered,
    labeled_ids: np.ndarray,
    excluded: np.ndarray,
    params: dict[str, Any],
    device: str,
    why: str,
) -> SelectionResult:
    """Exact BAIT on the gathered rows (indices of the result: rows of ``g``), with the pre-filter's stratified
    Fisher weights, and the exact objective over the whole pool from the reduced pool Fisher when there is one."""
    t = time.perf_counter()
    in_store = excluded[np.isin(excluded, g.ids)]
    labeled = np.searchsorted(g.ids, labeled_ids[np.isin(labeled_ids, g.ids)])
    reserved = np.searchsorted(g.ids, np.setdiff1d(in_store, labeled_ids))
    run_params = dict(params)
    if g.kept is not None:
        run_params.update(prefilter="none", fisher_weights=stratum_weights(g.ids, g.kept))
    with threads.torch_threads(context.env().settings.job_threads):
        result = selection.select(
            "bait",
            embeddings=g.features,
            probs=g.probs,
            labeled=labeled,
            reserved=reserved,
            batch_size=spec.size,
            task="regression" if g.probs is None else "classification",
            seed=spec.seed,
            device=device,
            progress=tracker.callback,
            **run_params,
        )
    diag = result.diagnostics
    diag.pop("params", None)  # the stratum weights: one per gathered row
    diag["params"] = params
    if "forward_indices" in diag:  # rows of the gathered rows, not of the pool: named by item id instead
        diag["forward_item_ids"] = g.ids[np.asarray(diag.pop("forward_indices"), dtype=np.int64)].tolist()
    cluster = dict(g.diagnostics)
    cluster["timings"] = {**cluster["timings"], "greedy": time.perf_counter() - t}
    cluster["plan"] = why
    if g.kept is not None:
        cluster["prefilter"] = {
            "top": int(g.kept.top.shape[0]),
            "random": int(g.kept.random.shape[0]),
            "random_weight": g.kept.weight,
            "n_candidates": g.kept.candidates,
            "random_stratum": "by item id (selection.bait_passes.item_keys)",
        }
    if g.kept is not None and result.objective is not None:
        diag["prefiltered_objective"] = result.objective
        diag["objective_kind"] = "prefiltered"
        if g.fisher_sum is not None:
            t = time.perf_counter()
            lam = float(params.get("lam", DEFAULT_LAM))
            w_design, w_picked = design_weights(
                str(params.get("convention", "reference")), int(labeled.shape[0] + reserved.shape[0]), spec.size
            )
            dtype = torch.float64
            feats = torch.as_tensor(g.features).to(dtype)
            probs = None if g.probs is None else torch.as_tensor(g.probs).to(dtype)
            exact = objective_with_fisher(
                g.fisher_sum,
                g.n_pool,
                feats,
                probs,
                torch.as_tensor(np.union1d(labeled, reserved), dtype=torch.long),
                torch.as_tensor(result.indices, dtype=torch.long),
                lam=lam,
                w_design=w_design,
                w_picked=w_picked,
            )
            diag["exact_objective"] = exact
            diag["objective_kind"] = "exact (pool Fisher: the cluster's tree reduction)"
            result.objective = exact
            cluster["timings"]["objective"] = time.perf_counter() - t
    diag["cluster"] = cluster
    for key in ("engine", "workers", "workers_used", "tasks", "store_version", "bytes_read"):
        diag[key] = cluster[key]
    return result

"""BAIT's pool-wide passes on the Dask cluster (issue 26): the scores pass with the pool Fisher's tree reduction,
and the gather of the kept rows (:mod:`selection.bait_passes`). The greedy runs in the job's process
(:mod:`worker.distributed_batch`).

Every task reads its own shard from the store (tasks carry paths, never arrays). The job's process receives each
shard's short candidate lists, the root of the Fisher reduction (one ``D x D`` matrix) and the rows it asked for:
the kept candidates and the design. Rows ``dropped`` (the outliers ``exclude_outliers`` leaves out) are removed from
each shard as it is read, so every pass sees the pool without them, as the single-process batch does. Tasks are
retried twice, like the top-``B`` strategies' (:mod:`worker.distributed`).
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from distributed import Client, get_worker

from selection.bait import DEFAULT_TIME_BUDGET_S, estimate_bytes
from selection.bait.approx import Prefilter, parse_prefilter
from selection.bait.plan import (
    PREFILTER_MIN_CANDIDATES,
    PREFILTER_MIN_KEEP,
    PREFILTER_TOP_FRACTION,
    estimate_phases,
    estimate_seconds,
)
from selection.bait.threads import resolve_threads
from selection.bait_passes import (
    Kept,
    ShardRows,
    ShardScores,
    ShardSketch,
    above,
    add_fisher,
    keep_ladder,
    merge_scores,
    shard_rows,
    shard_scores,
    sketch_of,
    split_keep,
    thresholds,
)
from selection.calibrate import machine_rates
from selection.heads import load_checkpoint
from worker import pool_store
from worker.distributed import TASK_RETRIES, Check, Progress, wait_all


def _worker_name() -> str:
    try:
        return str(get_worker().address)
    except ValueError:  # run outside a worker (tests of the task itself)
        return "local"


def read_kept(shard: pool_store.Shard, dropped: np.ndarray | None) -> tuple[np.ndarray, list[str], np.ndarray, int]:
    """A shard's rows (:func:`worker.pool_store.read_shard`) without those whose item ids are in ``dropped``."""
    ids, external_ids, X, nbytes = pool_store.read_shard(shard)
    if dropped is not None and dropped.size:
        keep = ~np.isin(ids, dropped)
        if not keep.all():
            ids, X = ids[keep], X[keep]
            external_ids = [e for e, k in zip(external_ids, keep.tolist(), strict=True) if k]
    return ids, external_ids, X, nbytes


def scores_task(
    shard: pool_store.Shard,
    excluded: np.ndarray,
    head_blob: bytes,
    prefilter: dict[str, Any],
    seed: int,
    fisher: bool,
    dropped: np.ndarray | None = None,
) -> dict[str, Any]:
    """One Dask task of the scores pass: read the shard (without ``dropped``), run
    :func:`selection.bait_passes.shard_scores`."""
    t0 = time.perf_counter()
    ids, _external, X, nbytes = read_kept(shard, dropped)
    t1 = time.perf_counter()
    head = load_checkpoint(head_blob, device="cpu")
    part = shard_scores(ids, excluded, X, head, Prefilter(**prefilter), seed, fisher=fisher)
    return {
        "part": part,
        "bytes": nbytes,
        "read_s": t1 - t0,
        "pass_s": time.perf_counter() - t1,
        "worker": _worker_name(),
    }


def summary_of(result: dict[str, Any]) -> dict[str, Any]:
    """A scores task's result as the first round of the bounded merge sends it to the job's process: its
    lists' sketch (:func:`selection.bait_passes.sketch_of`) and its timings, no ids and no Fisher sum."""
    return {**result, "part": sketch_of(result["part"])}


def above_of(result: dict[str, Any], tau: float, kappa: float) -> ShardScores:
    """A scores task's list entries at or past the merge's bounds (the second round of the bounded merge)."""
    return above(result["part"], tau, kappa)


def fisher_of(result: dict[str, Any]) -> np.ndarray:
    """A scores task's Fisher sum (a leaf of the tree reduction)."""
    fmat = result["part"].fisher
    assert fmat is not None
    return np.asarray(fmat)


def rows_task(
    shard: pool_store.Shard, wanted: np.ndarray, head_blob: bytes, dropped: np.ndarray | None = None
) -> dict[str, Any]:
    """One Dask task of the gather: the head's outputs on the shard's rows in ``wanted`` (never a ``dropped`` one)."""
    t0 = time.perf_counter()
    ids, external_ids, X, nbytes = read_kept(shard, dropped)
    t1 = time.perf_counter()
    head = load_checkpoint(head_blob, device="cpu")
    rows = shard_rows(ids, external_ids, X, wanted, head)
    return {
        "rows": rows,
        "bytes": nbytes,
        "read_s": t1 - t0,
        "pass_s": time.perf_counter() - t1,
        "worker": _worker_name(),
    }


@dataclass
class Gathered:
    """The rows the greedy selects from (item ids ascending: the design and the kept candidates), the
    pre-filter's result (None when every candidate was kept), the pool Fisher's sum over every row of the
    pool (None when not reduced), the pool's rows (``n_pool``: without the dropped ones) and the diagnostics of
    the passes."""

    ids: np.ndarray
    external_ids: list[str]
    features: np.ndarray
    probs: np.ndarray | None
    kept: Kept | None
    fisher_sum: np.ndarray | None
    n_pool: int
    diagnostics: dict[str, Any] = field(default_factory=dict)


def _tree(client: Client, leaves: list[Any], run: str) -> tuple[Any, int]:
    """Pairwise sums of futures on the cluster until one is left; the root and the number of tasks."""
    level, tasks, depth = list(leaves), 0, 0
    while len(level) > 1:
        nxt = []
        for i in range(0, len(level), 2):
            if i + 1 < len(level):
                key = f"bait-fisher-{run}-{depth:02d}-{i:05d}"
                nxt.append(client.submit(add_fisher, level[i], level[i + 1], key=key, retries=TASK_RETRIES, pure=False))
                tasks += 1
            else:
                nxt.append(level[i])
        level, depth = nxt, depth + 1
    return level[0], tasks


@dataclass
class _PassLog:
    """What the passes of one batch did: seconds per stage, bytes read per stage, tasks per stage, workers used."""

    timings: dict[str, float] = field(default_factory=dict)
    bytes_read: dict[str, int] = field(default_factory=dict)
    tasks: dict[str, int] = field(default_factory=dict)
    used: set[str] = field(default_factory=set)
    merged: dict[str, int] = field(default_factory=dict)

    def stage(self, name: str, results: list[dict[str, Any]], n_tasks: int) -> None:
        self.timings[f"{name}_read_sum"] = float(sum(r["read_s"] for r in results))
        self.timings[f"{name}_pass_sum"] = float(sum(r["pass_s"] for r in results))
        self.bytes_read[name] = int(sum(int(r["bytes"]) for r in results))
        self.tasks[name] = n_tasks
        self.used.update(str(r["worker"]) for r in results)


def _scores_pass(
    client: Client,
    manifest: pool_store.Manifest,
    inputs: tuple[Any, Any, Any],
    seed: int,
    prefilter: Prefilter,
    fisher: bool,
    run: str,
    log: _PassLog,
    wait: Callable[[list[Any], Progress | None], list[Any]],
    progress: Progress | None,
) -> tuple[Kept, np.ndarray | None]:
    """The scores pass over every shard (with the pool Fisher's tree reduction when ``fisher``), merged."""
    t0 = time.perf_counter()
    excluded_f, head_f, dropped_f = inputs
    spec = {"top": prefilter.top, "random": prefilter.random, "score": prefilter.score, "seed": prefilter.seed}
    futures = [
        client.submit(
            scores_task,
            shard,
            excluded_f,
            head_f,
            spec,
            seed,
            fisher,
            dropped_f,
            key=f"bait-scores-{run}-{i:05d}",
            retries=TASK_RETRIES,
            pure=False,
        )
        for i, shard in enumerate(manifest.shards)
    ]
    summaries = [client.submit(summary_of, f, key=f"bait-summary-{run}-{i:05d}") for i, f in enumerate(futures)]
    root, n_adds = None, 0
    if fisher:
        leaves = [client.submit(fisher_of, f, key=f"bait-leaf-{run}-{i:05d}") for i, f in enumerate(futures)]
        root, n_adds = _tree(client, leaves, run)
    results = wait(summaries, progress)
    log.timings["scores"] = time.perf_counter() - t0
    # the bounded merge: the lists stay on the workers; only the entries past the sketches' bounds travel
    t = time.perf_counter()
    sketches: list[ShardSketch] = [r["part"] for r in results]
    tau, kappa = thresholds(sketches, prefilter)
    sent = [
        client.submit(above_of, f, tau, kappa, key=f"bait-above-{run}-{i:05d}", retries=TASK_RETRIES, pure=False)
        for i, f in enumerate(futures)
    ]
    parts: list[ShardScores] = wait(sent, None)
    del sent
    kept = merge_scores(parts, prefilter)
    log.timings["merge"] = time.perf_counter() - t
    log.merged = {
        "sketch_entries": int(sum(sk.score_marks.shape[0] + sk.key_marks.shape[0] for sk in sketches)),
        "entries_sent": int(sum(p.top_ids.shape[0] + p.key_ids.shape[0] for p in parts)),
        "entries_listed": int(sum(sk.n_top + sk.n_keys for sk in sketches)),
    }
    del parts
    t = time.perf_counter()
    fisher_sum = None if root is None else np.asarray(wait([root], None)[0])
    log.timings["fisher_reduce_wait"] = time.perf_counter() - t
    del futures, summaries, root
    log.stage("scores", results, len(manifest.shards))
    log.tasks["fisher_reduce"] = n_adds
    log.tasks["merge"] = len(manifest.shards)
    return kept, fisher_sum


def _gather_pass(
    client: Client,
    manifest: pool_store.Manifest,
    wanted: np.ndarray | None,
    head_f: Any,
    dropped_f: Any,
    run: str,
    log: _PassLog,
    wait: Callable[[list[Any], Progress | None], list[Any]],
    progress: Progress | None,
) -> list[dict[str, Any]]:
    """The rows ``wanted`` (item ids; None: every row) with the head's features and probabilities, read by the
    shards that hold them."""
    t = time.perf_counter()
    jobs = []
    for i, shard in enumerate(manifest.shards):
        if wanted is None:
            mine = np.arange(shard.first_id, shard.last_id + 1, dtype=np.int64)  # every row of the shard
        else:
            mine = wanted[(wanted >= shard.first_id) & (wanted <= shard.last_id)]
            if not mine.size:
                continue
        key = f"bait-rows-{run}-{i:05d}"
        jobs.append(client.submit(rows_task, shard, mine, head_f, dropped_f, key=key, retries=TASK_RETRIES, pure=False))
    gathered = wait(jobs, progress)
    log.timings["gather"] = time.perf_counter() - t
    log.stage("gather", gathered, len(jobs))
    return gathered


def gather_bait(
    client: Client,
    manifest: pool_store.Manifest,
    excluded: np.ndarray,
    head_blob: bytes,
    seed: int,
    prefilter: Prefilter | None,
    fisher: bool,
    dropped: np.ndarray | None = None,
    check: Check | None = None,
    progress: Progress | None = None,
    lost_after_s: float = 5.0,
) -> Gathered:
    """Run the scores pass (when ``prefilter`` is set; ``fisher``: with the pool Fisher's tree reduction) and the
    gather on the cluster.

    Args:
        client: a connected client.
        manifest: the store version to read.
        excluded: sorted int64 item ids of the design (labeled, reserved); they are gathered too.
        head_blob: the trained head (:func:`selection.heads.save_checkpoint`).
        seed: the batch seed (the random stratum's keys).
        prefilter: the pre-filter, or None to gather every row (the greedy then sees the whole pool).
        fisher: reduce the pool Fisher (with a pre-filter only).
        dropped: sorted int64 item ids left out of the pool (outliers, never design rows): no pass sees them.
        check: called while tasks run; raises to stop.
        progress: ``callback(tasks done, tasks)``.
        lost_after_s: with no worker for this long, the cluster counts as unavailable.

    Raises:
        EngineUnavailable: the scheduler went away, or no worker was left for ``lost_after_s``.
        worker.pool_store.StoreError: a shard cannot be read (after the task's retries).
    """
    t0 = time.perf_counter()
    run = uuid.uuid4().hex[:12]
    excluded = np.ascontiguousarray(excluded, dtype=np.int64)
    excluded_f = client.scatter(excluded, broadcast=True, hash=False)
    head_f = client.scatter(head_blob, broadcast=True, hash=False)
    n_dropped = 0 if dropped is None else int(dropped.shape[0])
    dropped_f = None
    if n_dropped:
        dropped_f = client.scatter(np.ascontiguousarray(dropped, dtype=np.int64), broadcast=True, hash=False)
    log = _PassLog()
    kept: Kept | None = None
    fisher_sum: np.ndarray | None = None

    def wait(futures: list[Any], report: Progress | None) -> list[Any]:
        return wait_all(client, futures, check, report, lost_after_s)

    try:
        wanted = None
        if prefilter is not None:
            inputs = (excluded_f, head_f, dropped_f)
            kept, fisher_sum = _scores_pass(client, manifest, inputs, seed, prefilter, fisher, run, log, wait, progress)
            wanted = np.union1d(excluded, kept.ids)
        gathered = _gather_pass(client, manifest, wanted, head_f, dropped_f, run, log, wait, progress)
    finally:
        for f in (excluded_f, head_f, dropped_f):
            if f is not None:
                f.release()
    parts: list[ShardRows] = sorted((r["rows"] for r in gathered), key=lambda p: int(p.ids[0]) if p.ids.size else -1)
    ids = np.concatenate([p.ids for p in parts])
    order = np.argsort(ids, kind="stable")
    features = np.concatenate([p.features for p in parts])[order]
    probs = None if parts[0].probs is None else np.concatenate([p.probs for p in parts if p.probs is not None])[order]
    external = [e for p in parts for e in p.external_ids]
    diagnostics = {
        "engine": "dask",
        "workers": len(client.scheduler_info(n_workers=-1).get("workers", {})),
        "workers_used": len(log.used),
        "tasks": sum(log.tasks.values()),
        "tasks_per_stage": log.tasks,
        "task_retries": TASK_RETRIES,
        "store_version": manifest.version,
        "rows": manifest.rows,
        "rows_dropped": n_dropped,
        "rows_gathered": int(ids.shape[0]),
        "bytes_read": {**log.bytes_read, "shards": int(sum(log.bytes_read.values()))},
        "timings": {**log.timings, "passes": time.perf_counter() - t0},
    }
    if log.merged:
        diagnostics["merge"] = log.merged
    return Gathered(
        ids=ids[order],
        external_ids=[external[int(i)] for i in order],
        features=features,
        probs=probs,
        kept=kept,
        fisher_sum=fisher_sum,
        n_pool=manifest.rows - n_dropped,
        diagnostics=diagnostics,
    )


#: The pool Fisher's tree reduction serves only the exact objective reported for a pre-filtered batch (the greedy
#: weighs the gathered rows by the pre-filter's strata): it runs when the cost model gives it at most this share of
#: the batch's time budget, spread over the workers. At 0.25, on 10^6 x 128 and 10^6 x 256 pools (k = 10), 2 workers
#: ran it and 1 did not: the scores pass took 22 s against 4 s and 30 s against 7 s, 2 workers slower than 1.
FISHER_OBJECTIVE_SHARE = 0.05


def plan(
    params: dict[str, Any],
    *,
    task: str,
    n_pool: int,
    n_cand: int,
    n_design: int,
    d: int,
    r: int,
    batch_size: int,
    device: str,
    workers: int,
    dtype: torch.dtype = torch.float32,
) -> tuple[Prefilter | None, bool, str]:
    """What the cluster passes do for a BAIT batch with ``params``: the pre-filter (None: gather every row, the
    greedy then plans on the whole pool as the single-process path does), whether to reduce the pool Fisher
    (for the exact objective of a pre-filtered batch over the whole pool), and why.

    An explicit ``prefilter`` is used as given; ``"none"`` or ``approx`` ``"exact"``/``"none"`` keep every
    candidate; ``"auto"`` keeps every candidate when the single-process auto plan would not pre-filter on the
    cluster's behalf (``n_C`` at most :data:`selection.bait.plan.PREFILTER_MIN_CANDIDATES`, or exact BAIT on every
    candidate fits the budgets by the cost model), else the largest of the plan's free halvings ``n_C / 2,
    n_C / 4, ...`` (down to :data:`selection.bait.plan.PREFILTER_MIN_KEEP`) whose exact greedy fits them, split as the
    plan splits it (:data:`selection.bait.plan.PREFILTER_TOP_FRACTION` by score). ``dtype``: the greedy's (the head
    features'), whose rates and sizes the cost model uses, as the single-process plan does.
    """
    spec = parse_prefilter(params.get("prefilter"), regression=task == "regression")
    budget_s = float(params.get("time_budget_s", DEFAULT_TIME_BUDGET_S))
    budget_gb = float(params.get("max_memory_gb", 8.0))
    oversample = float(params.get("oversample", 2))
    dev = torch.device(device)
    if isinstance(spec, Prefilter):
        pf, why = spec, "the batch's prefilter"
    elif spec is None or params.get("approx") in ("exact", "none"):
        pf, why = None, "every candidate (no pre-filter asked)"
    else:
        ladder = keep_ladder(n_cand, PREFILTER_MIN_CANDIDATES, PREFILTER_MIN_KEEP)
        pf, why = None, "every candidate (the auto plan pre-filters no pool this small)"
        if len(ladder) > 1:
            threads = resolve_threads(dev)  # 1 off CPU
            rates = machine_rates(dev, dtype, threads)
            fits = []
            for keep in ladder:
                n_fwd = min(keep, max(batch_size, math.floor(oversample * batch_size + 1e-9)))
                secs = estimate_seconds(
                    n_rows=n_design + keep,
                    n_cand=keep,
                    d=d,
                    r=r,
                    rc=r,
                    n_forward=n_fwd,
                    n_backward=n_fwd - batch_size,
                    n_design=n_design,
                    mode="fisher",
                    device=dev,
                    dtype=dtype,
                    threads=threads,
                    rates=rates,
                )
                mem = estimate_bytes(n_cand=keep, d=d, r=r, matrix_dtype=dtype, state_dtype=dtype, mode="fisher")
                fits.append(secs <= budget_s and mem <= budget_gb * 1e9)
            keep = next((k for k, ok in zip(ladder, fits, strict=True) if ok), ladder[-1])
            if keep == n_cand:
                why = "every candidate (exact BAIT on all of them fits the budgets)"
            else:
                pf = split_keep(keep, PREFILTER_TOP_FRACTION)
                why = f"pre-filtered to {keep} of {n_cand} candidates (the auto plan's largest halving that fits)"
    fisher = False
    if pf is not None:
        big_d = r * d
        secs = estimate_phases(
            n_rows=n_pool,
            n_cand=0,
            d=d,
            r=r,
            rc=r,
            n_forward=0,
            n_backward=0,
            n_design=0,
            mode="fisher",
            device=torch.device("cpu"),
            dtype=torch.float64,
            objective=True,
            threads=1,
        )["objective"]
        fisher = (
            3 * big_d * big_d * 8 <= budget_gb * 1e9 and secs / max(1, workers) <= FISHER_OBJECTIVE_SHARE * budget_s
        )
    return pf, fisher, why

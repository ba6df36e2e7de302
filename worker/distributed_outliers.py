"""The outlier check (:mod:`selection.outliers`) on the Dask cluster: the sample the statistics are computed on,
and the pool-wide pass that finds the rows ``exclude_outliers`` leaves out.

1. **Sample** (:func:`pool_stats`): the rows the single-process check reads, :func:`selection.outliers.sample_positions`
   of the pool's row count and the batch seed, are positions in the store version's row order (item id order, the
   order of the single-process pool). One task per shard that holds some of them reads its shard and returns
   those rows (at most 5,000 rows in all); the job computes the statistics from them
   (:func:`selection.outliers.fit_stats`), in the same order: the same numbers as the single-process check.
2. **Flag** (:func:`flag_pool`, with ``exclude_outliers`` only): one task per shard reads its shard, computes its
   rows' distances under the broadcast statistics (:func:`selection.outliers.row_distances`, a function of the
   row and the statistics only) and returns the ids of the rows above the cut: few.

Tasks carry shards (their paths) and positions, never arrays, and are retried like the selection's
(:mod:`worker.distributed`).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from distributed import Client, get_worker

from selection.outliers import DEFAULT_SAMPLE, OutlierStats, fit_stats, row_distances, sample_positions
from worker import pool_store
from worker.distributed import TASK_RETRIES, Check, Progress, wait_all


def _worker_name() -> str:
    try:
        return str(get_worker().address)
    except ValueError:  # run outside a worker (tests of the task itself)
        return "local"


def sample_task(shard: pool_store.Shard, shard_index: int, positions: np.ndarray) -> dict[str, Any]:
    """One Dask task of the sample: the shard's rows at ``positions`` (row positions within the shard, its delta
    applied)."""
    t0 = time.perf_counter()
    _ids, _external, X, nbytes = pool_store.read_shard(shard)
    return {
        "index": shard_index,
        "rows": np.ascontiguousarray(X[positions]),
        "bytes": nbytes,
        "read_s": time.perf_counter() - t0,
        "worker": _worker_name(),
    }


def flag_task(shard: pool_store.Shard, stats: OutlierStats) -> dict[str, Any]:
    """One Dask task of the flag pass: the shard's rows above the cut (item ids, external ids, distances)."""
    t0 = time.perf_counter()
    ids, external_ids, X, nbytes = pool_store.read_shard(shard)
    t1 = time.perf_counter()
    dist = row_distances(X, stats) if ids.size else np.zeros(0)
    hit = np.flatnonzero(stats.flagged(dist))
    return {
        "ids": ids[hit],
        "external_ids": [external_ids[int(i)] for i in hit],
        "distances": dist[hit],
        "rows": int(ids.shape[0]),
        "bytes": nbytes,
        "read_s": t1 - t0,
        "pass_s": time.perf_counter() - t1,
        "worker": _worker_name(),
    }


@dataclass
class Sampled:
    """The statistics from the sample, and what the sample pass did (``tasks``, ``rows``, ``bytes_read``,
    ``seconds``, ``workers_used``)."""

    stats: OutlierStats
    diagnostics: dict[str, Any] = field(default_factory=dict)


def shard_positions(manifest: pool_store.Manifest, positions: np.ndarray) -> list[tuple[int, np.ndarray]]:
    """``(shard index, positions within that shard)`` for every shard that holds some of the pool-wide row
    ``positions`` (ascending), in shard order."""
    out: list[tuple[int, np.ndarray]] = []
    start = 0
    for i, shard in enumerate(manifest.shards):
        lo, hi = np.searchsorted(positions, [start, start + shard.rows])
        if hi > lo:
            out.append((i, positions[lo:hi] - start))
        start += shard.rows
    return out


def pool_stats(
    client: Client,
    manifest: pool_store.Manifest,
    seed: int,
    *,
    sample: int = DEFAULT_SAMPLE,
    check: Check | None = None,
    progress: Progress | None = None,
    lost_after_s: float = 5.0,
) -> Sampled:
    """The outlier rule's statistics over the store version: the single-process check's sample, read by the shards
    that hold it, and :func:`selection.outliers.fit_stats` here.

    Raises:
        EngineUnavailable: the scheduler went away, or no worker was left for ``lost_after_s``.
        worker.pool_store.StoreError: a shard cannot be read (after the task's retries).
    """
    t0 = time.perf_counter()
    run = uuid.uuid4().hex[:12]
    positions = sample_positions(manifest.rows, sample, seed)
    futures = [
        client.submit(
            sample_task,
            manifest.shards[i],
            i,
            local,
            key=f"bait-outlier-sample-{run}-{i:05d}",
            retries=TASK_RETRIES,
            pure=False,
        )
        for i, local in shard_positions(manifest, positions)
    ]
    results = sorted(wait_all(client, futures, check, progress, lost_after_s), key=lambda r: int(r["index"]))
    S = np.concatenate([r["rows"] for r in results]) if results else np.zeros((0, manifest.d), dtype=np.float32)
    t = time.perf_counter()
    stats = fit_stats(S)
    return Sampled(
        stats=stats,
        diagnostics={
            "tasks": len(futures),
            "rows": int(S.shape[0]),
            "bytes_read": int(sum(int(r["bytes"]) for r in results)),
            "workers_used": len({str(r["worker"]) for r in results}),
            "seconds": time.perf_counter() - t0,
            "fit_s": time.perf_counter() - t,
        },
    )


@dataclass
class Flagged:
    """The rows of the store version above the cut: item ids (ascending), their external ids and distances, and
    what the pass did (``tasks``, ``rows``, ``bytes_read``, ``seconds``, ``workers_used``)."""

    ids: np.ndarray
    external_ids: list[str]
    distances: np.ndarray
    diagnostics: dict[str, Any] = field(default_factory=dict)


def flag_pool(
    client: Client,
    manifest: pool_store.Manifest,
    stats: OutlierStats,
    *,
    check: Check | None = None,
    progress: Progress | None = None,
    lost_after_s: float = 5.0,
) -> Flagged:
    """Every row of the store version above the cut of ``stats`` (one task per shard; the statistics go to every
    worker once).

    Raises:
        EngineUnavailable: the scheduler went away, or no worker was left for ``lost_after_s``.
        worker.pool_store.StoreError: a shard cannot be read (after the task's retries).
    """
    t0 = time.perf_counter()
    run = uuid.uuid4().hex[:12]
    stats_f = client.scatter(stats, broadcast=True, hash=False)
    try:
        futures = [
            client.submit(
                flag_task,
                shard,
                stats_f,
                key=f"bait-outlier-flag-{run}-{i:05d}",
                retries=TASK_RETRIES,
                pure=False,
            )
            for i, shard in enumerate(manifest.shards)
        ]
        results = wait_all(client, futures, check, progress, lost_after_s)
    finally:
        stats_f.release()
    ids = np.concatenate([r["ids"] for r in results]) if results else np.zeros(0, dtype=np.int64)
    dist = np.concatenate([r["distances"] for r in results]) if results else np.zeros(0)
    external = [e for r in results for e in r["external_ids"]]
    order = np.argsort(ids, kind="stable")
    return Flagged(
        ids=ids[order].astype(np.int64, copy=False),
        external_ids=[external[int(i)] for i in order],
        distances=dist[order],
        diagnostics={
            "tasks": len(futures),
            "rows": int(sum(int(r["rows"]) for r in results)),
            "bytes_read": int(sum(int(r["bytes"]) for r in results)),
            "workers_used": len({str(r["worker"]) for r in results}),
            "seconds": time.perf_counter() - t0,
            "pass_sum": float(sum(r["pass_s"] for r in results)),
        },
    )

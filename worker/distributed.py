"""The Dask engine of a distributed selection (issue 26): connect to the operator's scheduler, map a shard pass
(:mod:`selection.passes`) over the pool store's shards, merge the per-shard top ``B``.

Every task reads its own shard from the store (the tasks carry its files' paths, never arrays); the job's process
receives ``B`` ids and scores per shard. Tasks are retried twice (``retries=2``); a task whose worker died is
rescheduled by the scheduler on another worker. The scheduler unreachable, or no worker left for longer than the connect
timeout, raises :class:`EngineUnavailable` at once: a batch never hangs on a missing cluster.

The scheduler's address is operator configuration only (``BAIT_DASK_SCHEDULER``): a Dask scheduler runs whatever
code a client sends it, so no API field can name one, and the address is never written into a batch's
diagnostics (tenants read those).
"""

from __future__ import annotations

import ipaddress
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar
from urllib.parse import urlsplit

import numpy as np
from distributed import Client, get_worker
from distributed.client import FutureCancelledError
from distributed.security import Security

from selection.heads import load_checkpoint
from selection.passes import TOP_B_STRATEGIES, ShardTop, merge_top, shard_top
from worker import pool_store

log = logging.getLogger(__name__)

TASK_RETRIES = 2
POLL_S = 0.5  # the job checks for cancellation (and a lost cluster) this often while tasks run

Check = Callable[[], None]
Progress = Callable[[int, int], None]


class EngineUnavailable(RuntimeError):
    """The Dask cluster cannot run the batch (scheduler unreachable, no workers). The message starts with
    ``engine_unavailable:`` and never names the scheduler's address."""


CLUSTER_STRATEGIES = (*TOP_B_STRATEGIES, "bait")
"""Strategies whose pool-wide passes run on the cluster: the top-``B`` ones wholly, ``bait`` up to the greedy
(:mod:`worker.distributed_bait`). The api's list (:data:`service.catalog.CLUSTER_STRATEGIES`, which refuses other
strategies on pools too large for one process) is the same set (``tests/worker/test_distributed.py`` checks it)."""


def handles(strategy: str) -> bool:
    """Whether a strategy's pool-wide passes run on the cluster (the others run in the job's process)."""
    return strategy in CLUSTER_STRATEGIES


LOST_INPUT_RERUNS = 2


class _HasDiagnostics(Protocol):
    diagnostics: dict[str, Any]


R = TypeVar("R", bound=_HasDiagnostics)


def rerun_when_inputs_lost(run: Callable[[], R]) -> R:
    """``run()`` (a whole cluster pass: scatter, submit, wait), again when the cluster lost its inputs.

    A pass scatters its small shared inputs (the excluded ids, the head) to every worker. Dask's active memory
    manager may then drop all replicas but one, and a worker that dies holding the last one takes them with it:
    the scheduler forgets them, and every task that needs them is cancelled ("already forgotten"), where a task
    that only lost its worker would have been retried. The shard tasks only read, so the pass is run again from
    the start, with its inputs scattered anew, at most :data:`LOST_INPUT_RERUNS` more times; the result's
    diagnostics count the reruns (``pass_reruns``).

    Raises:
        EngineUnavailable: the inputs were lost on every try.
    """
    for attempt in range(LOST_INPUT_RERUNS + 1):
        try:
            result = run()
        except FutureCancelledError as exc:
            if attempt == LOST_INPUT_RERUNS:
                raise EngineUnavailable(
                    f"engine_unavailable: the Dask cluster lost the batch's inputs {attempt + 1} times "
                    "(workers keep dying while it runs)"
                ) from exc
            log.warning("a Dask worker died holding a cluster pass's inputs (%s); running the pass again", exc)
            continue
        result.diagnostics["pass_reruns"] = attempt
        return result
    raise AssertionError("unreachable")


def security(settings: Any) -> Security | None:
    """Mutual TLS with the scheduler when ``BAIT_DASK_TLS_*`` are set (the settings check they come as a set,
    with a ``tls://`` address), else None: plain TCP, for a scheduler on loopback or a private network."""
    if settings.dask_tls_ca_file is None:
        if not _private_address(str(settings.dask_scheduler)):
            log.warning(
                "BAIT_DASK_SCHEDULER is a plain tcp:// address that is not loopback or private: anyone who reaches "
                "a Dask scheduler can run code on the cluster; use tls:// with BAIT_DASK_TLS_* (docs/distributed.md)"
            )
        return None
    return Security(
        tls_ca_file=str(settings.dask_tls_ca_file),
        tls_client_cert=str(settings.dask_tls_cert),
        tls_client_key=str(settings.dask_tls_key),
        require_encryption=True,
    )


def _private_address(address: str) -> bool:
    host = urlsplit(address).hostname or ""
    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:  # a name (a compose service, a private DNS zone): cannot tell from here
        return True
    return ip.is_loopback or ip.is_private


def connect(settings: Any) -> Client:
    """A client of ``settings.dask_scheduler`` (mutual TLS when configured: :func:`security`), waiting at most
    ``dask_connect_timeout_seconds``.

    Raises:
        EngineUnavailable: the scheduler cannot be reached in time, or refuses our certificate.
    """
    timeout = float(settings.dask_connect_timeout_seconds)
    try:
        return Client(settings.dask_scheduler, timeout=timeout, set_as_default=False, security=security(settings))
    except (OSError, TimeoutError) as exc:
        raise EngineUnavailable(
            f"engine_unavailable: the Dask scheduler (BAIT_DASK_SCHEDULER) cannot be reached within {timeout:g} s "
            f"({type(exc).__name__}); ask the operator to start it, or to set BAIT_DASK_FALLBACK_LOCAL=true"
        ) from None


def shard_task(
    shard: pool_store.Shard,
    shard_index: int,
    strategy: str,
    batch_size: int,
    excluded: np.ndarray,
    head_blob: bytes | None,
    seed: int,
) -> dict[str, Any]:
    """One Dask task: read the shard from the store (its full file and delta), run its pass, return its top ``B``
    (ids, scores, external ids) with what it read and how long each stage took."""
    t0 = time.perf_counter()
    ids, external_ids, X, nbytes = pool_store.read_shard(shard, embeddings=strategy != "random")
    t1 = time.perf_counter()
    head = None if head_blob is None else load_checkpoint(head_blob, device="cpu")
    top = shard_top(strategy, ids, excluded, batch_size, X=X, head=head, seed=seed, shard_index=shard_index)
    pos = np.searchsorted(ids, top.ids)
    try:
        worker = get_worker().address
    except ValueError:  # run outside a worker (tests of the task itself)
        worker = "local"
    return {
        "index": shard_index,
        "ids": top.ids,
        "scores": top.scores,
        "external_ids": [external_ids[int(p)] for p in pos],
        "rows": top.rows,
        "candidates": top.candidates,
        "bytes": nbytes,
        "read_s": t1 - t0,
        "pass_s": time.perf_counter() - t1,
        "worker": worker,
    }


@dataclass
class Picks:
    """The merged batch: ``ids`` (item ids, best first), their ``external_ids`` and ``scores``; ``diagnostics``
    names the engine, the workers, the tasks, the bytes read and each stage's seconds."""

    ids: np.ndarray
    external_ids: list[str]
    scores: np.ndarray
    candidates: int
    diagnostics: dict[str, Any] = field(default_factory=dict)


def select_top(
    client: Client,
    manifest: pool_store.Manifest,
    strategy: str,
    batch_size: int,
    excluded: np.ndarray,
    head_blob: bytes | None,
    seed: int,
    check: Check | None = None,
    progress: Progress | None = None,
    lost_after_s: float = 5.0,
) -> Picks:
    """Map :func:`shard_task` over the manifest's shards on the cluster and merge the results.

    Args:
        client: a connected client.
        manifest: the store version to read.
        strategy: one of :data:`selection.passes.TOP_B_STRATEGIES`.
        batch_size: ``B``.
        excluded: sorted int64 item ids never picked (labeled, reserved).
        head_blob: the trained head (:func:`selection.heads.save_checkpoint`), None for ``random``.
        seed: the batch seed.
        check: called while tasks run; raises to stop (cancellation).
        progress: ``callback(shards done, shards)``.
        lost_after_s: with no worker for this long, the cluster counts as unavailable.

    Raises:
        EngineUnavailable: the scheduler went away, or no worker was left for ``lost_after_s``.
        selection.errors.ParameterError: fewer candidates than ``batch_size``.
        worker.pool_store.StoreError: a shard cannot be read (after the task's retries).
    """
    t0 = time.perf_counter()
    run = uuid.uuid4().hex[:12]
    # Small shared inputs go to every worker once, not into every task (a worker that dies leaves the others' copy).
    excluded_f = client.scatter(np.ascontiguousarray(excluded, dtype=np.int64), broadcast=True, hash=False)
    head_f = None if head_blob is None else client.scatter(head_blob, broadcast=True, hash=False)
    futures = [
        client.submit(
            shard_task,
            shard,
            i,
            strategy,
            batch_size,
            excluded_f,
            head_f,
            seed,
            key=f"bait-shard-{run}-{i:05d}",
            retries=TASK_RETRIES,
            pure=False,
        )
        for i, shard in enumerate(manifest.shards)
    ]
    t_submit = time.perf_counter()
    try:
        results = wait_all(client, futures, check, progress, lost_after_s)
    finally:
        for f in (excluded_f, head_f):
            if f is not None:
                f.release()
    t_gather = time.perf_counter()
    parts = [
        ShardTop(ids=r["ids"], scores=r["scores"], rows=r["rows"], candidates=r["candidates"])
        for r in sorted(results, key=lambda r: int(r["index"]))
    ]
    merged = merge_top(strategy, parts, batch_size)
    names = {int(i): e for r in results for i, e in zip(r["ids"].tolist(), r["external_ids"], strict=True)}
    workers = sorted({str(r["worker"]) for r in results})
    t_merge = time.perf_counter()
    return Picks(
        ids=merged.ids,
        external_ids=[names[int(i)] for i in merged.ids],
        scores=merged.scores,
        candidates=merged.candidates,
        diagnostics={
            "engine": "dask",
            "workers": len(client.scheduler_info(n_workers=-1).get("workers", {})),
            "workers_used": len(workers),
            "tasks": len(futures),
            "task_retries": TASK_RETRIES,
            "store_version": manifest.version,
            "rows": merged.rows,
            "n_candidates": merged.candidates,
            "bytes_read": {"shards": int(sum(int(r["bytes"]) for r in results))},
            "timings": {
                "submit": t_submit - t0,
                "shards": t_gather - t_submit,
                "shard_read_sum": float(sum(r["read_s"] for r in results)),
                "shard_pass_sum": float(sum(r["pass_s"] for r in results)),
                "merge": t_merge - t_gather,
            },
        },
    )


def wait_all(
    client: Client,
    futures: list[Any],
    check: Check | None = None,
    progress: Progress | None = None,
    lost_after_s: float = 5.0,
) -> list[Any]:
    """The results of ``futures`` (in completion order), checking for cancellation and a lost cluster while
    they run; on any error every future is cancelled.

    Raises:
        EngineUnavailable: the scheduler went away, or no worker was left for ``lost_after_s``.
    """
    results: list[Any] = []
    no_workers_since: float | None = None
    waiting = list(futures)
    try:
        while waiting:
            finished = [f for f in waiting if f.done()]
            for future in finished:
                results.append(future.result())  # raises the task's error once its retries are spent
            waiting = [f for f in waiting if not f.done() or f not in finished]
            if finished and progress is not None:
                progress(len(results), len(futures))
            if not waiting:
                break
            if check is not None:
                check()
            if client.status not in ("running", "connecting"):
                raise EngineUnavailable("engine_unavailable: the Dask scheduler went away while the batch ran")
            if not client.scheduler_info(n_workers=-1).get("workers"):
                no_workers_since = no_workers_since or time.monotonic()
                if time.monotonic() - no_workers_since > lost_after_s:
                    raise EngineUnavailable(
                        f"engine_unavailable: the Dask cluster has had no worker for {lost_after_s:g} s"
                    )
            else:
                no_workers_since = None
            if not finished:
                time.sleep(POLL_S / 5)
    except BaseException:
        client.cancel(futures, force=True)
        raise
    return results

"""Pools too large for one process (issue 26): a batch whose selection would load the pool into one worker
process is refused when the pool's embeddings exceed ``BAIT_LOCAL_POOL_MAX_BYTES``; strategies whose pool-wide
passes run on the Dask cluster (:data:`service.catalog.CLUSTER_STRATEGIES`, with ``BAIT_DASK_SCHEDULER`` set)
take pools of any size.

The api checks before ``202`` (:func:`check_batch`, from the pool's item count: no pass over the pool); the worker
checks again where a batch would still run in its process (a cold start, a cluster that is not configured any
more), and fails the batch with the same message instead of loading what does not fit (:func:`refusal`).
"""

from __future__ import annotations

from typing import Any

from service import catalog
from service.errors import BadRequest


def runs_on_cluster(settings: Any, strategy: str, params: dict[str, Any]) -> bool:
    """Whether a batch's pool-wide passes run on the Dask cluster."""
    if not settings.dask_scheduler or strategy not in catalog.CLUSTER_STRATEGIES:
        return False
    return not (strategy == "bait" and "fisher_weights" in params)


def refusal(settings: Any, n_items: int, dim: int, strategy: str, *, local: bool) -> str | None:
    """Why a batch of ``strategy`` on a pool of ``n_items`` x ``dim`` cannot run in one process (``local``: it
    would), or None when it can."""
    limit = int(settings.local_pool_max_bytes)
    need = int(n_items) * int(dim) * 4
    if not local or limit <= 0 or need <= limit:
        return None
    size = f"{n_items:,} items x {dim} dimensions ({need / 2**30:.1f} GiB of float32 embeddings)"
    cluster = ", ".join(catalog.CLUSTER_STRATEGIES)
    where = (
        f"on this service's Dask cluster, run a strategy whose passes go there ({cluster}; bait without "
        "fisher_weights), with enough labels that the pool is not cold"
        if settings.dask_scheduler
        else f"an operator can add a Dask cluster (BAIT_DASK_SCHEDULER), where {cluster} run over pools of any size"
    )
    return (
        f"this pool holds {size}, more than one worker process loads (BAIT_LOCAL_POOL_MAX_BYTES = "
        f"{limit / 2**30:.1f} GiB), and strategy {strategy!r} would run in one process: {where}"
    )


def check_batch(
    settings: Any, n_items: int, dim: int, strategy: str, params: dict[str, Any], *, reads_embeddings: bool
) -> None:
    """Refuse (400 ``pool_too_large``) a batch that would load a pool larger than one process takes (a strategy
    that reads no embeddings, ``random`` without ``exclude_outliers``, loads ids only: never refused).

    Raises:
        BadRequest: the message says how large the pool is, the limit, and what runs instead.
    """
    local = reads_embeddings and not runs_on_cluster(settings, strategy, params)
    why = refusal(settings, n_items, dim, strategy, local=local)
    if why is not None:
        raise BadRequest(why, code="pool_too_large")

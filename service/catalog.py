"""Every job the service and the workers submit, named in one place by its dotted path.

A job is enqueued by path (``JobQueue.enqueue(catalog.RUN_BATCH, ...)``), so the web process never
imports the numerics: RQ resolves the path in a worker, the in-process runner with :mod:`importlib`.
The paths live here, in ``service/`` (which must not import ``worker/``), and every module that
submits a job takes its path from here; ``tests/worker/test_job_catalog.py`` imports every one and
checks that it is a callable, and that no other module writes a job path of its own.

Renaming a job function changes its path: jobs already waiting in Redis under the old path fail to
import; the recovery sweep (:func:`service.domain.jobs.recover_jobs`) submits their rows again under
the new one (batch, select and embed jobs; a lost annotation event comes back with the next reconcile).
"""

from __future__ import annotations

# ---------------------------------------------------------------------------------------- job functions

#: A batch: train, embed, select, reserve, store (job id = batch id).
RUN_BATCH = "worker.batch_job.run_batch"
#: A stateless ``POST /v1/select`` job (job id = select job id).
RUN_SELECT = "worker.select_job.run_select"
#: Predictions of a pool's latest checkpoint (called and waited for: ``JobQueue.call``).
PREDICT = "worker.predict.predict"
#: Embed a pool's items given by reference (job id = embed job id).
RUN_EMBED = "worker.embed.run_embed"
#: Import a Parquet dataset by reference into a pool (job id = import job id).
RUN_IMPORT = "worker.import_job.run_import"
#: Send the outgoing webhook deliveries that are due.
WEBHOOK_SWEEP = "worker.webhooks.sweep"
#: Annotation platforms: a reconcile run, an annotation event, a train request, a batch pushed again.
RECONCILE = "worker.annotation.run_reconcile"
APPLY_ANNOTATION = "worker.annotation.apply_annotation"
TRAIN_REQUESTED = "worker.annotation.train_requested"
REDELIVER = "worker.annotation.redeliver"

#: Remove a deleted pool's folder from the pool store (job id = ``drop-store-<pool id>``).
DROP_POOL_STORE = "worker.pool_store.drop_deleted_pool"
#: Write a pool's current content version to the pool store as items arrive (job id = ``store-<pool id>``).
WRITE_POOL_STORE = "worker.pool_store.write_arrived"

#: Strategies whose pool-wide passes run on the Dask cluster when one is configured (``worker.distributed`` holds
#: the same list): the top-``B`` ones wholly, ``bait`` up to its greedy (without ``fisher_weights``).
CLUSTER_STRATEGIES = ("random", "margin", "confidence", "entropy", "bait")

#: The in-process runner's start hook, called with ``(settings, queue)`` before its first job.
WORKER_CONFIGURE = "worker.runtime.configure"

JOBS = (
    RUN_BATCH,
    RUN_SELECT,
    PREDICT,
    RUN_EMBED,
    RUN_IMPORT,
    WEBHOOK_SWEEP,
    RECONCILE,
    APPLY_ANNOTATION,
    TRAIN_REQUESTED,
    REDELIVER,
    DROP_POOL_STORE,
    WRITE_POOL_STORE,
    WORKER_CONFIGURE,
)

# ------------------------------------------------------------------------- modules run as child processes

#: ``python -m`` this to check an uploaded TorchScript encoder (launched by the api at upload).
TORCHSCRIPT_CHECK = "worker.torchscript_check"
#: ``python -m`` this to run a TorchScript encoder in a sandboxed child (launched by workers).
ENCODER_CHILD = "worker.encoder_child"

CHILD_MODULES = (TORCHSCRIPT_CHECK, ENCODER_CHILD)

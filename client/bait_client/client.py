"""The synchronous client of bait-service (httpx). Every method runs the operation of the same name in
:mod:`bait_client._ops`; :class:`bait_client.AsyncClient` runs the same operations with ``await``."""

from __future__ import annotations

import os
import random
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx

from bait_client import uploads
from bait_client._core import Op, RetryPolicy, iterate_sync, run_sync
from bait_client._ops import _UNSET, Operations
from bait_client.errors import BaitError, BatchFailed
from bait_client.models import (
    Batch,
    Checkpoint,
    Curve,
    Delivery,
    EmbedJob,
    Encoder,
    ImportJob,
    Integration,
    Item,
    LabelHistory,
    LabelsResult,
    Limits,
    Pool,
    PoolMap,
    Predictions,
    Reconcile,
    SecretRotated,
    Selection,
    Strategies,
    UpsertResult,
    Webhook,
)
from bait_client.progress import StageBar

__all__ = ["BaitError", "BatchFailed", "Client", "StageBar", "resolve"]

T = TypeVar("T")
DEFAULT_URL = "http://127.0.0.1:8000"


def resolve(
    base_url: str | None, api_key: str | None, retry: RetryPolicy | bool | None
) -> tuple[str, str, RetryPolicy]:
    """The base URL (argument, ``BAIT_URL``, or the local default), the key (argument or ``BAIT_API_KEY``)
    and the retry policy (``None``/``True``: the default one; ``False``: no retries)."""
    url = (base_url or os.environ.get("BAIT_URL") or DEFAULT_URL).rstrip("/")
    key = api_key or os.environ.get("BAIT_API_KEY")
    if not key:
        raise ValueError("give api_key= or set BAIT_API_KEY (create a key with `bait keys create`)")
    if retry is None or retry is True:
        policy = RetryPolicy()
    elif retry is False:
        policy = RetryPolicy.off()
    else:
        policy = retry
    return url, key, policy


class Client:
    """``Client("http://127.0.0.1:8000", api_key="...")``; also a context manager.

    Args:
        base_url: the service (default ``BAIT_URL``, else ``http://127.0.0.1:8000``).
        api_key: the key (default ``BAIT_API_KEY``).
        timeout: seconds per request.
        retry: a :class:`RetryPolicy`; ``False`` turns retries off.
        http_client: an ``httpx.Client`` of your own (proxies, TLS, event hooks); its base URL is kept.
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 60.0,
        retry: RetryPolicy | bool | None = None,
        http_client: httpx.Client | None = None,
    ) -> None:
        url, key, self.retry = resolve(base_url, api_key, retry)
        if http_client is None:
            http_client = httpx.Client(base_url=url, timeout=timeout)
        http_client.headers["Authorization"] = f"Bearer {key}"
        self._http = http_client
        self._ops = Operations()
        self._rng = random.Random()

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, op: Op[T]) -> T:
        return run_sync(op, self._http, self.retry, self._rng)

    def _iterate(self, op: Op[Any]) -> Any:
        return iterate_sync(op, self._http, self.retry, self._rng)

    def limits(self) -> Limits:
        """The service's size and rate limits (``GET /v1/limits``); uploads are split under them."""
        return self._run(self._ops.limits())

    def create_pool(
        self,
        name: str,
        *,
        embedding_dim: int,
        classes: Sequence[str] | None = None,
        n_outputs: int | None = None,
        head: str | Mapping[str, Any] = "linear",
        encoder: Mapping[str, Any] | None = None,
        validation: Mapping[str, Any] | None = None,
    ) -> Pool:
        """A classification pool (give ``classes``) or a regression pool (give ``n_outputs``)."""
        return self._run(
            self._ops.create_pool(
                name,
                embedding_dim=embedding_dim,
                classes=classes,
                n_outputs=n_outputs,
                head=head,
                encoder=encoder,
                validation=validation,
            )
        )

    def pool(self, pool_id: str) -> Pool:
        """One pool, with its item counts."""
        return self._run(self._ops.pool(pool_id))

    def pools(self) -> list[Pool]:
        """Every pool of the key's tenant, oldest first."""
        return self._run(self._ops.pools())

    def update_pool(self, pool_id: str, *, encoder: Any = _UNSET, validation: Any = _UNSET) -> Pool:
        """Change the pool's ``encoder`` and/or ``validation`` hold-out (``None`` removes it)."""
        return self._run(self._ops.update_pool(pool_id, encoder=encoder, validation=validation))

    def delete_pool(self, pool_id: str) -> None:
        """Delete a pool and everything in it (needs the ``admin`` scope)."""
        return self._run(self._ops.delete_pool(pool_id))

    def add_items(self, pool_id: str, items: Sequence[Mapping[str, Any]]) -> UpsertResult:
        """Upsert ``[{"id", "embedding" | "uri" | "text", "data"?, "split"?}]`` as JSON, in as many
        requests as the service's limits need (idempotent by id)."""
        return self._run(self._ops.add_items(pool_id, items))

    def upload(
        self,
        pool_id: str,
        data: Any,
        ids: Sequence[Any] | None = None,
        *,
        split: str | None = None,
        start: int = 0,
        skip_existing: bool = False,
        chunk_bytes: int = uploads.DEFAULT_CHUNK_BYTES,
        progress: bool = True,
        id_column: str = "id",
        embedding_column: str = "embedding",
    ) -> UpsertResult:
        """Upsert items with embeddings in chunks under the service's upload limit, with one progress bar.

        Args:
            data: an ``n x d`` numpy array (give ``ids``), a pandas DataFrame or pyarrow Table with columns
                ``id`` and ``embedding`` (and optionally ``data``: JSON strings), or the path of a ``.parquet``
                file (streamed a row batch at a time), an ``.npy`` (memory-mapped; give ``ids``) or ``.npz``.
            ids: the ``n`` item ids of an array.
            split: put every item in ``train`` or ``validation``.
            start: skip the first ``start`` rows: resume a failed upload with ``start=err.uploaded``.
            skip_existing: ask the service which ids it already has and send only the others.
            chunk_bytes: the client's own cap on one request body (the service's limit also applies).
            progress: show the tqdm bar.

        Raises:
            UploadFailed: a chunk failed after its retries; ``err.uploaded`` rows before it are stored."""
        return self._run(
            self._ops.upload(
                pool_id,
                data,
                ids,
                split=split,
                start=start,
                skip_existing=skip_existing,
                chunk_bytes=chunk_bytes,
                progress=progress,
                id_column=id_column,
                embedding_column=embedding_column,
            )
        )

    def items(
        self,
        pool_id: str,
        status: str | None = None,
        *,
        page_size: int = 1000,
        include_embedding: bool = False,
        embedding_status: str | None = None,
    ) -> Iterator[Item]:
        """Every item (of a ``status``), following the cursor page by page."""
        return self._iterate(
            self._ops.items(
                pool_id,
                status,
                page_size=page_size,
                include_embedding=include_embedding,
                embedding_status=embedding_status,
            )
        )

    def item(self, pool_id: str, item_id: str, *, include_embedding: bool = False) -> Item:
        """One item."""
        return self._run(self._ops.item(pool_id, item_id, include_embedding=include_embedding))

    def move_items(self, pool_id: str, item_ids: Sequence[str], split: str) -> int:
        """Move items to the ``train`` or ``validation`` split; returns how many moved."""
        return self._run(self._ops.move_items(pool_id, item_ids, split))

    def label(
        self, pool_id: str, labels: Mapping[str, str | Sequence[float]], *, annotator: str | None = None
    ) -> LabelsResult:
        """``{item_id: class name}`` (classification) or ``{item_id: [targets]}`` (regression), chunked."""
        return self._run(self._ops.label(pool_id, labels, annotator=annotator))

    def delete_label(self, pool_id: str, item_id: str, *, annotator: str | None = None) -> None:
        """Remove an item's label (it becomes selectable again; the history keeps the removal)."""
        return self._run(self._ops.delete_label(pool_id, item_id, annotator=annotator))

    def label_history(self, pool_id: str, item_id: str) -> LabelHistory:
        """Every label write and removal of one item, oldest first."""
        return self._run(self._ops.label_history(pool_id, item_id))

    def request_batch(
        self,
        pool_id: str,
        size: int,
        strategy: str = "bait",
        params: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> Batch:
        """Ask for the next ``size`` items to label (answers at once with the queued batch).

        The request carries an ``Idempotency-Key`` (one is generated when none is given), so the
        client's retries never create a second batch."""
        return self._run(self._ops.request_batch(pool_id, size, strategy, params, idempotency_key=idempotency_key))

    def batch(self, pool_id: str, batch_id: str) -> Batch:
        """A batch: status, progress, and once succeeded its item ids in pick order."""
        return self._run(self._ops.batch(pool_id, batch_id))

    def batches(self, pool_id: str, status: str | None = None, *, page_size: int = 100) -> Iterator[Batch]:
        """Every batch of the pool (of a ``status``), newest first, page by page."""
        return self._iterate(self._ops.batches(pool_id, status, page_size=page_size))

    def wait(
        self, pool_id: str, batch: Batch | str, *, timeout: float = 3600.0, poll: float = 0.5, progress: bool = True
    ) -> Batch:
        """Poll until the batch is done, with a progress bar per stage; the batch when it succeeded.

        Raises:
            BatchFailed: it failed or was cancelled (the message is the batch's error).
            TimeoutError: not done within ``timeout`` seconds."""
        return self._run(self._ops.wait(pool_id, batch, timeout=timeout, poll=poll, progress=progress))

    def cancel_batch(self, pool_id: str, batch_id: str) -> Batch:
        """Cancel a queued or running batch, or give back the items of a succeeded one."""
        return self._run(self._ops.cancel_batch(pool_id, batch_id))

    def redeliver_batch(self, pool_id: str, batch_id: str) -> Batch:
        """Push a succeeded batch into the pool's Label Studio projects again (a failed delivery)."""
        return self._run(self._ops.redeliver_batch(pool_id, batch_id))

    def predictions(self, pool_id: str, item_ids: Sequence[str]) -> Predictions:
        """Class probabilities (or regression targets) of items from the latest checkpoint."""
        return self._run(self._ops.predictions(pool_id, item_ids))

    def checkpoints(self, pool_id: str, *, limit: int = 100) -> list[Checkpoint]:
        """The pool's trained heads, newest round first."""
        return self._run(self._ops.checkpoints(pool_id, limit=limit))

    def curve(self, pool_id: str, metric: str | None = None) -> Curve:
        """The validation curve: a validation ``metric`` against the number of labels, per checkpoint."""
        return self._run(self._ops.curve(pool_id, metric))

    def pool_map(self, pool_id: str, checkpoint_id: str | None = None) -> PoolMap:
        """The 2-D map of a checkpoint (default: the latest)."""
        return self._run(self._ops.pool_map(pool_id, checkpoint_id))

    def strategies(self) -> Strategies:
        """The selection strategies, their tasks and parameters, and BAIT's defaults."""
        return self._run(self._ops.strategies())

    def select(
        self,
        embeddings: Any,
        batch_size: int,
        strategy: str = "bait",
        *,
        task: str = "classification",
        probs: Any = None,
        labeled: Sequence[int] | None = None,
        reserved: Sequence[int] | None = None,
        params: Mapping[str, Any] | None = None,
        wait: bool = True,
        timeout: float = 3600.0,
        poll: float = 0.5,
    ) -> Selection:
        """Stateless selection: ``batch_size`` rows of ``embeddings`` (``n x d``), sent as an .npz.

        A large request becomes a job; with ``wait`` (the default) it is polled until done.

        Raises:
            JobFailed: the selection failed."""
        return self._run(
            self._ops.select(
                embeddings,
                batch_size,
                strategy,
                task=task,
                probs=probs,
                labeled=labeled,
                reserved=reserved,
                params=params,
                wait=wait,
                timeout=timeout,
                poll=poll,
            )
        )

    def selection(self, job_id: str) -> Selection:
        """A stateless selection job (``GET /v1/select/{id}``)."""
        return self._run(self._ops.selection(job_id))

    def wait_selection(self, job: Selection | str, *, timeout: float = 3600.0, poll: float = 0.5) -> Selection:
        """Poll a stateless selection job until it is done."""
        return self._run(self._ops.wait_selection(job, timeout=timeout, poll=poll))

    def upload_encoder(
        self, module: str | Path | bytes, *, name: str | None = None, config: Mapping[str, Any] | None = None
    ) -> Encoder:
        """Upload a TorchScript encoder (a path or the bytes of ``torch.jit.save``; ``admin`` scope)."""
        return self._run(self._ops.upload_encoder(module, name=name, config=config))

    def encoders(self) -> list[Encoder]:
        """The tenant's uploaded encoders."""
        return self._run(self._ops.encoders())

    def encoder(self, encoder_id: str) -> Encoder:
        """One uploaded encoder."""
        return self._run(self._ops.encoder(encoder_id))

    def delete_encoder(self, encoder_id: str) -> None:
        """Delete an uploaded encoder (409 while a pool uses it)."""
        return self._run(self._ops.delete_encoder(encoder_id))

    def start_embed(self, pool_id: str) -> EmbedJob:
        """Start an embed job: encode the pool's pending items (items in error are retried)."""
        return self._run(self._ops.start_embed(pool_id))

    def embed_job(self, pool_id: str, job_id: str | None = None) -> EmbedJob:
        """An embed job of the pool (default: the latest)."""
        return self._run(self._ops.embed_job(pool_id, job_id))

    def embed_jobs(self, pool_id: str, *, limit: int = 20) -> list[EmbedJob]:
        """The pool's embed jobs, newest first."""
        return self._run(self._ops.embed_jobs(pool_id, limit=limit))

    def wait_embed(
        self, pool_id: str, job: EmbedJob | str | None = None, *, timeout: float = 3600.0, poll: float = 0.5
    ) -> EmbedJob:
        """Poll an embed job (default: the latest) until it is done; raises JobFailed if it failed."""
        return self._run(self._ops.wait_embed(pool_id, job, timeout=timeout, poll=poll))

    def import_items(self, pool_id: str, source: str) -> ImportJob:
        """Import a Parquet dataset by reference (``file:///...`` under the tenant's data folder, or
        ``s3://bucket/...`` under an object-store prefix the operator assigned to the tenant: a file, a folder
        or a glob) as a job; the service reads it, nothing is uploaded. See :meth:`wait_import`."""
        return self._run(self._ops.import_items(pool_id, source))

    def get_import(self, pool_id: str, import_id: str) -> ImportJob:
        """One import: status, progress, rows imported, error."""
        return self._run(self._ops.get_import(pool_id, import_id))

    def imports(self, pool_id: str, *, limit: int = 20) -> list[ImportJob]:
        """The pool's imports, newest first."""
        return self._run(self._ops.imports(pool_id, limit=limit))

    def wait_import(
        self, pool_id: str, job: ImportJob | str, *, timeout: float = 3600.0, poll: float = 0.5
    ) -> ImportJob:
        """Poll an import until it is done; raises JobFailed (the file and row named) if it failed."""
        return self._run(self._ops.wait_import(pool_id, job, timeout=timeout, poll=poll))

    def connect_labelstudio(self, pool_id: str, url: str, token: str, project_id: int, **options: Any) -> Integration:
        """Connect a Label Studio project; the answer carries ``ml_backend_url`` (with its secret) once."""
        return self._run(self._ops.connect_labelstudio(pool_id, url, token, project_id, **options))

    def integrations(self, pool_id: str) -> list[Integration]:
        """The pool's Label Studio integrations."""
        return self._run(self._ops.integrations(pool_id))

    def integration(self, pool_id: str, integration_id: str) -> Integration:
        """One integration, with its status and last error."""
        return self._run(self._ops.integration(pool_id, integration_id))

    def delete_integration(self, pool_id: str, integration_id: str) -> None:
        """Disconnect a Label Studio project (its tasks stay in Label Studio)."""
        return self._run(self._ops.delete_integration(pool_id, integration_id))

    def reconcile(self, pool_id: str, integration_id: str) -> Reconcile:
        """Queue a reconcile (annotations read back from Label Studio); poll it with :meth:`reconcile_run`."""
        return self._run(self._ops.reconcile(pool_id, integration_id))

    def reconcile_run(self, pool_id: str, integration_id: str, run_id: str) -> Reconcile:
        """A reconcile: ``status`` (queued | running | succeeded | failed), ``counts``, ``error``."""
        return self._run(self._ops.reconcile_run(pool_id, integration_id, run_id))

    def reconciles(self, pool_id: str, integration_id: str, *, limit: int = 50) -> list[Reconcile]:
        """The integration's reconciles, newest first."""
        return self._run(self._ops.reconciles(pool_id, integration_id, limit=limit))

    def rotate_integration_secret(self, pool_id: str, integration_id: str) -> SecretRotated:
        """A new ML-backend secret and URL (the old secret stops working at once)."""
        return self._run(self._ops.rotate_integration_secret(pool_id, integration_id))

    def add_webhook(
        self,
        pool_id: str,
        url: str,
        events: Sequence[str] = ("batch.succeeded", "batch.failed"),
        secret: str | None = None,
    ) -> Webhook:
        """Register a URL for signed batch events; keep the returned ``secret`` to verify them."""
        return self._run(self._ops.add_webhook(pool_id, url, events, secret))

    def webhooks(self, pool_id: str) -> list[Webhook]:
        """The pool's webhooks."""
        return self._run(self._ops.webhooks(pool_id))

    def webhook(self, pool_id: str, webhook_id: str) -> Webhook:
        """One webhook."""
        return self._run(self._ops.webhook(pool_id, webhook_id))

    def delete_webhook(self, pool_id: str, webhook_id: str) -> None:
        """Remove a webhook."""
        return self._run(self._ops.delete_webhook(pool_id, webhook_id))

    def deliveries(self, pool_id: str, webhook_id: str, *, limit: int = 50) -> list[Delivery]:
        """A webhook's deliveries, newest first, with every attempt."""
        return self._run(self._ops.deliveries(pool_id, webhook_id, limit=limit))

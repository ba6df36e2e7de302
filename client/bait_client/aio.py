"""The asynchronous client of bait-service (``httpx.AsyncClient``): the same methods as
:class:`bait_client.Client`, awaited (iterators are ``async for``). Both run the operations of
:mod:`bait_client._ops`; only sending and sleeping differ."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import httpx

from bait_client import uploads
from bait_client._core import Op, RetryPolicy, iterate_async, run_async
from bait_client._ops import _UNSET, Operations
from bait_client.client import resolve
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

T = TypeVar("T")


class AsyncClient:
    """``async with AsyncClient("http://127.0.0.1:8000", api_key="...") as bait: await bait.pools()``.

    The arguments are :class:`bait_client.Client`'s; ``http_client`` is an ``httpx.AsyncClient``. The upload
    methods read and encode their chunks on the event loop (the sends are awaited).
    """

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float = 60.0,
        retry: RetryPolicy | bool | None = None,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        url, key, self.retry = resolve(base_url, api_key, retry)
        if http_client is None:
            http_client = httpx.AsyncClient(base_url=url, timeout=timeout)
        http_client.headers["Authorization"] = f"Bearer {key}"
        self._http = http_client
        self._ops = Operations()
        self._rng = random.Random()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _run(self, op: Op[T]) -> T:
        return await run_async(op, self._http, self.retry, self._rng)

    def _iterate(self, op: Op[Any]) -> Any:
        return iterate_async(op, self._http, self.retry, self._rng)

    async def limits(self) -> Limits:
        return await self._run(self._ops.limits())

    async def create_pool(
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
        return await self._run(
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

    async def pool(self, pool_id: str) -> Pool:
        return await self._run(self._ops.pool(pool_id))

    async def pools(self) -> list[Pool]:
        return await self._run(self._ops.pools())

    async def update_pool(self, pool_id: str, *, encoder: Any = _UNSET, validation: Any = _UNSET) -> Pool:
        return await self._run(self._ops.update_pool(pool_id, encoder=encoder, validation=validation))

    async def delete_pool(self, pool_id: str) -> None:
        return await self._run(self._ops.delete_pool(pool_id))

    async def add_items(self, pool_id: str, items: Sequence[Mapping[str, Any]]) -> UpsertResult:
        return await self._run(self._ops.add_items(pool_id, items))

    async def upload(
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
        return await self._run(
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
    ) -> AsyncIterator[Item]:
        return self._iterate(
            self._ops.items(
                pool_id,
                status,
                page_size=page_size,
                include_embedding=include_embedding,
                embedding_status=embedding_status,
            )
        )

    async def item(self, pool_id: str, item_id: str, *, include_embedding: bool = False) -> Item:
        return await self._run(self._ops.item(pool_id, item_id, include_embedding=include_embedding))

    async def move_items(self, pool_id: str, item_ids: Sequence[str], split: str) -> int:
        return await self._run(self._ops.move_items(pool_id, item_ids, split))

    async def label(
        self, pool_id: str, labels: Mapping[str, str | Sequence[float]], *, annotator: str | None = None
    ) -> LabelsResult:
        return await self._run(self._ops.label(pool_id, labels, annotator=annotator))

    async def delete_label(self, pool_id: str, item_id: str, *, annotator: str | None = None) -> None:
        return await self._run(self._ops.delete_label(pool_id, item_id, annotator=annotator))

    async def label_history(self, pool_id: str, item_id: str) -> LabelHistory:
        return await self._run(self._ops.label_history(pool_id, item_id))

    async def request_batch(
        self,
        pool_id: str,
        size: int,
        strategy: str = "bait",
        params: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> Batch:
        return await self._run(
            self._ops.request_batch(pool_id, size, strategy, params, idempotency_key=idempotency_key)
        )

    async def batch(self, pool_id: str, batch_id: str) -> Batch:
        return await self._run(self._ops.batch(pool_id, batch_id))

    def batches(self, pool_id: str, status: str | None = None, *, page_size: int = 100) -> AsyncIterator[Batch]:
        return self._iterate(self._ops.batches(pool_id, status, page_size=page_size))

    async def wait(
        self, pool_id: str, batch: Batch | str, *, timeout: float = 3600.0, poll: float = 0.5, progress: bool = True
    ) -> Batch:
        return await self._run(self._ops.wait(pool_id, batch, timeout=timeout, poll=poll, progress=progress))

    async def cancel_batch(self, pool_id: str, batch_id: str) -> Batch:
        return await self._run(self._ops.cancel_batch(pool_id, batch_id))

    async def redeliver_batch(self, pool_id: str, batch_id: str) -> Batch:
        return await self._run(self._ops.redeliver_batch(pool_id, batch_id))

    async def predictions(self, pool_id: str, item_ids: Sequence[str]) -> Predictions:
        return await self._run(self._ops.predictions(pool_id, item_ids))

    async def checkpoints(self, pool_id: str, *, limit: int = 100) -> list[Checkpoint]:
        return await self._run(self._ops.checkpoints(pool_id, limit=limit))

    async def curve(self, pool_id: str, metric: str | None = None) -> Curve:
        return await self._run(self._ops.curve(pool_id, metric))

    async def pool_map(self, pool_id: str, checkpoint_id: str | None = None) -> PoolMap:
        return await self._run(self._ops.pool_map(pool_id, checkpoint_id))

    async def strategies(self) -> Strategies:
        return await self._run(self._ops.strategies())

    async def select(
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
        return await self._run(
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

    async def selection(self, job_id: str) -> Selection:
        return await self._run(self._ops.selection(job_id))

    async def wait_selection(self, job: Selection | str, *, timeout: float = 3600.0, poll: float = 0.5) -> Selection:
        return await self._run(self._ops.wait_selection(job, timeout=timeout, poll=poll))

    async def upload_encoder(
        self, module: str | Path | bytes, *, name: str | None = None, config: Mapping[str, Any] | None = None
    ) -> Encoder:
        return await self._run(self._ops.upload_encoder(module, name=name, config=config))

    async def encoders(self) -> list[Encoder]:
        return await self._run(self._ops.encoders())

    async def encoder(self, encoder_id: str) -> Encoder:
        return await self._run(self._ops.encoder(encoder_id))

    async def delete_encoder(self, encoder_id: str) -> None:
        return await self._run(self._ops.delete_encoder(encoder_id))

    async def start_embed(self, pool_id: str) -> EmbedJob:
        return await self._run(self._ops.start_embed(pool_id))

    async def embed_job(self, pool_id: str, job_id: str | None = None) -> EmbedJob:
        return await self._run(self._ops.embed_job(pool_id, job_id))

    async def embed_jobs(self, pool_id: str, *, limit: int = 20) -> list[EmbedJob]:
        return await self._run(self._ops.embed_jobs(pool_id, limit=limit))

    async def wait_embed(
        self, pool_id: str, job: EmbedJob | str | None = None, *, timeout: float = 3600.0, poll: float = 0.5
    ) -> EmbedJob:
        return await self._run(self._ops.wait_embed(pool_id, job, timeout=timeout, poll=poll))

    async def import_items(self, pool_id: str, source: str) -> ImportJob:
        return await self._run(self._ops.import_items(pool_id, source))

    async def get_import(self, pool_id: str, import_id: str) -> ImportJob:
        return await self._run(self._ops.get_import(pool_id, import_id))

    async def imports(self, pool_id: str, *, limit: int = 20) -> list[ImportJob]:
        return await self._run(self._ops.imports(pool_id, limit=limit))

    async def wait_import(
        self, pool_id: str, job: ImportJob | str, *, timeout: float = 3600.0, poll: float = 0.5
    ) -> ImportJob:
        return await self._run(self._ops.wait_import(pool_id, job, timeout=timeout, poll=poll))

    async def connect_labelstudio(
        self, pool_id: str, url: str, token: str, project_id: int, **options: Any
    ) -> Integration:
        return await self._run(self._ops.connect_labelstudio(pool_id, url, token, project_id, **options))

    async def integrations(self, pool_id: str) -> list[Integration]:
        return await self._run(self._ops.integrations(pool_id))

    async def integration(self, pool_id: str, integration_id: str) -> Integration:
        return await self._run(self._ops.integration(pool_id, integration_id))

    async def delete_integration(self, pool_id: str, integration_id: str) -> None:
        return await self._run(self._ops.delete_integration(pool_id, integration_id))

    async def reconcile(self, pool_id: str, integration_id: str) -> Reconcile:
        return await self._run(self._ops.reconcile(pool_id, integration_id))

    async def reconcile_run(self, pool_id: str, integration_id: str, run_id: str) -> Reconcile:
        return await self._run(self._ops.reconcile_run(pool_id, integration_id, run_id))

    async def reconciles(self, pool_id: str, integration_id: str, *, limit: int = 50) -> list[Reconcile]:
        return await self._run(self._ops.reconciles(pool_id, integration_id, limit=limit))

    async def rotate_integration_secret(self, pool_id: str, integration_id: str) -> SecretRotated:
        return await self._run(self._ops.rotate_integration_secret(pool_id, integration_id))

    async def add_webhook(
        self,
        pool_id: str,
        url: str,
        events: Sequence[str] = ("batch.succeeded", "batch.failed"),
        secret: str | None = None,
    ) -> Webhook:
        return await self._run(self._ops.add_webhook(pool_id, url, events, secret))

    async def webhooks(self, pool_id: str) -> list[Webhook]:
        return await self._run(self._ops.webhooks(pool_id))

    async def webhook(self, pool_id: str, webhook_id: str) -> Webhook:
        return await self._run(self._ops.webhook(pool_id, webhook_id))

    async def delete_webhook(self, pool_id: str, webhook_id: str) -> None:
        return await self._run(self._ops.delete_webhook(pool_id, webhook_id))

    async def deliveries(self, pool_id: str, webhook_id: str, *, limit: int = 50) -> list[Delivery]:
        return await self._run(self._ops.deliveries(pool_id, webhook_id, limit=limit))

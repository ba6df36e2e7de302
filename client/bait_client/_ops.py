"""Every API operation once, without I/O: what to send and how to read the answer (see :mod:`._core`).

:class:`bait_client.Client` and :class:`bait_client.AsyncClient` are thin shells over :class:`Operations`:
each of their methods runs the operation of the same name.
"""

from __future__ import annotations

import io
import json
import time
import uuid
from collections.abc import Generator, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from bait_client import uploads
from bait_client._core import Call, Emit, Sleep, Step
from bait_client.errors import (
    BaitError,
    BatchFailed,
    InsufficientScope,
    JobFailed,
    NotFound,
    PayloadTooLarge,
    UploadFailed,
)
from bait_client.models import (
    Batch,
    BatchPage,
    Checkpoint,
    Curve,
    Delivery,
    EmbedJob,
    Encoder,
    ImportJob,
    Integration,
    Item,
    ItemPage,
    LabelHistory,
    LabelsResult,
    Limits,
    Pool,
    PoolMap,
    Predictions,
    Reconcile,
    SecretRotated,
    Selection,
    SplitResult,
    Strategies,
    UpsertResult,
    Webhook,
)
from bait_client.progress import StageBar, upload_bar

T = TypeVar("T")
Gen = Generator[Step, Any, T]

# The service's defaults (service/config.py), used when it does not publish its limits (GET /v1/limits).
DEFAULT_LIMITS = Limits(
    max_json_bytes=64 * 2**20,
    max_upload_bytes=2 * 2**30,
    max_upload_inflated_bytes=2 * 2**30,
    max_items_per_request=100_000,
)
# Share of max_json_bytes a JSON request is planned at (the envelope and escaping are not counted exactly).
JSON_HEADROOM = 0.9
_UNSET: Any = object()


def _model(cls: type[T]) -> Any:
    return cls.model_validate  # type: ignore[attr-defined]


def _list(cls: type[T], key: str) -> Any:
    return lambda body: [cls.model_validate(x) for x in body[key]]  # type: ignore[attr-defined]


def _none(_body: Any) -> None:
    return None


def _id(value: Any) -> str:
    return value if isinstance(value, str) else str(value.id)


class Operations:
    """The API as operations. Holds the one piece of state they share: the service's limits, read once."""

    def __init__(self) -> None:
        self._limits: Limits | None = None

    # ------------------------------------------------------------------ limits

    def limits(self) -> Call[Limits]:
        return Call("GET", "/v1/limits", parse=_model(Limits))

    def _known_limits(self) -> Gen[Limits]:
        """The service's limits, asked once per client (its defaults if it does not publish them)."""
        if self._limits is None:
            try:
                self._limits = yield self.limits()
            except (NotFound, InsufficientScope):  # an older service, or a key without `read`
                self._limits = DEFAULT_LIMITS
        assert self._limits is not None
        return self._limits

    # ------------------------------------------------------------------ pools

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
    ) -> Call[Pool]:
        body: dict[str, Any] = {
            "name": name,
            "task": "classification" if classes is not None else "regression",
            "embedding_dim": embedding_dim,
            "head": {"kind": head} if isinstance(head, str) else dict(head),
        }
        if classes is not None:
            body["classes"] = list(classes)
        else:
            body["n_outputs"] = n_outputs or 1
        if encoder is not None:
            body["encoder"] = dict(encoder)
        if validation is not None:
            body["validation"] = dict(validation)
        return Call("POST", "/v1/pools", json=body, parse=_model(Pool))

    def pool(self, pool_id: str) -> Call[Pool]:
        return Call("GET", f"/v1/pools/{pool_id}", parse=_model(Pool))

    def pools(self) -> Call[list[Pool]]:
        return Call("GET", "/v1/pools", parse=_list(Pool, "pools"))

    def update_pool(self, pool_id: str, *, encoder: Any = _UNSET, validation: Any = _UNSET) -> Call[Pool]:
        body: dict[str, Any] = {}
        if encoder is not _UNSET:
            body["encoder"] = None if encoder is None else dict(encoder)
        if validation is not _UNSET:
            body["validation"] = None if validation is None else dict(validation)
        if not body:
            raise ValueError("give encoder= and/or validation= (None removes it)")
        return Call("PATCH", f"/v1/pools/{pool_id}", json=body, parse=_model(Pool))

    def delete_pool(self, pool_id: str) -> Call[None]:
        return Call("DELETE", f"/v1/pools/{pool_id}", parse=_none)

    # ------------------------------------------------------------------ items

    def add_items(self, pool_id: str, items: Sequence[Mapping[str, Any]]) -> Gen[UpsertResult]:
        limits = yield from self._known_limits()
        created = updated = 0
        job: str | None = None
        for chunk in _json_chunks(items, limits):
            out: UpsertResult = yield Call(
                "POST",
                f"/v1/pools/{pool_id}/items",
                json={"items": chunk},
                parse=_model(UpsertResult),
                idempotent=True,  # an upsert by id: sending it twice stores it once
            )
            created, updated, job = created + out.created, updated + out.updated, out.embed_job_id or job
        return UpsertResult(created=created, updated=updated, embed_job_id=job)

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
    ) -> Gen[UpsertResult]:
        source = uploads.source_of(data, ids, id_column=id_column, embedding_column=embedding_column)
        if not 0 <= start <= source.n:
            raise ValueError(f"start must be within 0..{source.n}, not {start}")
        limits = yield from self._known_limits()
        body_limit = min(limits.max_upload_bytes, limits.max_upload_inflated_bytes)
        skip: set[str] | None = None
        if skip_existing:
            skip = set()
            wanted = set(source.all_ids())
            listing = self.items(pool_id, page_size=1000)
            for item in (yield from _collect(listing)):
                if item.id in wanted:
                    skip.add(item.id)
        params: dict[str, Any] = {"split": split}
        created = updated = 0
        bar = upload_bar(source.n, start, enabled=progress)
        try:
            planned = source.pieces(start, uploads.rows_per_piece(source, body_limit, chunk_bytes), skip)
            pending: list[uploads.Piece] = []  # halves of a piece found too large, next first
            while True:
                if pending:
                    piece = pending.pop()
                else:
                    following = next(planned, None)  # pieces are read one at a time: a large file streams
                    if following is None:
                        break
                    piece = following
                if piece.rows == 0:
                    bar.update(piece.end - piece.begin)
                    continue
                body, fmt = piece.encode()
                if len(body) > body_limit and piece.rows > 1:
                    pending.extend(reversed(piece.halves()))
                    continue
                try:
                    out: UpsertResult = yield Call(
                        "POST",
                        f"/v1/pools/{pool_id}/items:bulk",
                        params={**params, "format": fmt},
                        content=body,
                        headers={"Content-Type": "application/octet-stream"},
                        parse=_model(UpsertResult),
                        idempotent=True,  # an upsert by id
                    )
                except PayloadTooLarge as exc:
                    if piece.rows > 1:  # the service's limit is below what it published: halve and go on
                        limit = (exc.details or {}).get("limit_bytes") if isinstance(exc.details, dict) else None
                        if isinstance(limit, int):
                            body_limit = min(body_limit, limit)
                        pending.extend(reversed(piece.halves()))
                        continue
                    raise UploadFailed(piece.begin, source.n, exc) from exc
                except BaitError as exc:
                    raise UploadFailed(piece.begin, source.n, exc) from exc
                created, updated = created + out.created, updated + out.updated
                bar.update(piece.end - piece.begin)
        finally:
            bar.close()
        return UpsertResult(created=created, updated=updated)

    def items(
        self,
        pool_id: str,
        status: str | None = None,
        *,
        page_size: int = 1000,
        include_embedding: bool = False,
        embedding_status: str | None = None,
    ) -> Gen[None]:
        cursor: str | None = None
        while True:
            params = {
                "limit": page_size,
                "status": status,
                "cursor": cursor,
                "include_embedding": include_embedding or None,
                "embedding_status": embedding_status,
            }
            page: ItemPage = yield Call("GET", f"/v1/pools/{pool_id}/items", params=params, parse=_model(ItemPage))
            for item in page.items:
                yield Emit(item)
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    def item(self, pool_id: str, item_id: str, *, include_embedding: bool = False) -> Call[Item]:
        params = {"include_embedding": include_embedding or None}
        return Call("GET", f"/v1/pools/{pool_id}/items/{item_id}", params=params, parse=_model(Item))

    def move_items(self, pool_id: str, item_ids: Sequence[str], split: str) -> Gen[int]:
        limits = yield from self._known_limits()
        moved = 0
        step = min(100_000, limits.max_items_per_request)
        for begin in range(0, len(item_ids), step):
            out: SplitResult = yield Call(
                "PATCH",
                f"/v1/pools/{pool_id}/items",
                json={"item_ids": list(item_ids[begin : begin + step]), "split": split},
                parse=_model(SplitResult),
            )
            moved += out.moved
        return moved

    # ------------------------------------------------------------------ labels

    def label(
        self, pool_id: str, labels: Mapping[str, str | Sequence[float]], *, annotator: str | None = None
    ) -> Gen[LabelsResult]:
        limits = yield from self._known_limits()
        rows = [
            {"item_id": k, "label": v} if isinstance(v, str) else {"item_id": k, "target": [float(x) for x in v]}
            for k, v in labels.items()
        ]
        labeled = 0
        for chunk in _json_chunks(rows, limits):
            body: dict[str, Any] = {"labels": chunk}
            if annotator:
                body["annotator"] = annotator
            out: LabelsResult = yield Call("PUT", f"/v1/pools/{pool_id}/labels", json=body, parse=_model(LabelsResult))
            labeled += out.labeled
        return LabelsResult(labeled=labeled)

    def delete_label(self, pool_id: str, item_id: str, *, annotator: str | None = None) -> Call[None]:
        return Call("DELETE", f"/v1/pools/{pool_id}/labels/{item_id}", params={"annotator": annotator}, parse=_none)

    def label_history(self, pool_id: str, item_id: str) -> Call[LabelHistory]:
        return Call("GET", f"/v1/pools/{pool_id}/labels/{item_id}/history", parse=_model(LabelHistory))

    # ------------------------------------------------------------------ batches

    def request_batch(
        self,
        pool_id: str,
        size: int,
        strategy: str = "bait",
        params: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> Call[Batch]:
        # A key per call, kept across its retries: a request the service got but whose answer was lost
        # returns the same batch when sent again, never a second one.
        key = idempotency_key or f"bait-client-{uuid.uuid4().hex}"
        body = {"size": size, "strategy": strategy, "params": dict(params or {})}
        return Call(
            "POST",
            f"/v1/pools/{pool_id}/batches",
            json=body,
            headers={"Idempotency-Key": key},
            parse=_model(Batch),
        )

    def batch(self, pool_id: str, batch_id: str) -> Call[Batch]:
        return Call("GET", f"/v1/pools/{pool_id}/batches/{batch_id}", parse=_model(Batch))

    def batches(self, pool_id: str, status: str | None = None, *, page_size: int = 100) -> Gen[None]:
        before: str | None = None
        while True:
            params = {"status": status, "limit": page_size, "before": before}
            page: BatchPage = yield Call("GET", f"/v1/pools/{pool_id}/batches", params=params, parse=_model(BatchPage))
            for batch in page.batches:
                yield Emit(batch)
            if page.next_before is None:
                return
            before = page.next_before.isoformat()

    def wait(
        self, pool_id: str, batch: Batch | str, *, timeout: float = 3600.0, poll: float = 0.5, progress: bool = True
    ) -> Gen[Batch]:
        batch_id = _id(batch)
        deadline = time.monotonic() + timeout
        bar = StageBar(enabled=progress)
        try:
            while True:
                current: Batch = yield self.batch(pool_id, batch_id)
                p = current.progress
                bar.show(p.stage or current.status, p.done, p.total)
                if current.done:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"batch {batch_id} still {current.status} after {timeout:g} s")
                yield Sleep(poll)
        finally:
            bar.close()
        if current.status != "succeeded":
            raise BatchFailed(200, f"batch_{current.status}", current.error or f"batch {current.status}")
        return current

    def cancel_batch(self, pool_id: str, batch_id: str) -> Call[Batch]:
        return Call("POST", f"/v1/pools/{pool_id}/batches/{batch_id}/cancel", parse=_model(Batch), idempotent=True)

    def redeliver_batch(self, pool_id: str, batch_id: str) -> Call[Batch]:
        return Call("POST", f"/v1/pools/{pool_id}/batches/{batch_id}/delivery", parse=_model(Batch), idempotent=True)

    # ------------------------------------------------------------------ model

    def predictions(self, pool_id: str, item_ids: Sequence[str]) -> Call[Predictions]:
        return Call(
            "POST",
            f"/v1/pools/{pool_id}/predictions",
            json={"item_ids": list(item_ids)},
            parse=_model(Predictions),
            idempotent=True,  # a read
        )

    def checkpoints(self, pool_id: str, *, limit: int = 100) -> Call[list[Checkpoint]]:
        return Call(
            "GET", f"/v1/pools/{pool_id}/checkpoints", params={"limit": limit}, parse=_list(Checkpoint, "checkpoints")
        )

    def curve(self, pool_id: str, metric: str | None = None) -> Call[Curve]:
        return Call("GET", f"/v1/pools/{pool_id}/curve", params={"metric": metric}, parse=_model(Curve))

    def pool_map(self, pool_id: str, checkpoint_id: str | None = None) -> Call[PoolMap]:
        return Call("GET", f"/v1/pools/{pool_id}/map", params={"checkpoint_id": checkpoint_id}, parse=_model(PoolMap))

    # ------------------------------------------------------------------ stateless selection

    def strategies(self) -> Call[Strategies]:
        return Call("GET", "/v1/strategies", parse=_model(Strategies))

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
    ) -> Gen[Selection]:
        arrays: dict[str, np.ndarray] = {"embeddings": np.asarray(embeddings)}
        if probs is not None:
            arrays["probs"] = np.asarray(probs)
        for name, rows in (("labeled", labeled), ("reserved", reserved)):
            if rows is not None:
                arrays[name] = np.asarray(list(rows), dtype=np.int64)
        buf = io.BytesIO()
        np.savez(buf, **arrays)  # type: ignore[arg-type]
        fields = {
            "strategy": strategy,
            "batch_size": str(batch_size),
            "task": task,
            "params": json.dumps(dict(params or {})),
        }
        out: Selection = yield Call(
            "POST",
            "/v1/select",
            files={"arrays": ("arrays.npz", buf.getvalue(), "application/octet-stream")},
            data=fields,
            parse=_model(Selection),
        )
        if wait and not out.done:
            out = yield from self.wait_selection(out, timeout=timeout, poll=poll)
        if out.status == "failed":
            raise JobFailed(200, out.error_type or "select_failed", out.error or "the selection failed")
        return out

    def selection(self, job_id: str) -> Call[Selection]:
        return Call("GET", f"/v1/select/{job_id}", parse=_model(Selection))

    def wait_selection(self, job: Selection | str, *, timeout: float = 3600.0, poll: float = 0.5) -> Gen[Selection]:
        job_id = _id(job)
        deadline = time.monotonic() + timeout
        while True:
            current: Selection = yield self.selection(job_id)
            if current.done:
                return current
            if time.monotonic() > deadline:
                raise TimeoutError(f"selection {job_id} still {current.status} after {timeout:g} s")
            yield Sleep(poll)

    # ------------------------------------------------------------------ encoders and embed jobs

    def upload_encoder(
        self, module: str | Path | bytes, *, name: str | None = None, config: Mapping[str, Any] | None = None
    ) -> Call[Encoder]:
        if isinstance(module, bytes):
            content, filename = module, name or "encoder.pt"
        else:
            path = Path(module)
            content, filename = path.read_bytes(), path.name
        data: dict[str, str] = {}
        if name:
            data["name"] = name
        if config is not None:
            data["config"] = json.dumps(dict(config))
        return Call(
            "POST",
            "/v1/encoders",
            files={"file": (filename, content, "application/octet-stream")},
            data=data,
            parse=_model(Encoder),
        )

    def encoders(self) -> Call[list[Encoder]]:
        return Call("GET", "/v1/encoders", parse=_list(Encoder, "encoders"))

    def encoder(self, encoder_id: str) -> Call[Encoder]:
        return Call("GET", f"/v1/encoders/{encoder_id}", parse=_model(Encoder))

    def delete_encoder(self, encoder_id: str) -> Call[None]:
        return Call("DELETE", f"/v1/encoders/{encoder_id}", parse=_none)

    def start_embed(self, pool_id: str) -> Call[EmbedJob]:
        # The service reuses a job already waiting, so a re-sent request starts no second one.
        return Call("POST", f"/v1/pools/{pool_id}/embed", parse=_model(EmbedJob), idempotent=True)

    def embed_job(self, pool_id: str, job_id: str | None = None) -> Call[EmbedJob]:
        path = f"/v1/pools/{pool_id}/embed/{job_id}" if job_id else f"/v1/pools/{pool_id}/embed"
        return Call("GET", path, parse=_model(EmbedJob))

    def embed_jobs(self, pool_id: str, *, limit: int = 20) -> Call[list[EmbedJob]]:
        return Call("GET", f"/v1/pools/{pool_id}/embed/jobs", params={"limit": limit}, parse=_list(EmbedJob, "jobs"))

    def wait_embed(
        self, pool_id: str, job: EmbedJob | str | None = None, *, timeout: float = 3600.0, poll: float = 0.5
    ) -> Gen[EmbedJob]:
        job_id = None if job is None else _id(job)
        deadline = time.monotonic() + timeout
        while True:
            current: EmbedJob = yield self.embed_job(pool_id, job_id)
            if current.done:
                if current.status != "succeeded":
                    raise JobFailed(200, f"embed_{current.status}", current.error or f"embed job {current.status}")
                return current
            if time.monotonic() > deadline:
                raise TimeoutError(f"embed job {current.id} still {current.status} after {timeout:g} s")
            yield Sleep(poll)

    # ------------------------------------------------------------------ import by reference

    def import_items(self, pool_id: str, source: str) -> Call[ImportJob]:
        # Not idempotent: a re-sent request would queue a second import (harmless, an upsert, but twice the work).
        return Call("POST", f"/v1/pools/{pool_id}/items:import", json={"source": source}, parse=_model(ImportJob))

    def get_import(self, pool_id: str, import_id: str) -> Call[ImportJob]:
        return Call("GET", f"/v1/pools/{pool_id}/imports/{import_id}", parse=_model(ImportJob))

    def imports(self, pool_id: str, *, limit: int = 20) -> Call[list[ImportJob]]:
        return Call("GET", f"/v1/pools/{pool_id}/imports", params={"limit": limit}, parse=_list(ImportJob, "imports"))

    def wait_import(
        self, pool_id: str, job: ImportJob | str, *, timeout: float = 3600.0, poll: float = 0.5
    ) -> Gen[ImportJob]:
        job_id = _id(job)
        deadline = time.monotonic() + timeout
        while True:
            current: ImportJob = yield self.get_import(pool_id, job_id)
            if current.done:
                if current.status != "succeeded":
                    raise JobFailed(200, f"import_{current.status}", current.error or f"import {current.status}")
                return current
            if time.monotonic() > deadline:
                raise TimeoutError(f"import {current.id} still {current.status} after {timeout:g} s")
            yield Sleep(poll)

    # ------------------------------------------------------------------ Label Studio

    def connect_labelstudio(
        self, pool_id: str, url: str, token: str, project_id: int, **options: Any
    ) -> Call[Integration]:
        body = {"url": url, "token": token, "project_id": project_id, **options}
        return Call("POST", f"/v1/pools/{pool_id}/integrations/labelstudio", json=body, parse=_model(Integration))

    def integrations(self, pool_id: str) -> Call[list[Integration]]:
        return Call("GET", f"/v1/pools/{pool_id}/integrations", parse=_list(Integration, "integrations"))

    def integration(self, pool_id: str, integration_id: str) -> Call[Integration]:
        return Call("GET", f"/v1/pools/{pool_id}/integrations/{integration_id}", parse=_model(Integration))

    def delete_integration(self, pool_id: str, integration_id: str) -> Call[None]:
        return Call("DELETE", f"/v1/pools/{pool_id}/integrations/{integration_id}", parse=_none)

    def reconcile(self, pool_id: str, integration_id: str) -> Call[Reconcile]:
        # The service reuses a run already waiting, so a re-sent request queues no second one.
        return Call(
            "POST",
            f"/v1/pools/{pool_id}/integrations/{integration_id}/reconcile",
            parse=_model(Reconcile),
            idempotent=True,
        )

    def reconcile_run(self, pool_id: str, integration_id: str, run_id: str) -> Call[Reconcile]:
        return Call(
            "GET",
            f"/v1/pools/{pool_id}/integrations/{integration_id}/reconciles/{run_id}",
            parse=_model(Reconcile),
        )

    def reconciles(self, pool_id: str, integration_id: str, *, limit: int = 50) -> Call[list[Reconcile]]:
        return Call(
            "GET",
            f"/v1/pools/{pool_id}/integrations/{integration_id}/reconciles",
            params={"limit": limit},
            parse=_list(Reconcile, "reconciles"),
        )

    def rotate_integration_secret(self, pool_id: str, integration_id: str) -> Call[SecretRotated]:
        return Call(
            "POST",
            f"/v1/pools/{pool_id}/integrations/{integration_id}/rotate-secret",
            parse=_model(SecretRotated),
        )

    # ------------------------------------------------------------------ webhooks

    def add_webhook(
        self,
        pool_id: str,
        url: str,
        events: Sequence[str] = ("batch.succeeded", "batch.failed"),
        secret: str | None = None,
    ) -> Call[Webhook]:
        body: dict[str, Any] = {"url": url, "events": list(events)}
        if secret:
            body["secret"] = secret
        return Call("POST", f"/v1/pools/{pool_id}/webhooks", json=body, parse=_model(Webhook))

    def webhooks(self, pool_id: str) -> Call[list[Webhook]]:
        return Call("GET", f"/v1/pools/{pool_id}/webhooks", parse=_list(Webhook, "webhooks"))

    def webhook(self, pool_id: str, webhook_id: str) -> Call[Webhook]:
        return Call("GET", f"/v1/pools/{pool_id}/webhooks/{webhook_id}", parse=_model(Webhook))

    def delete_webhook(self, pool_id: str, webhook_id: str) -> Call[None]:
        return Call("DELETE", f"/v1/pools/{pool_id}/webhooks/{webhook_id}", parse=_none)

    def deliveries(self, pool_id: str, webhook_id: str, *, limit: int = 50) -> Call[list[Delivery]]:
        return Call(
            "GET",
            f"/v1/pools/{pool_id}/webhooks/{webhook_id}/deliveries",
            params={"limit": limit},
            parse=_list(Delivery, "deliveries"),
        )


def _collect(op: Gen[None]) -> Gen[list[Any]]:
    """Run an emitting operation inside another one; the values it emitted."""
    out: list[Any] = []
    value: Any = None
    error: BaitError | None = None
    while True:
        try:
            step = op.throw(error) if error is not None else op.send(value)
        except StopIteration:
            return out
        value, error = None, None
        if isinstance(step, Emit):
            out.append(step.value)
            continue
        try:
            value = yield step
        except BaitError as exc:
            error = exc


def _json_chunks(rows: Sequence[Mapping[str, Any]], limits: Limits) -> Iterable[list[dict[str, Any]]]:
    """Consecutive runs of ``rows`` with at most ``max_items_per_request`` rows and a JSON body under
    ``max_json_bytes`` each."""
    budget = JSON_HEADROOM * limits.max_json_bytes
    chunk: list[dict[str, Any]] = []
    size = 0
    for row in rows:
        n = len(json.dumps(row, separators=(",", ":"))) + 1
        if chunk and (len(chunk) >= limits.max_items_per_request or size + n > budget):
            yield chunk
            chunk, size = [], 0
        chunk.append(dict(row))
        size += n
    if chunk:
        yield chunk

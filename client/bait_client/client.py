"""A synchronous, typed client of bait-service (httpx)."""

from __future__ import annotations

import io
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import httpx
import numpy as np

from bait_client.models import (
    Batch,
    Checkpoint,
    Delivery,
    Integration,
    Item,
    ItemPage,
    LabelsResult,
    Pool,
    Predictions,
    UpsertResult,
    Webhook,
)

JSON_CHUNK = 5_000  # items per JSON request when uploading lists


class StageBar:
    """A progress bar per stage of a job: labelled with the stage running now, counting to that stage's
    total (none shown while the stage has not reported one yet)."""

    def __init__(self, enabled: bool = True, file: Any = None) -> None:
        self.enabled = enabled
        self.file = file
        self.stage: str | None = None
        self._bar: Any = None

    def show(self, stage: str, done: int, total: int) -> None:
        from tqdm import tqdm

        if self._bar is None or stage != self.stage:
            self.close()
            self.stage = stage
            self._bar = tqdm(
                total=total or None, desc=stage, unit="step", disable=not self.enabled, leave=False, file=self.file
            )
        elif total and self._bar.total != total:
            self._bar.reset(total=total)
        self._bar.n = min(done, total) if total else done
        self._bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class BaitError(Exception):
    """The service answered with an error body ``{"error": {"code", "message", "details"}}``."""

    def __init__(self, status_code: int, code: str, message: str, details: Any = None) -> None:
        super().__init__(f"{status_code} {code}: {message}")
        self.status_code = status_code
        self.code = code
        self.message = message
        self.details = details


class BatchFailed(BaitError):
    """:meth:`Client.wait` saw the batch end ``failed`` or ``cancelled``."""


class Client:
    """``Client("http://127.0.0.1:8000", api_key="...")``; also a context manager."""

    def __init__(
        self, base_url: str, api_key: str, *, timeout: float = 60.0, http_client: httpx.Client | None = None
    ) -> None:
        """``http_client``: an httpx.Client of your own (proxies, TLS, or a test client); its base URL is kept."""
        if http_client is None:
            http_client = httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout)
        http_client.headers["Authorization"] = f"Bearer {api_key}"
        self._http = http_client

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ plumbing

    def _request(self, method: str, path: str, **kwargs: Any) -> Any:
        r = self._http.request(method, path, **kwargs)
        if r.status_code >= 400:
            try:
                err = r.json()["error"]
                raise BaitError(r.status_code, err.get("code", "error"), err.get("message", r.text), err.get("details"))
            except (ValueError, KeyError, TypeError):
                raise BaitError(r.status_code, "http_error", r.text[:500]) from None
        if r.status_code == 204 or not r.content:
            return None
        return r.json()

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
    ) -> Pool:
        """A classification pool (give ``classes``) or a regression pool (give ``n_outputs``)."""
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
        return Pool.model_validate(self._request("POST", "/v1/pools", json=body))

    def pool(self, pool_id: str) -> Pool:
        return Pool.model_validate(self._request("GET", f"/v1/pools/{pool_id}"))

    def pools(self) -> list[Pool]:
        return [Pool.model_validate(p) for p in self._request("GET", "/v1/pools")["pools"]]

    def delete_pool(self, pool_id: str) -> None:
        self._request("DELETE", f"/v1/pools/{pool_id}")

    # ------------------------------------------------------------------ items

    def upload(self, pool_id: str, data: Any, ids: Sequence[str] | None = None) -> UpsertResult:
        """Upsert items with embeddings, idempotent by id.

        Args:
            data: an ``n x d`` numpy array (with ``ids``), a pandas DataFrame with columns ``id`` and
                ``embedding`` (lists), or a pyarrow Table with the same columns. Arrays and tables go to
                the bulk endpoint as one .npz / Parquet body.
            ids: the ``n`` item ids of a numpy array.
        """
        if isinstance(data, np.ndarray):
            if ids is None or len(ids) != data.shape[0]:
                raise ValueError("give one id per row of the array")
            buf = io.BytesIO()
            np.savez(buf, ids=np.asarray([str(i) for i in ids]), embeddings=data)
            return self._bulk(pool_id, buf.getvalue(), "npz")
        module = type(data).__module__
        if module.startswith("pandas"):
            import pyarrow as pa

            columns = ["id", "embedding"] + (["data"] if "data" in data.columns else [])  # data: JSON strings
            data = pa.Table.from_pandas(data[columns], preserve_index=False)
            module = "pyarrow"
        if module.startswith("pyarrow"):
            import pyarrow.parquet as pq

            buf = io.BytesIO()
            pq.write_table(data, buf)
            return self._bulk(pool_id, buf.getvalue(), "parquet")
        raise TypeError(f"upload takes a numpy array, a pandas DataFrame or a pyarrow Table, not {type(data)}")

    def _bulk(self, pool_id: str, body: bytes, fmt: str) -> UpsertResult:
        out = self._request(
            "POST",
            f"/v1/pools/{pool_id}/items:bulk",
            params={"format": fmt},
            content=body,
            headers={"Content-Type": "application/octet-stream"},
        )
        return UpsertResult.model_validate(out)

    def add_items(self, pool_id: str, items: Sequence[Mapping[str, Any]]) -> UpsertResult:
        """Upsert ``[{"id", "embedding" | "uri" | "text", "data"?}]`` as JSON, in chunks (``data``: the item's
        content shown to annotators, a JSON object)."""
        created = updated = 0
        job: str | None = None
        for begin in range(0, len(items), JSON_CHUNK):
            out = UpsertResult.model_validate(
                self._request(
                    "POST", f"/v1/pools/{pool_id}/items", json={"items": list(items[begin : begin + JSON_CHUNK])}
                )
            )
            created, updated, job = created + out.created, updated + out.updated, out.embed_job_id or job
        return UpsertResult(created=created, updated=updated, embed_job_id=job)

    def items(
        self, pool_id: str, status: str | None = None, *, page_size: int = 1000, include_embedding: bool = False
    ) -> Iterator[Item]:
        """Every item (of a status), following the cursor; with their embeddings if asked."""
        cursor: str | None = None
        while True:
            params: dict[str, Any] = {"limit": page_size}
            if include_embedding:
                params["include_embedding"] = "true"
            if status:
                params["status"] = status
            if cursor:
                params["cursor"] = cursor
            page = ItemPage.model_validate(self._request("GET", f"/v1/pools/{pool_id}/items", params=params))
            yield from page.items
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    # ------------------------------------------------------------------ labels

    def label(
        self, pool_id: str, labels: Mapping[str, str | Sequence[float]], *, annotator: str | None = None
    ) -> LabelsResult:
        """``{item_id: class name}`` (classification) or ``{item_id: [targets]}`` (regression)."""
        rows = [
            {"item_id": k, "label": v} if isinstance(v, str) else {"item_id": k, "target": [float(x) for x in v]}
            for k, v in labels.items()
        ]
        body: dict[str, Any] = {"labels": rows}
        if annotator:
            body["annotator"] = annotator
        return LabelsResult.model_validate(self._request("PUT", f"/v1/pools/{pool_id}/labels", json=body))

    def delete_label(self, pool_id: str, item_id: str) -> None:
        self._request("DELETE", f"/v1/pools/{pool_id}/labels/{item_id}")

    # ------------------------------------------------------------------ batches

    def request_batch(
        self,
        pool_id: str,
        size: int,
        strategy: str = "bait",
        params: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
    ) -> Batch:
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        body = {"size": size, "strategy": strategy, "params": dict(params or {})}
        return Batch.model_validate(self._request("POST", f"/v1/pools/{pool_id}/batches", json=body, headers=headers))

    def batch(self, pool_id: str, batch_id: str) -> Batch:
        return Batch.model_validate(self._request("GET", f"/v1/pools/{pool_id}/batches/{batch_id}"))

    def wait(
        self, pool_id: str, batch: Batch | str, *, timeout: float = 3600.0, poll: float = 0.5, progress: bool = True
    ) -> Batch:
        """Poll until the batch is done, with a progress bar (stage, done/total); returns it when it succeeded.

        Raises:
            BatchFailed: it failed or was cancelled (the message is the batch's error).
            TimeoutError: not done within ``timeout`` seconds.
        """
        batch_id = batch if isinstance(batch, str) else batch.id
        deadline = time.monotonic() + timeout
        bar = StageBar(enabled=progress)
        try:
            while True:
                current = self.batch(pool_id, batch_id)
                p = current.progress
                bar.show(p.stage or current.status, p.done, p.total)
                if current.done:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(f"batch {batch_id} still {current.status} after {timeout:g} s")
                time.sleep(poll)
        finally:
            bar.close()
        if current.status != "succeeded":
            raise BatchFailed(200, f"batch_{current.status}", current.error or f"batch {current.status}")
        return current

    def cancel_batch(self, pool_id: str, batch_id: str) -> Batch:
        return Batch.model_validate(self._request("POST", f"/v1/pools/{pool_id}/batches/{batch_id}/cancel"))

    # ------------------------------------------------------------------ model

    def predictions(self, pool_id: str, item_ids: Sequence[str]) -> Predictions:
        out = self._request("POST", f"/v1/pools/{pool_id}/predictions", json={"item_ids": list(item_ids)})
        return Predictions.model_validate(out)

    def checkpoints(self, pool_id: str) -> list[Checkpoint]:
        return [
            Checkpoint.model_validate(c)
            for c in self._request("GET", f"/v1/pools/{pool_id}/checkpoints")["checkpoints"]
        ]

    # ------------------------------------------------------------------ Label Studio and webhooks

    def connect_labelstudio(self, pool_id: str, url: str, token: str, project_id: int, **options: Any) -> Integration:
        """Connect a Label Studio project; the answer carries ``ml_backend_url`` (with its secret) once."""
        body = {"url": url, "token": token, "project_id": project_id, **options}
        return Integration.model_validate(
            self._request("POST", f"/v1/pools/{pool_id}/integrations/labelstudio", json=body)
        )

    def integration(self, pool_id: str, integration_id: str) -> Integration:
        return Integration.model_validate(self._request("GET", f"/v1/pools/{pool_id}/integrations/{integration_id}"))

    def reconcile(self, pool_id: str, integration_id: str) -> str:
        """Queue a reconcile (annotations read back from Label Studio); returns the run id
        (see :meth:`reconcile_run`)."""
        out = self._request("POST", f"/v1/pools/{pool_id}/integrations/{integration_id}/reconcile")
        return str(out["id"])

    def reconcile_run(self, pool_id: str, integration_id: str, run_id: str) -> dict[str, Any]:
        """A reconcile: ``status`` (queued | running | succeeded | failed), ``counts``, ``error``."""
        out: dict[str, Any] = self._request(
            "GET", f"/v1/pools/{pool_id}/integrations/{integration_id}/reconciles/{run_id}"
        )
        return out

    def add_webhook(
        self,
        pool_id: str,
        url: str,
        events: Sequence[str] = ("batch.succeeded", "batch.failed"),
        secret: str | None = None,
    ) -> Webhook:
        body: dict[str, Any] = {"url": url, "events": list(events)}
        if secret:
            body["secret"] = secret
        return Webhook.model_validate(self._request("POST", f"/v1/pools/{pool_id}/webhooks", json=body))

    def deliveries(self, pool_id: str, webhook_id: str) -> list[Delivery]:
        out = self._request("GET", f"/v1/pools/{pool_id}/webhooks/{webhook_id}/deliveries")
        return [Delivery.model_validate(d) for d in out["deliveries"]]

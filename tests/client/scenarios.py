"""Scenarios written once for both clients: every call goes through :func:`aw` (awaited when the client
is the AsyncClient) and every iterator through :func:`collect`, so the sync :class:`Client` and the
:class:`AsyncClient` run the same code against the same live service."""

from __future__ import annotations

import asyncio
import inspect
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import numpy as np
from bait_client import AsyncClient, Client, RetryPolicy

KINDS = ["sync", "async"]
AnyClient = Client | AsyncClient


async def aw(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def collect(it: Any) -> list[Any]:
    if hasattr(it, "__aiter__"):
        return [x async for x in it]
    return list(it)


def run(
    kind: str,
    url: str,
    key: str,
    scenario: Callable[[Any], Awaitable[Any]],
    *,
    retry: RetryPolicy | bool | None = None,
    statuses: list[int] | None = None,
    requests: list[tuple[str, str]] | None = None,
    timeout: float = 60.0,
) -> Any:
    """Run ``scenario(client)`` with a client of ``kind`` on ``url``; every answer's status is appended to
    ``statuses`` and every request's (method, path) to ``requests`` (httpx event hooks: nothing mocked)."""

    def on_response(r: httpx.Response) -> None:
        if statuses is not None:
            statuses.append(r.status_code)

    def on_request(r: httpx.Request) -> None:
        if requests is not None:
            requests.append((r.method, r.url.path))

    async def main() -> Any:
        if kind == "sync":
            hooks: dict[str, list[Any]] = {"response": [on_response], "request": [on_request]}
            http = httpx.Client(base_url=url, timeout=timeout, event_hooks=hooks)
            with Client(url, key, retry=retry, http_client=http) as bait:
                return await scenario(bait)

        async def a_response(r: httpx.Response) -> None:
            on_response(r)

        async def a_request(r: httpx.Request) -> None:
            on_request(r)

        ahttp = httpx.AsyncClient(base_url=url, timeout=timeout, event_hooks={"response": [a_response],
                                                                              "request": [a_request]})  # fmt: skip
        async with AsyncClient(url, key, retry=retry, http_client=ahttp) as abait:
            return await scenario(abait)

    return asyncio.run(main())


def blobs(n: int, d: int = 8, seed: int = 0) -> tuple[np.ndarray, list[str], list[str]]:
    """``n x d`` float32 embeddings of two blobs, their ids and class names ``a`` / ``b``."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, size=n)
    X = (np.where(y[:, None] == 0, 2.0, -2.0) + rng.normal(0, 1, size=(n, d))).astype(np.float32)
    return X, [f"it-{i:05d}" for i in range(n)], ["ab"[int(c)] for c in y]


async def labeling_loop(
    bait: Any, rounds: int, *, n: int = 60, size: int = 3, on_round: Callable[[int], None] | None = None
) -> tuple[str, list[str]]:
    """An ordinary loop: pool, upload, seed labels, then ``rounds`` x (request a batch, wait, label it).
    Checks at the end that every label is stored and that each request made exactly one batch."""
    X, ids, names = blobs(n)
    label_of = dict(zip(ids, names, strict=True))
    pool = await aw(bait.create_pool(f"loop-{uuid.uuid4().hex[:6]}", classes=["a", "b"], embedding_dim=X.shape[1]))
    assert (await aw(bait.upload(pool.id, X, ids=ids, progress=False))).created == n
    await aw(bait.label(pool.id, {i: label_of[i] for i in ids[:4]}))
    labeled = set(ids[:4])
    made: list[str] = []
    for r in range(rounds):
        if on_round is not None:
            on_round(r)
        batch = await aw(bait.request_batch(pool.id, size=size, strategy="random", params={"seed": r}))
        done = await aw(bait.wait(pool.id, batch, poll=0.05, progress=False, timeout=180))
        assert done.item_ids is not None and len(done.item_ids) == size
        made.append(done.id)
        assert (await aw(bait.label(pool.id, {i: label_of[i] for i in done.item_ids}))).labeled == size
        labeled.update(done.item_ids)
    stored = await aw(bait.pool(pool.id))
    assert stored.counts.labeled == len(labeled) == 4 + rounds * size
    listed = await collect(bait.batches(pool.id, page_size=2))
    assert sorted(b.id for b in listed) == sorted(made), "one batch per request, no more"
    labels = {it.id: it.label for it in await collect(bait.items(pool.id, status="labeled", page_size=7))}
    assert labels == {i: label_of[i] for i in labeled}
    return pool.id, made

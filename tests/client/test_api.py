"""Every client method against a live service, for the sync and the async client: what it returns is
what the service stored, and errors arrive as the typed exception of their code with the service's
message and details."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from bait_client import (
    BaitError,
    Conflict,
    Curve,
    InsufficientScope,
    NotFound,
    UnknownItem,
    ValidationError,
)

from service.db import session_scope
from service.domain.keys import create_key
from tests.client.conftest import LiveFactory
from tests.client.scenarios import KINDS, aw, blobs, collect, run
from tests.fake_labelstudio import fake_labelstudio

pytestmark = pytest.mark.slow


async def _pool_with_a_batch(bait: Any, n: int = 40) -> tuple[Any, Any, dict[str, str]]:
    X, ids, names = blobs(n)
    label_of = dict(zip(ids, names, strict=True))
    pool = await aw(bait.create_pool(f"api-{uuid.uuid4().hex[:6]}", classes=["a", "b"], embedding_dim=X.shape[1]))
    up = await aw(
        bait.add_items(
            pool.id, [{"id": i, "embedding": x.tolist(), "data": {"text": i}} for i, x in zip(ids, X, strict=True)]
        )
    )
    assert (up.created, up.updated) == (n, 0)
    await aw(bait.label(pool.id, {i: label_of[i] for i in ids[:10]}, annotator="ann"))
    # a model-based strategy with enough labels: the batch trains a head (a checkpoint, a curve point, a map)
    requested = await aw(bait.request_batch(pool.id, 4, "margin"))
    batch = await aw(bait.wait(pool.id, requested, poll=0.05, progress=False))
    assert batch.checkpoint_id is not None
    return pool, batch, label_of


@pytest.mark.parametrize("kind", KINDS)
def test_pools_items_labels_batches_and_the_model(kind: str, live: Any) -> None:
    async def scenario(bait: Any) -> None:
        pool, batch, label_of = await _pool_with_a_batch(bait)
        assert pool.id in [p.id for p in await aw(bait.pools())]
        assert (await aw(bait.pool(pool.id))).counts.reserved == 4
        item = await aw(bait.item(pool.id, batch.item_ids[0], include_embedding=True))
        assert item.status == "reserved" and item.batch_id == batch.id and len(item.embedding) == 8
        assert item.data == {"text": item.id}
        # the split
        assert await aw(bait.move_items(pool.id, ["it-00030", "it-00031"], "validation")) == 2
        assert (await aw(bait.item(pool.id, "it-00030"))).split == "validation"
        updated = await aw(bait.update_pool(pool.id, validation={"fraction": 0.2, "seed": 1}))
        assert updated.validation == {"fraction": 0.2, "seed": 1}
        assert updated.validation_counts.items == 2
        # labels and their history
        await aw(bait.label(pool.id, {"it-00000": "b"}))
        await aw(bait.delete_label(pool.id, "it-00000", annotator="ann"))
        history = await aw(bait.label_history(pool.id, "it-00000"))
        assert [(e.value, e.deleted) for e in history.history] == [
            (label_of["it-00000"], False),
            ("b", False),
            (None, True),
        ]
        # batches: one page at a time, cancel, redelivery only of succeeded batches
        second = await aw(bait.request_batch(pool.id, 2, "random"))
        assert (await aw(bait.cancel_batch(pool.id, second.id))).status in ("cancelled", "succeeded")
        assert {b.id for b in await collect(bait.batches(pool.id, page_size=1))} == {batch.id, second.id}
        assert [b.id for b in await collect(bait.batches(pool.id, status="succeeded"))] == [batch.id]
        assert (await aw(bait.redeliver_batch(pool.id, batch.id))).id == batch.id
        # the model: checkpoints, predictions, the validation curve and the map
        checkpoints = await aw(bait.checkpoints(pool.id))
        assert [c.id for c in checkpoints] == [batch.checkpoint_id]
        preds = await aw(bait.predictions(pool.id, ["it-00010", "it-00011"]))
        assert [p.item_id for p in preds.predictions] == ["it-00010", "it-00011"]
        curve = await aw(bait.curve(pool.id))
        assert isinstance(curve, Curve) and [p.checkpoint_id for p in curve.points] == [batch.checkpoint_id]
        drawn = await aw(bait.pool_map(pool.id))
        assert drawn.checkpoint_id == batch.checkpoint_id and drawn.n_points > 0
        # embed jobs: none ran on a pool of embeddings
        assert await aw(bait.embed_jobs(pool.id)) == []
        with pytest.raises(NotFound):
            await aw(bait.embed_job(pool.id))
        assert await aw(bait.encoders()) == []
        await aw(bait.delete_pool(pool.id))
        with pytest.raises(NotFound):
            await aw(bait.pool(pool.id))

    run(kind, live.url, live.key, scenario)


@pytest.mark.parametrize("kind", KINDS)
def test_stateless_selection_answers_directly_or_through_its_job(kind: str, live_service: LiveFactory) -> None:
    X, _, _ = blobs(200)
    probs = np.full((200, 2), 0.5)

    async def scenario(bait: Any) -> tuple[Any, Any]:
        strategies = await aw(bait.strategies())
        assert {"bait", "random", "margin"} <= set(strategies.names()) and strategies.defaults
        small = await aw(bait.select(X[:20], 3, "margin", probs=probs[:20], params={"seed": 0}))
        big = await aw(bait.select(X, 5, "random", labeled=[0, 1], reserved=[2], params={"seed": 0}, poll=0.05))
        again = await aw(bait.selection(big.id))
        assert again.indices == big.indices
        return small, big

    with live_service(sync_select_max_cells=1000) as live:  # 200 x 8 cells: above it, a job to poll
        small, big = run(kind, live.url, live.key, scenario)
    assert small.status == "succeeded" and len(small.indices) == 3
    assert big.status == "succeeded" and len(big.indices) == 5 and not {0, 1, 2} & set(big.indices)


@pytest.mark.parametrize("kind", KINDS)
def test_webhooks_and_label_studio(kind: str, live_service: LiveFactory) -> None:
    async def scenario(bait: Any, ls: Any) -> None:
        pool, _, _ = await _pool_with_a_batch(bait)
        hook = await aw(bait.add_webhook(pool.id, "http://127.0.0.1:9/hook", events=["batch.succeeded"]))
        assert hook.secret and len(hook.secret) >= 16
        assert [w.id for w in await aw(bait.webhooks(pool.id))] == [hook.id]
        assert (await aw(bait.webhook(pool.id, hook.id))).secret is None  # shown once
        assert await aw(bait.deliveries(pool.id, hook.id)) == []
        await aw(bait.delete_webhook(pool.id, hook.id))
        with pytest.raises(NotFound):
            await aw(bait.webhook(pool.id, hook.id))

        integ = await aw(
            bait.connect_labelstudio(pool.id, ls.url, ls.token, 7, choice_map={"ant": "a", "bee": "b", "cat": "b"})
        )
        assert integ.ml_backend_url and integ.secret
        assert [i.id for i in await aw(bait.integrations(pool.id))] == [integ.id]
        assert (await aw(bait.integration(pool.id, integ.id))).project_id == 7
        run_ = await aw(bait.reconcile(pool.id, integ.id))
        assert (await aw(bait.reconcile_run(pool.id, integ.id, run_.id))).id == run_.id
        listed = await aw(bait.reconciles(pool.id, integ.id))
        assert run_.id in [r.id for r in listed] and all(r.trigger in ("api", "connect") for r in listed)
        rotated = await aw(bait.rotate_integration_secret(pool.id, integ.id))
        assert rotated.secret != integ.secret and rotated.ml_backend_url.endswith(rotated.secret)
        await aw(bait.delete_integration(pool.id, integ.id))
        assert await aw(bait.integrations(pool.id)) == []

    with fake_labelstudio() as ls, live_service(outbound_allow="127.0.0.1") as live:
        run(kind, live.url, live.key, lambda bait: scenario(bait, ls))


@pytest.mark.parametrize("kind", KINDS)
def test_errors_are_typed_and_carry_the_services_code_message_and_details(kind: str, live: Any, db: Any) -> None:
    with session_scope(db) as s:
        reader, _ = create_key(s, "acme", scopes=["read"])

    async def scenario(bait: Any) -> list[BaitError]:
        seen: list[BaitError] = []
        pool = await aw(bait.create_pool(f"err-{uuid.uuid4().hex[:6]}", classes=["a", "b"], embedding_dim=2))
        await aw(bait.add_items(pool.id, [{"id": f"i{i}", "embedding": [float(i), 1.0]} for i in range(6)]))
        attempts = [
            lambda: bait.pool("nope"),
            lambda: bait.label(pool.id, {"missing": "a"}),
            lambda: bait.create_pool("bad", classes=["a", "b"], embedding_dim=0),
        ]
        await aw(bait.request_batch(pool.id, 2, "random", idempotency_key="k-1"))
        attempts.append(lambda: bait.request_batch(pool.id, 3, "random", idempotency_key="k-1"))
        for attempt in attempts:
            try:
                await aw(attempt())
            except BaitError as exc:
                seen.append(exc)
        return seen

    errors = run(kind, live.url, live.key, scenario)
    assert [type(e) for e in errors] == [NotFound, UnknownItem, ValidationError, Conflict]
    assert [e.status_code for e in errors] == [404, 400, 422, 409]
    assert [e.code for e in errors] == ["not_found", "unknown_item", "validation_error", "conflict"]
    assert "missing" in errors[1].message and errors[2].details[0]["loc"][-1] == "embedding_dim"
    assert "batch_id" in errors[3].details

    async def as_reader(bait: Any) -> None:
        await aw(bait.create_pool("nope", classes=["a", "b"], embedding_dim=2))

    with pytest.raises(InsufficientScope) as err:
        run(kind, live.url, reader, as_reader)
    assert err.value.status_code == 403 and err.value.details["required_scope"] == "select"
    assert isinstance(err.value, BaitError)


@pytest.mark.parametrize("kind", KINDS)
def test_a_label_only_key_labels_through_the_client(kind: str, live: Any, db: Any) -> None:
    """An annotation tool's key cannot read the limits (`read` scope); the client then plans its requests
    with the service's defaults instead of failing."""
    with session_scope(db) as s:
        labeler, _ = create_key(s, "acme", scopes=["label"])

    async def setup(bait: Any) -> str:
        pool = await aw(bait.create_pool(f"lab-{uuid.uuid4().hex[:6]}", classes=["a", "b"], embedding_dim=2))
        await aw(bait.add_items(pool.id, [{"id": f"i{i}", "embedding": [float(i), 1.0]} for i in range(4)]))
        return str(pool.id)

    pool_id = run(kind, live.url, live.key, setup)
    out = run(kind, live.url, labeler, lambda bait: aw(bait.label(pool_id, {"i0": "a", "i1": "b"})))
    assert out.labeled == 2


@pytest.mark.parametrize("kind", KINDS)
def test_import_by_reference_through_the_client(kind: str, live_service: LiveFactory, client_data_root: Path) -> None:
    """The request is checked by the api (an object store is a typed 400 before any job); a good source is
    queued, listed and imported (by the app's runner, or by the client tests' `bait worker`, which shares the
    data root); an unknown import is a NotFound. (The job's failures: tests/service/test_import.py.)"""
    folder = client_data_root / "acme" / f"{kind}-{uuid.uuid4().hex[:6]}"
    folder.mkdir(parents=True)

    async def scenario(bait: Any) -> tuple[Any, Any, Any, list[Any], BaitError, BaitError]:
        pool = await aw(bait.create_pool(f"imp-{uuid.uuid4().hex[:6]}", classes=["a", "b"], embedding_dim=2))
        try:
            await aw(bait.import_items(pool.id, "s3://bucket/ds/*.parquet"))
            raise AssertionError("s3:// was accepted")
        except BaitError as exc:
            refused = exc
        pq.write_table(pa.table({"id": ["x", "y"], "embedding": [[1.0, 2.0], [3.0, 4.0]]}), folder / "p.parquet")
        job = await aw(bait.import_items(pool.id, f"file://{folder}/p.parquet"))
        done = await aw(bait.wait_import(pool.id, job, timeout=120, poll=0.1))
        listed = await aw(bait.imports(pool.id))
        items = await aw(bait.pool(pool.id))
        try:
            await aw(bait.get_import(pool.id, "nope"))
            raise AssertionError("an unknown import was found")
        except BaitError as exc:
            missing = exc
        return job, done, items, listed, refused, missing

    with live_service(data_root=client_data_root) as live:
        job, done, pool, listed, refused, missing = run(kind, live.url, live.key, scenario)
    assert refused.status_code == 400 and refused.code == "invalid_source" and "s3://" in refused.message
    assert job.source.endswith("/p.parquet") and job.status in ("queued", "running", "succeeded")
    assert done.id == job.id and done.status == "succeeded" and done.rows_imported == 2, done
    assert pool.counts.items == 2
    assert [j.id for j in listed] == [job.id]
    assert isinstance(missing, NotFound)

"""bait-client against the real app (over the TestClient's transport): the tour's calls, typed results,
errors as BaitError, signature verification that agrees with the server, no server dependencies."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from bait_client import BaitError, Batch, Client, Pool, verify_signature
from fastapi.testclient import TestClient

from service.domain.webhooks import sign
from tests.client.conftest import CLIENT
from tests.service.test_checkpoints import _while_jobs_run


@pytest.fixture
def bait(client: TestClient, api_key: str) -> Iterator[Client]:
    with Client("http://testserver", api_key, http_client=client) as c:
        yield c


def blobs(n: int, d: int = 8, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, size=n)
    X = (np.where(y[:, None] == 0, 2.0, -2.0) + rng.normal(0, 1, size=(n, d))).astype(np.float32)
    return X, y


def test_tour_pool_upload_label_batch_predict(bait: Client, run_jobs: Any) -> None:
    pool = bait.create_pool("tour", classes=["pos", "neg"], embedding_dim=8)
    assert isinstance(pool, Pool) and pool.task == "classification"
    X, y = blobs(60)
    ids = [f"doc-{i}" for i in range(60)]
    up = bait.upload(pool.id, X, ids=ids)
    assert (up.created, up.updated) == (60, 0)
    assert bait.label(pool.id, {ids[i]: ["pos", "neg"][int(y[i])] for i in range(8)}).labeled == 8
    requested = bait.request_batch(pool.id, size=5, strategy="bait")
    assert isinstance(requested, Batch) and requested.status == "queued"
    run_jobs()
    batch = bait.wait(pool.id, requested, progress=True, poll=0.01)
    assert batch.status == "succeeded" and batch.item_ids is not None and len(batch.item_ids) == 5
    assert batch.progress.stage == "done" and batch.checkpoint_id is not None
    reserved = {it.id for it in bait.items(pool.id, status="reserved", page_size=2)}
    assert reserved == set(batch.item_ids)
    preds = _while_jobs_run(run_jobs, lambda: bait.predictions(pool.id, ids[50:55]))
    assert preds.checkpoint_id == batch.checkpoint_id and [p.item_id for p in preds.predictions] == ids[50:55]
    assert all(p.probs is not None and p.label in ("pos", "neg") for p in preds.predictions)
    assert bait.pool(pool.id).counts.labeled == 8 and [c.id for c in bait.checkpoints(pool.id)] == [batch.checkpoint_id]


def test_upload_from_pyarrow_table(bait: Client) -> None:
    import pyarrow as pa

    pool = bait.create_pool("frames", n_outputs=1, embedding_dim=4)
    assert pool.task == "regression"
    X, _ = blobs(10, d=4)
    table = pa.table({"id": [f"b{i}" for i in range(10)], "embedding": [list(map(float, r)) for r in X]})
    assert bait.upload(pool.id, table).created == 10
    again = bait.upload(pool.id, table)
    assert again.created == 0
    assert bait.label(pool.id, {"b0": [1.5]}).labeled == 1
    assert bait.pool(pool.id).counts.items == 10 and bait.pool(pool.id).counts.labeled == 1


def test_upload_from_pandas_dataframe_stores_the_embeddings(bait: Client) -> None:
    import pandas as pd

    pool = bait.create_pool("frame", classes=["a", "b"], embedding_dim=4)
    X, _ = blobs(12, d=4)
    frame = pd.DataFrame({"id": [f"p{i}" for i in range(12)], "embedding": [list(map(float, r)) for r in X]})
    frame["extra"] = 1  # other columns are ignored
    assert bait.upload(pool.id, frame).created == 12
    stored = {it.id: it.embedding for it in bait.items(pool.id, include_embedding=True)}
    assert sorted(stored) == sorted(frame["id"])
    for i, row in enumerate(X):
        np.testing.assert_array_equal(np.asarray(stored[f"p{i}"], dtype=np.float32), row.astype(np.float32))
    with pytest.raises(KeyError):
        bait.upload(pool.id, frame.drop(columns=["embedding"]))


def test_errors_are_bait_errors_with_code_and_message(bait: Client) -> None:
    with pytest.raises(BaitError) as err:
        bait.pool("nope")
    assert err.value.status_code == 404 and err.value.code == "not_found"
    pool = bait.create_pool("errs", classes=["a", "b"], embedding_dim=2)
    with pytest.raises(BaitError) as err:
        bait.label(pool.id, {"missing": "a"})
    assert err.value.code == "unknown_item" and "missing" in err.value.message
    with pytest.raises(ValueError):
        bait.upload(pool.id, np.zeros((2, 2), np.float32), ids=["x"])


def test_wait_raises_when_the_batch_is_cancelled(bait: Client) -> None:
    pool = bait.create_pool("cancel", classes=["a", "b"], embedding_dim=2)
    bait.upload(pool.id, np.eye(2, dtype=np.float32).repeat(5, axis=0), ids=[f"i{i}" for i in range(10)])
    batch = bait.request_batch(pool.id, size=2, strategy="random")
    bait.cancel_batch(pool.id, batch.id)
    from bait_client import BatchFailed

    with pytest.raises(BatchFailed):
        bait.wait(pool.id, batch.id, progress=False, poll=0.01, timeout=30)


def test_client_verifies_server_signatures() -> None:
    body = b'{"event":"batch.succeeded"}'
    ts = int(time.time())
    header = sign("a-secret-of-16-chars", ts, body)
    assert verify_signature("a-secret-of-16-chars", body, str(ts), header)
    assert not verify_signature("a-secret-of-16-chars", body + b"x", str(ts), header)
    assert not verify_signature(
        "a-secret-of-16-chars", body, str(ts - 3600), sign("a-secret-of-16-chars", ts - 3600, body)
    )


def test_client_imports_no_server_dependencies() -> None:
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import bait_client; "
        "bad = [m for m in ('fastapi', 'sqlalchemy', 'torch', 'service', 'worker', 'selection') if m in sys.modules]; "
        "assert not bad, bad"
    )
    out = subprocess.run([sys.executable, "-c", code, str(CLIENT)], capture_output=True, text=True, cwd="/")
    assert out.returncode == 0, out.stderr


def test_progress_bar_labels_the_current_stage_with_its_own_total() -> None:
    import io

    from bait_client.client import StageBar

    out = io.StringIO()
    bar = StageBar(file=out)

    def shown() -> str:  # the bar as the terminal shows it now: the text after the last carriage return
        return out.getvalue().rsplit("\r", 1)[-1]

    bar.show("queued", 0, 0)
    assert shown().startswith("queued")
    bar.show("train", 70, 500)
    assert shown().startswith("train") and "70/500" in shown()
    bar.show("select", 0, 0)  # a stage that has not reported its total yet: no stale 500 from train
    assert shown().startswith("select") and "500" not in shown()
    bar.show("select", 9, 62)
    assert shown().startswith("select") and "9/62" in shown()
    bar.show("store", 0, 20)
    assert shown().startswith("store") and "0/20" in shown() and "62" not in shown()
    bar.close()

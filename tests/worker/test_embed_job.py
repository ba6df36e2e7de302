"""The embed job through the API on both backends: references resolved, per-item errors listed,
counts, items in error never selected, re-embedding when the encoder changes."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.store.models import EmbedJob, Item
from tests.conftest import RunJobs

D = 4


@pytest.fixture
def settings(settings: Settings, tmp_path: Path) -> Settings:
    root = tmp_path / "data"
    (root / "acme").mkdir(parents=True)  # the folder of tenant acme (the `auth` key's tenant)
    return settings.model_copy(update={"data_root": root, "encode_batch_size": 8, "download_timeout_seconds": 2.0})


def save_npy(path: Path, arr: np.ndarray) -> str:
    np.save(path, arr)
    return f"file://{path}"


def make_pool(client: TestClient, auth: dict[str, str], encoder: dict[str, Any] | None, dim: int = D) -> str:
    body: dict[str, Any] = {
        "name": "refs",
        "task": "classification",
        "classes": ["a", "b"],
        "embedding_dim": dim,
        "head": {"kind": "linear"},
    }
    if encoder is not None:
        body["encoder"] = encoder
    resp = client.post("/v1/pools", json=body, headers=auth)
    assert resp.status_code == 201, resp.text
    return str(resp.json()["id"])


def items_by_id(client: TestClient, auth: dict[str, str], pool: str, **params: Any) -> dict[str, dict[str, Any]]:
    resp = client.get(f"/v1/pools/{pool}/items", params={"limit": 1000, **params}, headers=auth)
    assert resp.status_code == 200, resp.text
    return {it["id"]: it for it in resp.json()["items"]}


def latest_job(client: TestClient, auth: dict[str, str], pool: str) -> dict[str, Any]:
    resp = client.get(f"/v1/pools/{pool}/embed", headers=auth)
    assert resp.status_code == 200, resp.text
    out: dict[str, Any] = resp.json()
    return out


def test_identity_pool_embeds_files_and_marks_bad_references(
    client: TestClient, auth: dict[str, str], settings: Settings, run_jobs: RunJobs, db: sessionmaker[Session]
) -> None:
    assert settings.data_root is not None
    root = settings.data_root / "acme"
    rng = np.random.default_rng(0)
    vectors = rng.standard_normal((20, D)).astype(np.float32)
    items = [{"id": f"v{i}", "uri": save_npy(root / f"v{i}.npy", vectors[i])} for i in range(20)]
    (root / "bad.npy").write_bytes(b"not an npy file")
    np.save(root / "wrong.npy", np.zeros(D + 1, np.float32))
    items += [
        {"id": "missing", "uri": f"file://{root}/nope.npy"},
        {"id": "corrupt", "uri": f"file://{root}/bad.npy"},
        {"id": "wrongdim", "uri": f"file://{root}/wrong.npy"},
        {"id": "escape", "uri": f"file://{root}/../outside.npy"},
        {"id": "loopback", "uri": "http://127.0.0.1:9/v.npy"},
    ]
    pool = make_pool(client, auth, {"kind": "identity"})
    resp = client.post(f"/v1/pools/{pool}/items", json={"items": items}, headers=auth)
    assert resp.status_code == 200, resp.text
    assert resp.json()["created"] == 25 and resp.json()["embed_job_id"]
    pending = items_by_id(client, auth, pool)
    assert {it["embedding_status"] for it in pending.values()} <= {"pending", "ready"}

    run_jobs(until=lambda: latest_job(client, auth, pool)["status"] in ("succeeded", "failed"))
    job = latest_job(client, auth, pool)
    assert job["status"] == "succeeded", job
    assert job["counts"] == {"embedded": 20, "errors": 5, "skipped": 0, "total": 25}
    assert job["progress"] == {"stage": "done", "done": 25, "total": 25}

    listed = items_by_id(client, auth, pool)
    assert listed["missing"]["embedding_status"] == "error"
    assert "file not found" in listed["missing"]["embedding_error"]
    assert "unreadable .npy" in listed["corrupt"]["embedding_error"]
    assert "expected (4,)" in listed["wrongdim"]["embedding_error"]
    assert "outside the data root" in listed["escape"]["embedding_error"]
    assert "loopback" in listed["loopback"]["embedding_error"]
    errors = items_by_id(client, auth, pool, embedding_status="error")
    assert set(errors) == {"missing", "corrupt", "wrongdim", "escape", "loopback"}

    # stored float32 with the encoder's name and version
    with db() as s:
        rows = {it.external_id: it for it in s.execute(select(Item).where(Item.pool_id == pool)).scalars()}
    np.testing.assert_array_equal(np.frombuffer(rows["v3"].embedding or b"", "<f4"), vectors[3])
    assert rows["v3"].embedding_source == "identity@1"

    counts = client.get(f"/v1/pools/{pool}", headers=auth).json()["embedding_counts"]
    assert counts == {"ready": 20, "pending": 0, "error": 5}

    # Items in error are never selected: a batch of all 20 ready items is possible, 21 is not.
    too_many = client.post(f"/v1/pools/{pool}/batches", json={"size": 21, "strategy": "random"}, headers=auth)
    assert too_many.status_code == 400, too_many.text
    resp = client.post(f"/v1/pools/{pool}/batches", json={"size": 20, "strategy": "random"}, headers=auth)
    assert resp.status_code == 202, resp.text
    batch_id = resp.json()["id"]

    def batch() -> dict[str, Any]:
        out: dict[str, Any] = client.get(f"/v1/pools/{pool}/batches/{batch_id}", headers=auth).json()
        return out

    run_jobs(until=lambda: batch()["status"] in ("succeeded", "failed"))
    assert batch()["status"] == "succeeded", batch()
    assert set(batch()["item_ids"]) == {f"v{i}" for i in range(20)}


def test_fixing_a_reference_and_retrying_embeds_it(
    client: TestClient, auth: dict[str, str], settings: Settings, run_jobs: RunJobs
) -> None:
    assert settings.data_root is not None
    root = settings.data_root / "acme"
    pool = make_pool(client, auth, {"kind": "identity"})
    uri = f"file://{root}/late.npy"
    client.post(f"/v1/pools/{pool}/items", json={"items": [{"id": "late", "uri": uri}]}, headers=auth)
    run_jobs(until=lambda: latest_job(client, auth, pool)["status"] == "succeeded")
    assert items_by_id(client, auth, pool)["late"]["embedding_status"] == "error"
    np.save(root / "late.npy", np.ones(D, np.float32))
    resp = client.post(f"/v1/pools/{pool}/embed", headers=auth)
    assert resp.status_code == 202, resp.text
    job_id = resp.json()["id"]
    run_jobs(until=lambda: client.get(f"/v1/pools/{pool}/embed/{job_id}", headers=auth).json()["status"] == "succeeded")
    assert client.get(f"/v1/pools/{pool}/embed/{job_id}", headers=auth).json()["counts"]["embedded"] == 1
    assert items_by_id(client, auth, pool)["late"]["embedding_status"] == "ready"


def test_changing_the_encoder_re_embeds_every_reference(
    client: TestClient, auth: dict[str, str], settings: Settings, run_jobs: RunJobs, db: sessionmaker[Session]
) -> None:
    assert settings.data_root is not None
    root = settings.data_root / "acme"
    pool = make_pool(client, auth, {"kind": "identity"})
    items = [{"id": f"v{i}", "uri": save_npy(root / f"v{i}.npy", np.full(D, i, np.float32))} for i in range(5)]
    client.post(f"/v1/pools/{pool}/items", json={"items": items}, headers=auth)
    posted = client.post(
        f"/v1/pools/{pool}/items", json={"items": [{"id": "direct", "embedding": [1.0] * D}]}, headers=auth
    )
    assert posted.status_code == 200
    run_jobs(until=lambda: latest_job(client, auth, pool)["status"] == "succeeded")

    # a TorchScript encoder on .npy arrays: doubles the vector
    class Double(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return 2.0 * x

    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(Double()), buf)
    up = client.post(
        "/v1/encoders",
        files={"file": ("double.pt", buf.getvalue(), "application/octet-stream")},
        data={"name": "double", "config": '{"input": "array", "output_dim": 4}'},
        headers=auth,
    )
    assert up.status_code == 201, up.text
    resp = client.patch(
        f"/v1/pools/{pool}", json={"encoder": {"kind": "torchscript", "model_id": up.json()["id"]}}, headers=auth
    )
    assert resp.status_code == 200, resp.text
    assert resp.json()["encoder"]["kind"] == "torchscript"
    assert resp.json()["embedding_counts"]["pending"] == 5  # the posted embedding is untouched
    run_jobs(until=lambda: latest_job(client, auth, pool)["status"] == "succeeded")
    assert latest_job(client, auth, pool)["counts"]["embedded"] == 5
    with db() as s:
        rows = {it.external_id: it for it in s.execute(select(Item).where(Item.pool_id == pool)).scalars()}
        jobs = s.execute(select(EmbedJob).where(EmbedJob.pool_id == pool)).scalars().all()
    assert len(jobs) == 2
    np.testing.assert_array_equal(np.frombuffer(rows["v3"].embedding or b"", "<f4"), np.full(D, 6.0))
    assert (rows["v3"].embedding_source or "").startswith(f"torchscript:{up.json()['id']}@")
    assert rows["direct"].embedding_status == "ready" and rows["direct"].embedding_source is None

    # the encoder is in use: it cannot be deleted
    assert client.delete(f"/v1/encoders/{up.json()['id']}", headers=auth).status_code == 409


def test_reference_items_need_an_encoder_and_a_known_scheme(client: TestClient, auth: dict[str, str]) -> None:
    pool = make_pool(client, auth, None)
    resp = client.post(f"/v1/pools/{pool}/items", json={"items": [{"id": "a", "uri": "file:///x.npy"}]}, headers=auth)
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_reference"
    client.patch(f"/v1/pools/{pool}", json={"encoder": {"kind": "identity"}}, headers=auth)
    resp = client.post(f"/v1/pools/{pool}/items", json={"items": [{"id": "a", "uri": "gopher://x/y"}]}, headers=auth)
    assert resp.status_code == 400 and "unsupported uri scheme" in resp.json()["error"]["message"]
    resp = client.post(f"/v1/pools/{pool}/items", json={"items": [{"id": "a", "text": "hello"}]}, headers=auth)
    assert resp.status_code == 400 and "text-minilm" in resp.json()["error"]["message"]
    resp = client.post(
        f"/v1/pools/{pool}/items",
        json={"items": [{"id": "a", "uri": "file:///x", "embedding": [1, 2, 3, 4]}]},
        headers=auth,
    )
    assert resp.status_code == 422
    with_items = client.get(f"/v1/pools/{pool}", headers=auth).json()["counts"]["items"]
    assert with_items == 0


def test_text_minilm_needs_384_dimensions(client: TestClient, auth: dict[str, str]) -> None:
    resp = client.post(
        "/v1/pools",
        json={
            "name": "t",
            "task": "classification",
            "classes": ["a", "b"],
            "embedding_dim": 8,
            "encoder": {"kind": "text-minilm"},
        },
        headers=auth,
    )
    assert resp.status_code == 422 and "384" in resp.json()["error"]["message"]

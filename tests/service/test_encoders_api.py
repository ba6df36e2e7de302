"""Encoder uploads: stored per tenant with their input config, size-limited, zip-checked, deletable
when unused; pool encoder configs validated against them."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.store.models import EncoderModel


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"max_encoder_bytes": 64 * 1024})


def module_bytes(out_dim: int = 8) -> bytes:
    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(torch.nn.Linear(4, out_dim)), buf)
    return buf.getvalue()


def upload(client: TestClient, auth: dict[str, str], data: bytes, config: dict[str, object] | None = None) -> Any:
    fields = {"name": "enc"}
    if config is not None:
        fields["config"] = json.dumps(config)
    return client.post(
        "/v1/encoders", files={"file": ("m.pt", data, "application/octet-stream")}, data=fields, headers=auth
    )


def test_upload_stores_module_and_config_per_tenant(
    client: TestClient, auth: dict[str, str], other_auth: dict[str, str], db: sessionmaker[Session]
) -> None:
    data = module_bytes()
    resp = upload(client, auth, data, {"input": "array", "output_dim": 8})
    assert resp.status_code == 201, resp.text
    body = resp.json()
    assert body["kind"] == "torchscript" and body["size_bytes"] == len(data) and body["name"] == "enc"
    assert body["config"]["input"] == "array" and body["config"]["output_dim"] == 8
    with db() as s:
        row = s.execute(select(EncoderModel)).scalar_one()
        assert row.data == data and len(row.sha256) == 64
    listed = client.get("/v1/encoders", headers=auth).json()["encoders"]
    assert [e["id"] for e in listed] == [body["id"]]
    assert client.get("/v1/encoders", headers=other_auth).json()["encoders"] == []
    assert client.get(f"/v1/encoders/{body['id']}", headers=other_auth).status_code == 404
    assert client.delete(f"/v1/encoders/{body['id']}", headers=other_auth).status_code == 404
    assert client.delete(f"/v1/encoders/{body['id']}", headers=auth).status_code == 204
    assert client.get("/v1/encoders", headers=auth).json()["encoders"] == []


def test_upload_over_the_size_limit_is_refused(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session]
) -> None:
    resp = upload(client, auth, b"PK\x03\x04" + b"0" * (64 * 1024))
    assert resp.status_code == 413, resp.text
    assert resp.json()["error"]["code"] == "payload_too_large"
    with db() as s:
        assert s.execute(select(EncoderModel)).first() is None


def test_upload_that_is_not_a_torchscript_archive_is_refused(client: TestClient, auth: dict[str, str]) -> None:
    resp = upload(client, auth, b"import os; os.system('boom')")
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_file"


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"input": "video"}, "config.input"),
        ({"image_mode": "L", "mean": [0.1, 0.2, 0.3]}, "needs 1 value"),
        ({"std": [1.0, 0.0, 1.0]}, "positive"),
        ({"image_size": [0, 28]}, "config.image_size"),
    ],
)
def test_upload_config_is_validated(
    client: TestClient, auth: dict[str, str], config: dict[str, object], message: str
) -> None:
    resp = upload(client, auth, module_bytes(), config)
    assert resp.status_code == 422, resp.text
    assert message in resp.json()["error"]["message"]


def test_pool_encoder_must_exist_and_fit_the_pool(
    client: TestClient, auth: dict[str, str], other_auth: dict[str, str]
) -> None:
    enc = upload(client, auth, module_bytes(8), {"input": "array", "output_dim": 8}).json()
    base = {"name": "p", "task": "classification", "classes": ["a", "b"], "head": {"kind": "linear"}}
    wrong_dim = client.post(
        "/v1/pools",
        json={**base, "embedding_dim": 16, "encoder": {"kind": "torchscript", "model_id": enc["id"]}},
        headers=auth,
    )
    assert wrong_dim.status_code == 422 and "produces 8 values" in wrong_dim.json()["error"]["message"]
    foreign = client.post(
        "/v1/pools",
        json={**base, "embedding_dim": 8, "encoder": {"kind": "torchscript", "model_id": enc["id"]}},
        headers=other_auth,
    )
    assert foreign.status_code == 404
    ok = client.post(
        "/v1/pools",
        json={**base, "embedding_dim": 8, "encoder": {"kind": "torchscript", "model_id": enc["id"]}},
        headers=auth,
    )
    assert ok.status_code == 201, ok.text
    assert ok.json()["encoder"] == {"kind": "torchscript", "model_id": enc["id"]}
    in_use = client.delete(f"/v1/encoders/{enc['id']}", headers=auth)
    assert in_use.status_code == 409 and ok.json()["id"] in in_use.json()["error"]["message"]
    # switching the pool to another encoder frees it
    assert (
        client.patch(f"/v1/pools/{ok.json()['id']}", json={"encoder": {"kind": "identity"}}, headers=auth).status_code
        == 200
    )
    assert client.delete(f"/v1/encoders/{enc['id']}", headers=auth).status_code == 204
    missing_model = client.post(
        "/v1/pools", json={**base, "name": "q", "embedding_dim": 8, "encoder": {"kind": "torchscript"}}, headers=auth
    )
    assert missing_model.status_code == 422

"""An image pool end to end: MNIST digits written as PNG files, a small TorchScript CNN uploaded as the
pool's encoder, the files referenced by file:// URIs, embedded by the worker, and a BAIT batch selected."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from PIL import Image

from service.config import Settings
from tests.conftest import RunJobs, shared_data

N = 300
EMB = 32


@pytest.fixture
def settings(settings: Settings, tmp_path: Path) -> Settings:
    root = tmp_path / "images"
    (root / "acme").mkdir(parents=True)  # the folder of tenant acme (the `auth` key's tenant)
    return settings.model_copy(update={"data_root": root, "encode_batch_size": 64})


class SmallCNN(torch.nn.Module):
    """N x 1 x 28 x 28 -> N x 32."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = torch.nn.Conv2d(8, 16, 3, padding=1)
        self.fc = torch.nn.Linear(16 * 7 * 7, EMB)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def torchscript_bytes(module: torch.nn.Module) -> bytes:
    torch.manual_seed(0)
    buf = io.BytesIO()
    torch.jit.save(torch.jit.script(module.eval()), buf)
    return buf.getvalue()


def test_mnist_png_pool_with_uploaded_cnn_selects_a_batch(
    client: TestClient, auth: dict[str, str], settings: Settings, run_jobs: RunJobs
) -> None:
    assert settings.data_root is not None
    root = settings.data_root / "acme"
    with np.load(shared_data("mnist10k.npz"), allow_pickle=False) as data:
        X, y = data["X"], data["y"]
    rows = np.random.default_rng(0).permutation(X.shape[0])[:N]
    for i in rows:
        Image.fromarray(X[i]).save(root / f"digit_{i}.png")
    (root / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\nnot really")

    torch.manual_seed(0)
    up = client.post(
        "/v1/encoders",
        files={"file": ("cnn.pt", torchscript_bytes(SmallCNN()), "application/octet-stream")},
        data={
            "name": "mnist-cnn",
            "config": '{"input": "image", "image_mode": "L", "image_size": [28, 28], '
            '"mean": [0.1307], "std": [0.3081], "output_dim": 32}',
        },
        headers=auth,
    )
    assert up.status_code == 201, up.text
    pool_resp = client.post(
        "/v1/pools",
        json={
            "name": "digits",
            "task": "classification",
            "classes": [str(c) for c in range(10)],
            "embedding_dim": EMB,
            "head": {"kind": "linear"},
            "encoder": {"kind": "torchscript", "model_id": up.json()["id"]},
        },
        headers=auth,
    )
    assert pool_resp.status_code == 201, pool_resp.text
    pool = pool_resp.json()["id"]
    items: list[dict[str, Any]] = [{"id": f"d{i}", "uri": f"file://{root}/digit_{i}.png"} for i in rows]
    items += [{"id": "broken", "uri": f"file://{root}/broken.png"}, {"id": "gone", "uri": f"file://{root}/gone.png"}]
    resp = client.post(f"/v1/pools/{pool}/items", json={"items": items}, headers=auth)
    assert resp.status_code == 200, resp.text

    def job() -> dict[str, Any]:
        out: dict[str, Any] = client.get(f"/v1/pools/{pool}/embed", headers=auth).json()
        return out

    run_jobs(until=lambda: job()["status"] in ("succeeded", "failed"), timeout=120)
    assert job()["status"] == "succeeded", job()
    assert job()["counts"] == {"embedded": N, "errors": 2, "skipped": 0, "total": N + 2}
    errors = client.get(f"/v1/pools/{pool}/items", params={"embedding_status": "error"}, headers=auth).json()["items"]
    assert {it["id"]: "unreadable image" in it["embedding_error"] for it in errors} == {"broken": True, "gone": False}
    assert "file not found" in next(it["embedding_error"] for it in errors if it["id"] == "gone")

    # the stored embedding is the module applied to (pixel/255 - mean)/std, N x 1 x 28 x 28
    first = rows[0]
    got = np.asarray(
        client.get(f"/v1/pools/{pool}/items/d{first}", params={"include_embedding": True}, headers=auth).json()[
            "embedding"
        ]
    )
    module = torch.jit.load(io.BytesIO(torchscript_bytes(SmallCNN())))
    x = (torch.from_numpy(X[first].astype(np.float32) / 255.0)[None, None] - 0.1307) / 0.3081
    with torch.no_grad():
        want = module(x)[0].numpy()
    del module
    # torchscript_bytes re-seeds, so both uploads hold the same weights
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)

    # label a seed set, then BAIT picks a batch among the embedded digits only
    seed_rows = rows[:20]
    labels = [{"item_id": f"d{i}", "label": str(int(y[i]))} for i in seed_rows]
    assert client.put(f"/v1/pools/{pool}/labels", json={"labels": labels}, headers=auth).status_code == 200
    resp = client.post(f"/v1/pools/{pool}/batches", json={"size": 10, "strategy": "bait"}, headers=auth)
    assert resp.status_code == 202, resp.text
    batch_id = resp.json()["id"]

    def batch() -> dict[str, Any]:
        out: dict[str, Any] = client.get(f"/v1/pools/{pool}/batches/{batch_id}", headers=auth).json()
        return out

    run_jobs(until=lambda: batch()["status"] in ("succeeded", "failed"), timeout=120)
    assert batch()["status"] == "succeeded", batch()
    chosen = batch()["item_ids"]
    assert len(chosen) == 10 and len(set(chosen)) == 10
    assert set(chosen) <= {f"d{i}" for i in rows[20:]}

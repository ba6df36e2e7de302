"""Encoders that cannot escape: the operator allowlist at upload, and the child process encoders run in.

- A module reading a host file (``torch.from_file``), in ``forward``, a submodule, a second method,
  ``__setstate__`` or a hook, is refused at upload (400 ``encoder_rejected`` naming the operator)
  and nothing is stored; a real CNN (scripted or traced) and attention layers are accepted.
- The forward pass runs in a child process without secrets or database, in a temporary folder,
  under an address-space limit; an encoder that allocates too much or loops forever fails its items
  with a clear error within the limit, and the API keeps answering meanwhile.
"""

from __future__ import annotations

import io
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from fastapi.testclient import TestClient
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.domain.encoders import check_torchscript
from service.errors import EncoderRejected
from service.store.models import EncoderModel
from tests.conftest import RunJobs
from worker.embed import encode_chunk
from worker.encoder_process import EncoderLimitExceeded, EncoderProcess
from worker.encoders import make_encoder
from worker.torchscript_check import allowed, check_module

# The modules read /etc/hostname: any readable host file; the point is that they never get to read it.


def saved(module: torch.nn.Module | torch.jit.ScriptModule) -> bytes:
    scripted = module if isinstance(module, torch.jit.ScriptModule) else torch.jit.script(module)
    buf = io.BytesIO()
    torch.jit.save(scripted, buf)
    return buf.getvalue()


class ReadsFile(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        leaked = torch.from_file("/etc/hostname", size=4, dtype=torch.uint8).float()
        return x[:, :4] * 0 + leaked


class HiddenInner(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + torch.from_file("/etc/hostname", size=1, dtype=torch.uint8).float()


class HidesInSubmodule(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Identity(), HiddenInner())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class HidesInSecondMethod(torch.nn.Module):
    @torch.jit.export
    def leak(self, x: torch.Tensor) -> torch.Tensor:
        return torch.from_file("/etc/hostname", size=4, dtype=torch.uint8).float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class HidesInSetstate(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.state = 0

    @torch.jit.export
    def __getstate__(self) -> int:
        return self.state

    @torch.jit.export
    def __setstate__(self, state: int) -> None:
        self.training = False
        self.state = int(torch.from_file("/etc/hostname", size=1, dtype=torch.uint8).sum().item())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class Prints(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        print("hello from the encoder")
        return x


class SmallCNN(torch.nn.Module):
    """N x 1 x 28 x 28 -> N x 32, as in the image-pool end-to-end test, plus normalisation layers."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 16, 3, padding=1)
        self.pool = torch.nn.AdaptiveAvgPool2d(2)
        self.fc = torch.nn.Linear(64, 32)
        self.drop = torch.nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.nn.functional.max_pool2d(torch.relu(self.bn(self.conv1(x))), 2)
        x = self.pool(torch.nn.functional.gelu(self.conv2(x)))
        return torch.nn.functional.normalize(self.fc(self.drop(x.flatten(1))), dim=1)


class Attention(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x.reshape(x.shape[0], -1, 8)).mean(1)


class Hungry(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        big = torch.ones(2147483648, dtype=torch.float32)  # 8 GiB
        return x + big[:1]


class Forever(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        i = 0
        while i >= 0:
            i = i + 1
            x = x + 0.0
        return x


class Double(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2.0 * x


# ------------------------------------------------------------------------------------- the allowlist


@pytest.mark.parametrize(
    ("module", "operator", "where"),
    [
        (ReadsFile(), "aten::from_file", "method forward"),
        (HidesInSubmodule(), "aten::from_file", "forward"),
        (HidesInSecondMethod(), "aten::from_file", "method leak"),
        (Prints(), "prim::Print", "method forward"),
    ],
)
def test_allowlist_refuses_and_names_the_operator(module: torch.nn.Module, operator: str, where: str) -> None:
    refusal = check_module(torch.jit.script(module))
    assert refusal is not None
    assert refusal.operator == operator and where in refusal.where
    assert operator in refusal.message


def test_allowlist_finds_the_call_in_a_submodule_even_when_the_root_is_clean() -> None:
    scripted = torch.jit.script(HidesInSubmodule())
    # the submodule's own graph is checked too (not only what the root's forward inlines)
    assert check_module(scripted.body) is not None  # type: ignore[attr-defined]


def test_allowlist_checks_scripted_hooks() -> None:
    def hook(module: torch.nn.Module, inputs: tuple[torch.Tensor], output: torch.Tensor) -> torch.Tensor:
        return output + torch.from_file("/etc/hostname", size=1, dtype=torch.uint8).float()

    m = torch.nn.Linear(4, 4)
    m.register_forward_hook(hook)
    refusal = check_module(torch.jit.script(m))
    assert refusal is not None and refusal.operator == "aten::from_file" and "hook" in refusal.where


@pytest.mark.parametrize("kind", ["aten::save", "aten::set_", "prim::CallFunction", "prim::PythonOp", "foo::bar"])
def test_storage_file_and_python_ops_are_not_allowed(kind: str) -> None:
    assert not allowed(kind)


def test_allowlist_accepts_real_encoders() -> None:
    cnn = SmallCNN().eval()
    assert check_module(torch.jit.script(cnn)) is None
    assert check_module(torch.jit.trace(cnn, torch.randn(2, 1, 28, 28))) is None
    assert check_module(torch.jit.script(Attention().eval())) is None
    assert check_module(torch.jit.script(torch.nn.Linear(4, 2))) is None
    assert allowed("aten::relu_") and allowed("prim::If")


# --------------------------------------------------------------------------- the check at upload (API)


def upload(client: TestClient, auth: dict[str, str], data: bytes, config: str = '{"input": "array"}') -> Any:
    return client.post(
        "/v1/encoders",
        files={"file": ("m.pt", data, "application/octet-stream")},
        data={"config": config},
        headers=auth,
    )


@pytest.mark.parametrize(
    ("module", "where"),
    [
        (ReadsFile(), "method forward"),
        (HidesInSubmodule(), "forward"),
        (HidesInSecondMethod(), "method leak"),
        (HidesInSetstate(), "method __setstate__"),
    ],
)
def test_upload_of_a_file_reading_module_is_refused_and_nothing_stored(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], module: torch.nn.Module, where: str
) -> None:
    resp = upload(client, auth, saved(module))
    assert resp.status_code == 400, resp.text
    err = resp.json()["error"]
    assert err["code"] == "encoder_rejected"
    assert "aten::from_file" in err["message"]
    assert err["details"]["operator"] == "aten::from_file" and where in err["details"]["where"]
    assert client.get("/v1/encoders", headers=auth).json() == {"encoders": []}
    with db() as s:
        assert s.execute(select(EncoderModel)).first() is None


def test_upload_of_a_cnn_is_accepted(client: TestClient, auth: dict[str, str]) -> None:
    resp = upload(client, auth, saved(SmallCNN().eval()), '{"input": "image", "image_mode": "L", "output_dim": 32}')
    assert resp.status_code == 201, resp.text
    traced = torch.jit.trace(SmallCNN().eval(), torch.randn(1, 1, 28, 28))
    assert upload(client, auth, saved(traced)).status_code == 201
    assert len(client.get("/v1/encoders", headers=auth).json()["encoders"]) == 2


def test_upload_of_zip_that_is_not_torchscript_is_invalid_file(client: TestClient, auth: dict[str, str]) -> None:
    resp = upload(client, auth, b"PK\x03\x04" + b"\0" * 100)
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_file"


def test_check_runs_out_of_time_cleanly() -> None:
    with pytest.raises(EncoderRejected, match=r"within 0\.01 s"):
        check_torchscript(saved(Double()), timeout=0.01, memory_bytes=4 * 2**30)


# ------------------------------------------------------------------------------- the child process


@pytest.fixture
def secrets_in_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    values = {
        "BAIT_SECRET_KEY": "do-not-leak-0123456789abcdef",
        "BAIT_DATABASE_URL": "postgresql+psycopg://app:hunter2@127.0.0.1/bait",
        "BAIT_REDIS_URL": "redis://:hunter2@127.0.0.1:6379/0",
        "AWS_SECRET_ACCESS_KEY": "aws-do-not-leak",
    }
    for k, v in values.items():
        monkeypatch.setenv(k, v)
    yield values


def proc_environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def test_child_holds_no_secret_no_database_and_runs_in_a_temp_folder(
    secrets_in_env: dict[str, str], tmp_path: Path
) -> None:
    db_file = tmp_path / "bait.db"
    db_file.write_bytes(b"SQLite format 3\0")
    with open(db_file, "rb"):  # the parent holds the database open; the child must not inherit it
        proc = EncoderProcess(saved(Double()), "cpu", timeout=60, memory_bytes=3 * 2**30)
        try:
            out = proc.run(np.ones((2, 3), np.float32))
            np.testing.assert_array_equal(out, np.full((2, 3), 2.0))
            assert proc.proc is not None
            pid = proc.proc.pid
            env = proc_environ(pid)
            assert not [k for k in env if k.startswith("BAIT_")]
            for value in secrets_in_env.values():
                assert value not in "\0".join(f"{k}={v}" for k, v in env.items())
            assert os.path.realpath(f"/proc/{pid}/cwd") == os.path.realpath(str(proc.workdir))
            assert sorted(os.listdir(str(proc.workdir))) == ["model.pt", "stderr"]
            fds = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
            assert not [f for f in fds if f.endswith(".db") or str(tmp_path) in f], fds
            limits = Path(f"/proc/{pid}/limits").read_text()
            line = next(x for x in limits.splitlines() if x.startswith("Max address space"))
            # The cap is the budget on top of the interpreter with torch imported (a CUDA build of torch
            # maps GBs on import), so it lies between the budget and the budget plus torch's mappings.
            soft, hard = (int(v) for v in line.split()[3:5])
            assert soft == hard and 3 * 2**30 + 2**26 < soft < 3 * 2**30 + 16 * 2**30, line
        finally:
            proc.close()
    assert proc.workdir is None


def test_child_refuses_to_run_a_module_stored_before_the_upload_check() -> None:
    from worker.encoders import EncoderError

    proc = EncoderProcess(saved(HidesInSubmodule()), "cpu", timeout=60, memory_bytes=3 * 2**30)
    try:
        with pytest.raises(EncoderError, match="aten::from_file"):
            proc.run(np.ones((1, 4), np.float32))
    finally:
        proc.close()


def test_check_child_gets_the_same_clean_environment(secrets_in_env: dict[str, str]) -> None:
    from service.sandbox import child_env

    env = child_env("/tmp/x")
    assert not [k for k in env if k.startswith("BAIT_") or "SECRET" in k]
    assert env["HOME"] == "/tmp/x"


def test_encoder_that_allocates_too_much_fails_its_items_with_a_clear_error() -> None:
    enc = make_encoder(
        {"kind": "torchscript", "model_id": "m"},
        dim=3,
        device="cpu",
        batch_size=8,
        model=("m", saved(Hungry()), "sha-hungry", {"input": "array"}),
        timeout=60,
        memory_bytes=2 * 2**30,
    )
    try:
        t = time.monotonic()
        emb, err = encode_chunk(enc, [np.ones(3, np.float32)] * 3, dim=3)
        assert time.monotonic() - t < 60
    finally:
        enc.close()  # type: ignore[attr-defined]
    assert emb == [None, None, None]
    assert all(e is not None and "allocate" in e for e in err), err


def test_encoder_that_loops_forever_is_stopped_at_its_time_limit() -> None:
    proc = EncoderProcess(saved(Forever()), "cpu", timeout=2.0, memory_bytes=3 * 2**30)
    try:
        t = time.monotonic()
        with pytest.raises(EncoderLimitExceeded, match="time limit of 2 s"):
            proc.run(np.ones((1, 2), np.float32))
        assert time.monotonic() - t < 2.0 + 30  # start-up (torch import) plus the limit, not forever
        assert proc.proc is None  # killed
        # the next batch gets a fresh child (and the same limit)
        with pytest.raises(EncoderLimitExceeded):
            proc.run(np.ones((1, 2), np.float32))
    finally:
        proc.close()


# ---------------------------------------------------------------------- through the embed job (API)


@pytest.fixture
def settings(settings: Settings, tmp_path: Path) -> Settings:
    root = tmp_path / "data"
    root.mkdir()
    return settings.model_copy(
        update={
            "data_root": root,
            "encode_batch_size": 4,
            "encoder_timeout_seconds": 3.0,
            "encoder_memory_bytes": 2 * 2**30,
        }
    )


def embed_with(client: TestClient, auth: dict[str, str], settings: Settings, module: torch.nn.Module) -> str:
    assert settings.data_root is not None
    root = settings.data_root / "acme"  # file:// references are read from the tenant's own folder
    root.mkdir(exist_ok=True)
    up = upload(client, auth, saved(module), '{"input": "array", "output_dim": 4}')
    assert up.status_code == 201, up.text
    resp = client.post(
        "/v1/pools",
        json={
            "name": "refs",
            "task": "classification",
            "classes": ["a", "b"],
            "embedding_dim": 4,
            "encoder": {"kind": "torchscript", "model_id": up.json()["id"]},
        },
        headers=auth,
    )
    assert resp.status_code == 201, resp.text
    pool = str(resp.json()["id"])
    items = []
    for i in range(6):
        np.save(root / f"v{i}.npy", np.full(4, i, np.float32))
        items.append({"id": f"v{i}", "uri": f"file://{root / f'v{i}.npy'}"})
    assert client.post(f"/v1/pools/{pool}/items", json={"items": items}, headers=auth).status_code == 200
    return pool


def latest(client: TestClient, auth: dict[str, str], pool: str) -> dict[str, Any]:
    out: dict[str, Any] = client.get(f"/v1/pools/{pool}/embed", headers=auth).json()
    return out


@pytest.mark.parametrize(("module", "message"), [(Forever(), "time limit of 3 s"), (Hungry(), "allocate")])
def test_runaway_encoder_fails_its_items_and_the_api_keeps_answering(
    client: TestClient,
    auth: dict[str, str],
    settings: Settings,
    run_jobs: RunJobs,
    module: torch.nn.Module,
    message: str,
) -> None:
    pool = embed_with(client, auth, settings, module)
    done = threading.Event()
    latencies: list[float] = []

    def ping() -> None:  # the API answers while the encoder runs (jobs run in this thread: RQ wants the main one)
        while not done.is_set():
            t = time.monotonic()
            assert client.get("/healthz").status_code == 200
            latencies.append(time.monotonic() - t)
            time.sleep(0.2)

    pinger = threading.Thread(target=ping)
    pinger.start()
    try:
        run_jobs(until=lambda: latest(client, auth, pool)["status"] == "succeeded", timeout=240)
    finally:
        done.set()
        pinger.join()
    assert len(latencies) >= 5 and max(latencies) < 1.0, f"/healthz took up to {max(latencies):.2f} s"
    job = latest(client, auth, pool)
    assert job["counts"] == {"embedded": 0, "errors": 6, "skipped": 0, "total": 6}
    items = client.get(f"/v1/pools/{pool}/items", params={"limit": 100}, headers=auth).json()["items"]
    assert {it["embedding_status"] for it in items} == {"error"}
    assert all(message in it["embedding_error"] for it in items), items[0]


def test_legitimate_encoder_still_embeds_through_the_child(
    client: TestClient, auth: dict[str, str], settings: Settings, run_jobs: RunJobs, db: Any
) -> None:
    pool = embed_with(client, auth, settings, Double())
    run_jobs(until=lambda: latest(client, auth, pool)["status"] == "succeeded")
    assert latest(client, auth, pool)["counts"]["embedded"] == 6
    item = client.get(f"/v1/pools/{pool}/items/v3", params={"include_embedding": True}, headers=auth).json()
    assert item["embedding"] == [6.0] * 4

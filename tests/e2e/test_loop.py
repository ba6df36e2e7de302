"""End to end: the active-learning loop over HTTP against real processes.

Deployments: ``embedded`` (always): `bait serve` alone with its defaults (a SQLite file, the
in-process runner). ``workers`` (in the PostgreSQL + Redis pass, ``BAIT_TEST_REDIS_URL`` set): `bait
serve` and `bait worker` as separate processes on PostgreSQL and a private RQ queue.
"""

from __future__ import annotations

import io
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.conftest import REDIS_URL, shared_data
from tests.e2e.procs import Proc, bait, bait_env, serve, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

DIGITS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def mnist_pool(n: int = 2000, dim: int = 64, seed: int = 0) -> tuple[list[str], np.ndarray, list[str]]:
    """``n`` MNIST digits flattened and randomly projected to ``dim`` values, ids and digit names."""
    data = np.load(shared_data("mnist10k.npz"))
    rng = np.random.default_rng(seed)
    rows = rng.choice(data["X"].shape[0], size=n, replace=False)
    X = data["X"][rows].reshape(n, -1).astype(np.float32) / 255.0
    proj = rng.normal(0.0, 1.0 / np.sqrt(X.shape[1]), size=(X.shape[1], dim)).astype(np.float32)
    emb = X @ proj
    emb = (emb - emb.mean(axis=0)) / emb.std(axis=0)
    ids = [f"mnist-{int(r):05d}" for r in rows]
    return ids, emb.astype(np.float32), [DIGITS[int(d)] for d in data["y"][rows]]


DEPLOYMENTS = ["embedded", "workers"] if REDIS_URL else ["embedded"]


@pytest.fixture(params=DEPLOYMENTS)
def deployment(
    request: pytest.FixtureRequest, tmp_path: Path, database_url: str, db: Any
) -> Iterator[tuple[str, dict[str, str]]]:
    """``(base url, env)`` of a running deployment; the processes are stopped afterwards."""
    procs: list[Proc] = []
    if request.param == "workers":
        env = bait_env(database_url, REDIS_URL, f"bait-e2e-{uuid.uuid4().hex[:8]}")
        procs.append(Proc(["worker", "--name", f"e2e-{uuid.uuid4().hex[:6]}"], env, tmp_path / "worker.log"))
        server, base = serve(env, tmp_path / "serve.log")
    else:
        env = bait_env(f"sqlite:///{tmp_path / 'data' / 'bait.db'}", None, "bait")
        server, base = serve(env, tmp_path / "serve.log", migrate=True)
    procs.append(server)
    try:
        yield base, env
    finally:
        for p in procs:
            p.stop()


def _poll_batch(http: httpx.Client, url: str) -> dict[str, Any]:
    stages: list[str] = []

    def finished() -> dict[str, Any] | None:
        b: dict[str, Any] = http.get(url).json()
        if b["progress"]["stage"] not in stages:
            stages.append(b["progress"]["stage"])
        return b if b["status"] in ("succeeded", "failed", "cancelled") else None

    batch: dict[str, Any] = wait_for(finished, 180, f"batch {url} did not finish")
    batch["seen_stages"] = stages
    return batch


def test_active_learning_loop(deployment: tuple[str, dict[str, str]]) -> None:
    base, env = deployment
    key = bait("keys", "create", "--tenant", "e2e", env=env).strip().splitlines()[-1]
    http = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=120)

    ids, emb, names = mnist_pool()
    label_of = dict(zip(ids, names, strict=True))
    r = http.post(
        "/v1/pools",
        json={
            "name": "mnist",
            "task": "classification",
            "classes": DIGITS,
            "embedding_dim": 64,
            "head": {"kind": "mlp"},
        },
    )
    assert r.status_code == 201, r.text
    pool = r.json()["id"]

    buf = io.BytesIO()
    np.savez(buf, ids=np.asarray(ids), embeddings=emb)
    r = http.post(
        f"/v1/pools/{pool}/items:bulk", content=buf.getvalue(), headers={"Content-Type": "application/octet-stream"}
    )
    assert r.status_code == 200, r.text
    assert r.json()["created"] == 2000

    seed_ids = ids[:50]
    r = http.put(f"/v1/pools/{pool}/labels", json={"labels": [{"item_id": i, "label": label_of[i]} for i in seed_ids]})
    assert r.status_code == 200, r.text
    labeled = set(seed_ids)

    seen: set[str] = set()
    for round_ in (1, 2):
        t0 = time.monotonic()
        r = http.post(
            f"/v1/pools/{pool}/batches",
            json={"size": 20, "strategy": "bait"},
            headers={"Idempotency-Key": f"round-{round_}"},
        )
        assert r.status_code == 202, r.text
        batch = _poll_batch(http, r.headers["Location"])
        assert batch["status"] == "succeeded", batch["error"]
        chosen = batch["item_ids"]
        assert len(chosen) == 20 and len(set(chosen)) == 20
        assert not set(chosen) & labeled, "a labeled item was selected"
        assert not set(chosen) & seen, "an item of the previous batch was selected again"
        assert isinstance(batch["objective"], float)
        assert batch["progress"] == {"stage": "done", "done": 20, "total": 20}
        assert batch["diagnostics"]["n_labeled"] == len(labeled)
        print(f"round {round_}: batch in {time.monotonic() - t0:.1f} s, stages seen {batch['seen_stages']}, "
              f"timings {batch['diagnostics']['timings']}")  # fmt: skip
        # the items are reserved for us until labeled
        page = http.get(f"/v1/pools/{pool}/items", params={"status": "reserved"}).json()["items"]
        assert {i["id"] for i in page} == set(chosen)
        r = http.put(
            f"/v1/pools/{pool}/labels", json={"labels": [{"item_id": i, "label": label_of[i]} for i in chosen]}
        )
        assert r.status_code == 200, r.text
        labeled |= set(chosen)
        seen |= set(chosen)

    cps = http.get(f"/v1/pools/{pool}/checkpoints").json()["checkpoints"]
    assert [(c["round"], c["n_labels"]) for c in cps] == [(2, 70), (1, 50)]
    r = http.post(f"/v1/pools/{pool}/predictions", json={"item_ids": ids[1000:1200]})
    assert r.status_code == 200, r.text
    preds = r.json()["predictions"]
    accuracy = np.mean([p["label"] == label_of[p["item_id"]] for p in preds])
    assert accuracy > 0.5, accuracy  # 70 labels of 10 digits: far better than chance (0.1)

"""End to end against a real Label Studio 1.23.2 and a real `bait serve`, both on 127.0.0.1.

Run with `make test-labelstudio` (it creates .labelstudio-venv once with scripts/labelstudio_env.sh).
The loop: a text-classification project, a pool connected to it, Label Studio adds the service as its ML
backend (/health, /setup), a batch is imported as tasks with predictions, annotations made through Label
Studio's API come back as labels by webhook, one webhook is dropped on purpose (Label Studio's webhook
switched off) and reconcile recovers its label, and the next batch leaves the labeled items out.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from tests.e2e.procs import ROOT, Proc, bait, bait_env, free_port, serve, wait_for

pytestmark = pytest.mark.labelstudio

LS_BIN = Path(os.environ.get("LABELSTUDIO_VENV", ROOT / ".labelstudio-venv")) / "bin" / "label-studio"
CLASSES = ["positive", "negative"]
LABEL_CONFIG = """<View>
  <Text name="text" value="$text"/>
  <Choices name="sentiment" toName="text" choice="single">
    <Choice value="Positive"/><Choice value="Negative"/>
  </Choices>
</View>"""
CHOICE = {"positive": "Positive", "negative": "Negative"}


def log(msg: str, t0: float) -> None:
    print(f"[{time.monotonic() - t0:7.1f} s] {msg}", flush=True)


@pytest.fixture(scope="module")
def labelstudio(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """``(url, legacy token)`` of a fresh Label Studio."""
    assert LS_BIN.exists(), f"{LS_BIN} missing: run scripts/labelstudio_env.sh (make test-labelstudio does)"
    data = tmp_path_factory.mktemp("labelstudio")
    port = free_port()
    token = secrets.token_hex(20)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("BAIT_", "VIRTUAL_ENV"))},
        "SSRF_PROTECTION_ENABLED": "false",
        "ML_BLOCK_LOCAL_IP": "false",
        "LABEL_STUDIO_ENABLE_LEGACY_API_TOKEN": "true",
        "LABEL_STUDIO_BASE_DATA_DIR": str(data),
        "LABEL_STUDIO_DISABLE_SIGNUP_WITHOUT_LINK": "false",
        "COLLECT_ANALYTICS": "false",
    }
    out = (data / "labelstudio.log").open("ab")
    proc = subprocess.Popen(
        [str(LS_BIN), "start", "--no-browser", "--internal-host", "127.0.0.1", "--port", str(port),
         "--data-dir", str(data), "--username", "e2e@example.com", "--password", "e2e-password-1",
         "--user-token", token, "--enable-legacy-api-token"],
        env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError("Label Studio exited:\n" + (data / "labelstudio.log").read_text()[-4000:])
        try:
            return (
                httpx.get(f"{url}/api/projects/", headers={"Authorization": f"Token {token}"}, timeout=3).status_code
                == 200
            )
        except httpx.HTTPError:
            return False

    try:
        wait_for(up, 300, "Label Studio did not come up in 300 s")
        yield url, token
    finally:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
        out.close()


@pytest.fixture
def service(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """``(base url, api key)`` of an embedded `bait serve`."""
    # Label Studio listens on 127.0.0.1: the operator allowlist opens it (the README's local setup)
    env = bait_env(f"sqlite:///{tmp_path / 'data' / 'bait.db'}", None, "bait", outbound_allow="127.0.0.1")
    server, base = serve(env, tmp_path / "serve.log", migrate=True)
    procs: list[Proc] = [server]
    try:
        key = bait("keys", "create", "--tenant", "e2e", env=env).strip().splitlines()[-1]
        yield base, key
    finally:
        for p in procs:
            p.stop()
        print("--- bait serve log (tail) ---\n" + server.output()[-3000:])


def wait_batch(http: httpx.Client, pool: str, batch_id: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        b: dict[str, Any] = http.get(f"/v1/pools/{pool}/batches/{batch_id}").json()
        return b if b["status"] in ("succeeded", "failed", "cancelled") else None

    batch: dict[str, Any] = wait_for(done, 120, "batch did not finish")
    assert batch["status"] == "succeeded", batch["error"]
    return batch


def test_labelstudio_both_directions(labelstudio: tuple[str, str], service: tuple[str, str]) -> None:
    t0 = time.monotonic()
    ls_url, token = labelstudio
    base, key = service
    ls = httpx.Client(base_url=ls_url, headers={"Authorization": f"Token {token}"}, timeout=30)
    http = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=60)
    log("Label Studio and bait serve are up", t0)

    # a text-classification project in Label Studio
    r = ls.post("/api/projects/", json={"title": "bait e2e", "label_config": LABEL_CONFIG})
    assert r.status_code == 201, r.text
    project = r.json()["id"]

    # a pool with two well-separated classes; ids are short texts (items given by embedding show their id)
    rng = np.random.default_rng(0)
    n, d = 80, 8
    y = rng.integers(0, 2, size=n)
    X = (np.where(y[:, None] == 0, 2.0, -2.0) + rng.normal(0, 1, size=(n, d))).astype(np.float32)
    ids = [f"review {i:03d}: {'great film' if c == 0 else 'dull film'}" for i, c in enumerate(y)]
    truth = {i: CLASSES[int(c)] for i, c in zip(ids, y, strict=True)}
    pool_body = {"name": "reviews", "task": "classification", "classes": CLASSES, "embedding_dim": d,
                 "head": {"kind": "linear"}}  # fmt: skip
    r = http.post("/v1/pools", json=pool_body)
    assert r.status_code == 201, r.text
    pool = r.json()["id"]
    items = [{"id": i, "embedding": x.tolist()} for i, x in zip(ids, X, strict=True)]
    assert http.post(f"/v1/pools/{pool}/items", json={"items": items}).status_code == 200
    seed = [ids[i] for i in range(6)]
    r = http.put(f"/v1/pools/{pool}/labels", json={"labels": [{"item_id": i, "label": truth[i]} for i in seed]})
    assert r.status_code == 200, r.text

    # connect the pool (checked against the project's labeling config)
    r = http.post(
        f"/v1/pools/{pool}/integrations/labelstudio",
        json={"url": ls_url, "token": token, "project_id": project, "data_field": "text",
              "choice_map": {"Positive": "positive", "Negative": "negative"}},
    )  # fmt: skip
    assert r.status_code == 201, r.text
    integration = r.json()
    ml_url = integration["ml_backend_url"]
    log(f"pool connected; ML backend URL {ml_url.rsplit('/', 1)[0]}/<secret>", t0)

    # Label Studio adds the service as its ML backend (it calls /health and /setup)
    r = ls.post("/api/ml/", json={"project": project, "url": ml_url, "title": "bait"})
    assert r.status_code == 201, r.text
    assert r.json().get("state") in ("CO", "CONNECTED", None), r.json()
    # and a webhook for annotations (Label Studio's webhooks carry no auth header: the secret is in the URL)
    r = ls.post("/api/webhooks/", json={
        "project": project, "url": f"{ml_url}/webhook", "send_payload": True, "send_for_all_actions": False,
        "actions": ["ANNOTATION_CREATED", "ANNOTATION_UPDATED", "ANNOTATIONS_DELETED"],
    })  # fmt: skip
    assert r.status_code == 201, r.text
    hook = r.json()["id"]

    # a batch: its items appear in Label Studio as tasks, with predictions
    r = http.post(f"/v1/pools/{pool}/batches", json={"size": 4, "strategy": "bait"})
    assert r.status_code == 202, r.text
    batch = wait_batch(http, pool, r.json()["id"])
    first = batch["item_ids"]
    log(f"batch 1 succeeded: {first}", t0)

    def tasks() -> list[dict[str, Any]]:
        body = ls.get("/api/tasks/", params={"project": project, "fields": "all", "page_size": 100}).json()
        return list(body["tasks"])

    found = wait_for(lambda: (t := tasks()) and len(t) == 4 and t, 60, lambda: f"tasks not imported: {tasks()}")
    assert sorted(t["data"]["item_id"] for t in found) == sorted(first)
    assert all(t["data"]["text"] == t["data"]["item_id"] for t in found)
    preds = [p for t in found for p in t.get("predictions", [])]
    assert len(preds) == 4 and {p["model_version"] for p in preds} == {batch["checkpoint_id"]}
    assert all(p["result"][0]["value"]["choices"][0] in ("Positive", "Negative") for p in preds)
    log("4 tasks in Label Studio, each with a prediction of the batch's checkpoint", t0)

    # annotate three through Label Studio's API: labels arrive by webhook
    def annotate(task: dict[str, Any]) -> None:
        choice = CHOICE[truth[task["data"]["item_id"]]]
        result = [{"from_name": "sentiment", "to_name": "text", "type": "choices", "value": {"choices": [choice]}}]
        r = ls.post(f"/api/tasks/{task['id']}/annotations/", json={"result": result, "was_cancelled": False})
        assert r.status_code == 201, r.text

    def label_of(ext: str) -> str | None:
        r = http.get(f"/v1/pools/{pool}/items", params={"status": "labeled", "limit": 1000})
        return {i["id"]: i["label"] for i in r.json()["items"]}.get(ext)

    for task in found[:3]:
        annotate(task)
    for task in found[:3]:
        ext = task["data"]["item_id"]
        wait_for(lambda ext=ext: label_of(ext) == truth[ext], 30, f"label of {ext!r} did not arrive by webhook")
    log("3 annotations arrived as labels by webhook", t0)

    # drop one webhook on purpose: switch Label Studio's webhook off, annotate, switch it on again
    # (all of the project's webhooks: Label Studio also created one itself for the ML backend)
    hooks = [h["id"] for h in ls.get("/api/webhooks/", params={"project": project}).json()]
    assert hook in hooks
    log(f"project webhooks: {len(hooks)} (ours and Label Studio's own for the ML backend)", t0)
    for h in hooks:
        assert ls.patch(f"/api/webhooks/{h}/", json={"is_active": False}).status_code == 200
    lost = found[3]
    annotate(lost)
    time.sleep(2)
    assert label_of(lost["data"]["item_id"]) is None, "the webhook was supposed to be lost"
    for h in hooks:
        assert ls.patch(f"/api/webhooks/{h}/", json={"is_active": True}).status_code == 200
    r = http.post(f"/v1/pools/{pool}/integrations/{integration['id']}/reconcile")
    assert r.status_code == 202
    ext = lost["data"]["item_id"]
    wait_for(lambda: label_of(ext) == truth[ext], 30, "reconcile did not recover the lost label")
    shown = http.get(f"/v1/pools/{pool}/integrations/{integration['id']}").json()
    assert shown["status"] == "ok" and shown["last_synced_at"] is not None and shown["tasks_linked"] == 4
    log("the lost webhook's label was recovered by reconcile", t0)

    # the next batch leaves the labeled items out, and goes to Label Studio too
    r = http.post(f"/v1/pools/{pool}/batches", json={"size": 4, "strategy": "bait"})
    second = wait_batch(http, pool, r.json()["id"])["item_ids"]
    assert not set(second) & set(first) and not set(second) & set(seed)
    wait_for(lambda: len(tasks()) == 8, 60, "the second batch was not imported")
    log(f"batch 2 succeeded without the labeled items: {second}; Label Studio has 8 tasks", t0)

    # Label Studio asks the ML backend for a prediction of one task
    task_id = next(t["id"] for t in tasks() if t["data"]["item_id"] == second[0])
    r = httpx.post(f"{ml_url}/predict", json={"tasks": [{"id": task_id, "data": {"item_id": second[0]}}]}, timeout=60)
    assert r.status_code == 200 and len(r.json()["results"]) == 1
    assert r.json()["results"][0]["result"][0]["from_name"] == "sentiment"
    log("done", t0)

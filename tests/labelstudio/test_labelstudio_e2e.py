"""End to end against a real Label Studio 1.23.2 and a real `bait serve`, both on 127.0.0.1, done the way a
user clicks it (Label Studio's API stands in for the clicks).

Run with `make test-labelstudio` (it creates .labelstudio-venv once with scripts/labelstudio_env.sh).
Only Label Studio's automatic webhook (created when the ML backend is added) is used, never a second one.

- text project, URL-secret mode: tasks show the items' real text; the "bait: next batch" view lists exactly
  the batch in rank order; labels arrive by the automatic webhook within seconds; webhooks lost on purpose
  are reconciled before the next selection; the backend's model_version is the predictions' checkpoint.
- text project, HTTP Basic mode with "train on submission": 20 annotations create exactly the auto_batch
  policy's batches; no 401 in the service's log.
- image project whose user imported tasks first: they are adopted (0 duplicates, their annotation becomes
  a label); new tasks show images through the service's signed links.
"""

from __future__ import annotations

import json
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


PNG = b"\x89PNG\r\n\x1a\n" + bytes(64)
IMAGE_CONFIG = """<View>
  <Image name="image" value="$image"/>
  <Choices name="sentiment" toName="image" choice="single">
    <Choice value="Positive"/><Choice value="Negative"/>
  </Choices>
</View>"""


@pytest.fixture
def service(tmp_path: Path) -> Iterator[tuple[str, str, Proc, Path]]:
    """``(base url, api key, process, the tenant's data root)`` of an embedded `bait serve`."""
    root = tmp_path / "files"
    (root / "e2e").mkdir(parents=True)  # file:// content of tenant "e2e" lies under <BAIT_DATA_ROOT>/e2e/
    # Label Studio listens on 127.0.0.1: the operator allowlist opens it (the README's local setup)
    env = bait_env(
        f"sqlite:///{tmp_path / 'data' / 'bait.db'}", None, "bait", data_root=str(root), outbound_allow="127.0.0.1"
    )
    server, base = serve(env, tmp_path / "serve.log", migrate=True)
    try:
        # the key connects integrations and rotates their secret: it needs the admin scope
        scopes = ["--scope", "read,label,select,admin"]
        key = bait("keys", "create", "--tenant", "e2e", *scopes, env=env).strip().splitlines()[-1]
        yield base, key, server, root / "e2e"
    finally:
        server.stop()
        print("--- bait serve log (tail) ---\n" + server.output()[-3000:])


class Loop:
    """One Label Studio project and one pool, and the calls a user makes on both."""

    def __init__(self, labelstudio: tuple[str, str], service: tuple[str, str, Proc, Path], config: str) -> None:
        ls_url, self.token = labelstudio
        self.base, key, self.server, self.root = service
        self.ls_url = ls_url
        self.ls = httpx.Client(base_url=ls_url, headers={"Authorization": f"Token {self.token}"}, timeout=60)
        self.http = httpx.Client(base_url=self.base, headers={"Authorization": f"Bearer {key}"}, timeout=60)
        r = self.ls.post("/api/projects/", json={"title": f"bait e2e {secrets.token_hex(3)}", "label_config": config})
        assert r.status_code == 201, r.text
        self.project = int(r.json()["id"])
        self.pool = ""
        self.integration: dict[str, Any] = {}

    def make_pool(self, n: int, data: Any) -> tuple[list[str], dict[str, str]]:
        rng = np.random.default_rng(0)
        d = 8
        y = rng.integers(0, 2, size=n)
        X = (np.where(y[:, None] == 0, 2.0, -2.0) + rng.normal(0, 1, size=(n, d))).astype(np.float32)
        ids = [f"doc-{i:03d}" for i in range(n)]
        truth = {i: CLASSES[int(c)] for i, c in zip(ids, y, strict=True)}
        body = {"name": f"p{secrets.token_hex(3)}", "task": "classification", "classes": CLASSES, "embedding_dim": d,
                "head": {"kind": "linear"}}  # fmt: skip
        r = self.http.post("/v1/pools", json=body)
        assert r.status_code == 201, r.text
        self.pool = r.json()["id"]
        items = [{"id": i, "embedding": x.tolist(), "data": data(i, truth[i])} for i, x in zip(ids, X, strict=True)]
        r = self.http.post(f"/v1/pools/{self.pool}/items", json={"items": items})
        assert r.status_code == 200, r.text
        return ids, truth

    def seed(self, truth: dict[str, str], ids: list[str]) -> None:
        labels = [{"item_id": i, "label": truth[i]} for i in ids]
        assert self.http.put(f"/v1/pools/{self.pool}/labels", json={"labels": labels}).status_code == 200

    def connect(self, **extra: Any) -> dict[str, Any]:
        body = {"url": self.ls_url, "token": self.token, "project_id": self.project,
                "choice_map": {"Positive": "positive", "Negative": "negative"}, **extra}  # fmt: skip
        r = self.http.post(f"/v1/pools/{self.pool}/integrations/labelstudio", json=body)
        assert r.status_code == 201, r.text
        self.integration = r.json()
        return self.integration

    def add_backend(self, mode: str) -> None:
        """Settings -> Model -> Connect model: Label Studio calls /health and /setup and adds its webhook."""
        url = self.integration["ml_backend_url"]
        body: dict[str, Any] = {"project": self.project, "url": url, "title": "bait"}
        if mode == "basic":
            body.update(url=url.rsplit("/", 1)[0], auth_method="BASIC_AUTH", basic_auth_user="labelstudio",
                        basic_auth_pass=self.integration["secret"])  # fmt: skip
        r = self.ls.post("/api/ml/", json=body)
        assert r.status_code == 201, r.text
        hooks = self.ls.get("/api/webhooks/", params={"project": self.project}).json()
        assert len(hooks) == 1 and hooks[0]["url"] == body["url"] + "/webhook", hooks  # Label Studio's own

    def batch(self, size: int, strategy: str = "bait") -> dict[str, Any]:
        r = self.http.post(f"/v1/pools/{self.pool}/batches", json={"size": size, "strategy": strategy})
        assert r.status_code == 202, r.text
        return wait_batch(self.http, self.pool, r.json()["id"])

    def tasks(self, view: int | None = None) -> list[dict[str, Any]]:
        params: dict[str, Any] = {"project": self.project, "fields": "all", "page_size": 1000}
        if view is not None:
            params["view"] = view
        return list(self.ls.get("/api/tasks/", params=params).json()["tasks"])

    def annotate(self, task: dict[str, Any], choice: str, to_name: str = "text") -> None:
        result = [{"from_name": "sentiment", "to_name": to_name, "type": "choices", "value": {"choices": [choice]}}]
        r = self.ls.post(f"/api/tasks/{task['id']}/annotations/", json={"result": result, "was_cancelled": False})
        assert r.status_code == 201, r.text

    def labels(self) -> dict[str, str]:
        out: dict[str, str] = {}
        cursor = None
        while True:
            params: dict[str, Any] = {"status": "labeled", "limit": 1000}
            if cursor:
                params["cursor"] = cursor
            page = self.http.get(f"/v1/pools/{self.pool}/items", params=params).json()
            out.update({i["id"]: i["label"] for i in page["items"]})
            cursor = page["next_cursor"]
            if not cursor:
                return out

    def batches(self) -> list[dict[str, Any]]:
        return list(self.http.get(f"/v1/pools/{self.pool}/batches", params={"limit": 500}).json()["batches"])

    def view_id(self) -> int:
        views = self.ls.get("/api/dm/views/", params={"project": self.project}).json()
        found = [v["id"] for v in views if v["data"].get("title") == "bait: next batch"]
        assert len(found) == 1, views
        return int(found[0])

    def assert_no_401(self) -> None:
        lines = [
            ln for ln in self.server.output().splitlines() if '"POST /labelstudio/' in ln or '"GET /labelstudio/' in ln
        ]
        assert lines, "the service's access log shows no Label Studio call"
        bad = [ln for ln in lines if '" 401' in ln]
        assert not bad, bad[:5]


def choice(label: str) -> str:
    return CHOICE[label]


def test_text_project_url_mode(labelstudio: tuple[str, str], service: tuple[str, str, Proc, Path]) -> None:
    t0 = time.monotonic()
    loop = Loop(labelstudio, service, LABEL_CONFIG)
    text = {}

    def data(i: str, label: str) -> dict[str, Any]:
        text[i] = f"{i}: {'a great film, loved it' if label == 'positive' else 'a dull film, slept through'}"
        return {"text": text[i]}

    ids, truth = loop.make_pool(60, data)
    loop.seed(truth, ids[:6])
    loop.connect()
    loop.add_backend("url")
    log("text project connected; ML backend added (URL secret); one webhook: Label Studio's own", t0)

    first = loop.batch(4)
    assert first["delivery"] == "delivered"
    found = loop.tasks()
    assert sorted(t["data"]["item_id"] for t in found) == sorted(first["item_ids"])
    assert all(t["data"]["text"] == text[t["data"]["item_id"]] for t in found)  # the real text, not the id
    view = loop.view_id()
    assert [t["data"]["item_id"] for t in loop.tasks(view)] == first["item_ids"]
    preds = [p for t in found for p in t.get("predictions", [])]
    assert {p["model_version"] for p in preds} == {first["checkpoint_id"]}
    backends = loop.ls.get("/api/ml/", params={"project": loop.project}).json()
    assert backends[0]["model_version"] == first["checkpoint_id"]
    project = loop.ls.get(f"/api/projects/{loop.project}/").json()
    assert project["model_version"] == first["checkpoint_id"]  # the score column's version
    log("batch 1: 4 tasks with their text, the view lists them in rank order, model_version consistent", t0)

    by_ext = {t["data"]["item_id"]: t for t in found}
    t1 = time.monotonic()
    for ext in first["item_ids"][:2]:
        loop.annotate(by_ext[ext], choice(truth[ext]))
    wait_for(lambda: all(loop.labels().get(e) == truth[e] for e in first["item_ids"][:2]), 10, "labels did not arrive")
    log(f"2 annotations arrived as labels in {time.monotonic() - t1:.1f} s (automatic webhook)", t0)
    assert [t["data"]["item_id"] for t in loop.tasks(view)] == first["item_ids"][2:]

    hooks = [h["id"] for h in loop.ls.get("/api/webhooks/", params={"project": loop.project}).json()]
    for h in hooks:
        assert loop.ls.patch(f"/api/webhooks/{h}/", json={"is_active": False}).status_code == 200
    lost = first["item_ids"][2:]
    for ext in lost:
        loop.annotate(by_ext[ext], choice(truth[ext]))
    time.sleep(1)
    assert not set(lost) & set(loop.labels()), "the webhooks were supposed to be lost"
    for h in hooks:
        assert loop.ls.patch(f"/api/webhooks/{h}/", json={"is_active": True}).status_code == 200
    second = loop.batch(4)
    assert second["diagnostics"]["n_labeled"] == 6 + 4, "the next selection did not see the lost labels"
    assert all(loop.labels().get(e) == truth[e] for e in lost)
    assert not set(second["item_ids"]) & set(first["item_ids"])
    assert [t["data"]["item_id"] for t in loop.tasks(view)] == second["item_ids"]
    assert len(loop.tasks()) == 8
    log("lost webhooks reconciled before batch 2's selection; the view now lists batch 2", t0)

    # Data Manager -> select all -> "Retrieve predictions": every task gets the new checkpoint's prediction,
    # and the prediction score column is filled (the backend's model_version is the predictions' one)
    r = loop.ls.post(
        "/api/dm/actions",
        params={"id": "retrieve_tasks_predictions", "project": loop.project},
        json={"selectedItems": {"all": True, "excluded": []}},
    )
    assert r.status_code == 200, r.text
    tasks = loop.tasks()
    assert all(second["checkpoint_id"] in {p["model_version"] for p in t["predictions"]} for t in tasks), [
        [p["model_version"] for p in t["predictions"]] for t in tasks
    ]
    # the Data Manager sorted by the prediction score column (it computes the column only when shown)
    positive = {"filter": "filter:tasks:predictions_score", "operator": "greater", "type": "Number", "value": 0}
    query = {"ordering": ["-tasks:predictions_score"], "filters": {"conjunction": "and", "items": [positive]}}
    params = {"project": loop.project, "fields": "all", "page_size": 100, "query": json.dumps(query)}
    scored = loop.ls.get("/api/tasks/", params=params).json()["tasks"]
    scores = [t.get("predictions_score") for t in scored]
    assert len(scored) == 8 and all(isinstance(x, float) and 0 < x <= 1 for x in scores), scores
    assert scores == sorted(scores, reverse=True)
    log("Retrieve predictions: every task has the latest checkpoint's prediction; score column filled", t0)
    loop.assert_no_401()


def test_basic_mode_train_on_submission(labelstudio: tuple[str, str], service: tuple[str, str, Proc, Path]) -> None:
    t0 = time.monotonic()
    loop = Loop(labelstudio, service, LABEL_CONFIG)
    ids, truth = loop.make_pool(80, lambda i, label: {"text": f"review {i}"})
    loop.seed(truth, ids[:6])
    loop.connect(auto_batch={"size": 5, "when": "batch_done"})
    loop.add_backend("basic")
    r = loop.ls.patch(f"/api/projects/{loop.project}/", json={"start_training_on_annotation_update": True})
    assert r.status_code == 200 and r.json()["start_training_on_annotation_update"] is True, r.text
    log("Basic mode backend; 'train on submission' on; auto_batch size 5 when batch_done", t0)
    loop.batch(5)
    view = loop.view_id()
    done: list[str] = []
    t1 = time.monotonic()
    while len(done) < 20:
        todo = wait_for(lambda: loop.tasks(view), 60, "the next batch did not appear in the view")
        task = todo[0]
        ext = task["data"]["item_id"]
        loop.annotate(task, choice(truth[ext]))
        done.append(ext)
        wait_for(lambda ext=ext: loop.labels().get(ext) == truth[ext], 10, f"label of {ext} did not arrive")
    log(f"20 annotations labeled in order from the view in {time.monotonic() - t1:.1f} s", t0)

    def settled() -> list[dict[str, Any]] | None:
        b = loop.batches()
        return b if all(x["status"] in ("succeeded", "failed") for x in b) else None

    batches = wait_for(settled, 60, "batches did not settle")
    time.sleep(2)
    batches = loop.batches()
    assert len(batches) == 1 + 20 // 5, [(b["size"], b["status"]) for b in batches]
    assert all(b["status"] == "succeeded" and b["delivery"] == "delivered" for b in batches)
    ids_in_tasks = [t["data"]["item_id"] for t in loop.tasks()]
    assert len(ids_in_tasks) == len(set(ids_in_tasks)) == 5 * len(batches)
    log(f"{len(batches)} batches for 20 annotations (policy: one per 5 labeled), no duplicate task", t0)
    loop.assert_no_401()


def test_image_project_adopts_user_tasks(labelstudio: tuple[str, str], service: tuple[str, str, Proc, Path]) -> None:
    t0 = time.monotonic()
    loop = Loop(labelstudio, service, IMAGE_CONFIG)
    root = loop.root

    def data(i: str, label: str) -> dict[str, Any]:
        (root / f"{i}.png").write_bytes(PNG + i.encode())
        return {"image": f"file://{root}/{i}.png"}

    ids, truth = loop.make_pool(12, data)
    loop.seed(truth, ids[:4])
    # the usual Label Studio workflow: the user imports their own tasks first, and labels one
    mine = ids[4:7]
    own = [{"item_id": e, "image": f"http://127.0.0.1:9/{e}.png"} for e in mine]
    r = loop.ls.post(f"/api/projects/{loop.project}/import", params={"return_task_ids": "true"}, json=own)
    assert r.status_code == 201, r.text
    user_task = next(t for t in loop.tasks() if t["data"]["item_id"] == mine[0])
    loop.annotate(user_task, choice(truth[mine[0]]), to_name="image")
    created = loop.connect()
    wait_for(
        lambda: (
            loop.http.get(
                f"/v1/pools/{loop.pool}/integrations/{created['id']}/reconciles/{created['reconcile']['id']}"
            ).json()["status"]
            == "succeeded"
        ),
        30,
        "the first reconcile did not finish",
    )
    run = loop.http.get(f"/v1/pools/{loop.pool}/integrations/{created['id']}/reconciles/{created['reconcile']['id']}")
    counts = run.json()["counts"]
    assert counts["adopted"] == 3 and counts["written"] == 1 and counts["unknown"] == 0, counts
    assert loop.labels().get(mine[0]) == truth[mine[0]]
    loop.add_backend("url")
    log("3 user-imported tasks adopted at connect; the one annotated became a label", t0)

    batch = loop.batch(12 - 4 - 1, strategy="random")  # every unlabeled item, the adopted ones included
    assert batch["delivery"] == "delivered"
    tasks = loop.tasks()
    per_item = [t["data"]["item_id"] for t in tasks]
    assert len(per_item) == len(set(per_item)) == 12 - 4, per_item  # 0 duplicates
    shown = 0
    for t in tasks:
        if t["data"]["item_id"] in mine:
            continue
        image = t["data"]["image"]
        assert image.startswith(f"{loop.base}/labelstudio/content/") and str(root) not in image
        got = httpx.get(image, timeout=10)
        assert got.status_code == 200 and got.headers["content-type"] == "image/png"
        assert got.content == PNG + t["data"]["item_id"].encode()
        shown += 1
    assert shown == 5
    log("batch pushed without duplicates; new tasks show their images through signed links", t0)
    adopted = next(t for t in tasks if t["data"]["item_id"] == mine[1])
    loop.annotate(adopted, choice(truth[mine[1]]), to_name="image")
    wait_for(lambda: loop.labels().get(mine[1]) == truth[mine[1]], 10, "the adopted task's label did not arrive")
    log("an annotation on an adopted task arrived as a label", t0)
    loop.assert_no_401()


def wait_batch(http: httpx.Client, pool: str, batch_id: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        b: dict[str, Any] = http.get(f"/v1/pools/{pool}/batches/{batch_id}").json()
        return b if b["status"] in ("succeeded", "failed", "cancelled") else None

    batch: dict[str, Any] = wait_for(done, 120, "batch did not finish")
    assert batch["status"] == "succeeded", batch["error"]
    return batch

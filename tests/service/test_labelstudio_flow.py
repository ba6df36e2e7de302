"""The Label Studio loop as annotators use it, against the Label Studio peer of tests/fake_labelstudio.py:
tasks show item content (text, images through signed links), user-imported tasks are adopted, the
automatic webhook works in both auth modes with duplicates applied once, START_TRAINING follows the
auto_batch policy, a batch reconciles first and pushes before it succeeds, reconciles are readable."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.db import session_scope
from service.domain import content
from service.main import create_app
from service.store.models import Batch, Integration, Item, Label, ReconcileRun
from tests.fake_labelstudio import FakeLabelStudio, fake_labelstudio
from tests.service.test_integrations import connect, count, item_label, run_batch
from tests.worker.factories import make_pool

IMAGE_CONFIG = """<View>
  <Image name="image" value="$image"/>
  <Choices name="label" toName="image" choice="single">
    <Choice value="ant"/><Choice value="bee"/><Choice value="cat"/>
  </Choices>
</View>"""
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 32


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """The fake Label Studio listens on 127.0.0.1, which the outbound guard refuses by default: the
    operator allowlist opens it, as the README's local setup does."""
    return settings.model_copy(update={"outbound_allow": "127.0.0.1"})


@pytest.fixture
def ls() -> Iterator[FakeLabelStudio]:
    with fake_labelstudio() as fake:
        yield fake


def set_data(db: sessionmaker[Session], pool_id: str, data: dict[str, dict[str, Any]]) -> None:
    with session_scope(db) as s:
        for item in s.execute(select(Item).where(Item.pool_id == pool_id)).scalars():
            if item.external_id in data:
                item.data = data[item.external_id]


def batches(db: sessionmaker[Session]) -> list[Batch]:
    with session_scope(db) as s:
        return list(s.execute(select(Batch).order_by(Batch.created_at)).scalars())


def webhook(client: TestClient, created: dict[str, Any], payload: dict[str, Any], mode: str = "url") -> Any:
    if mode == "url":
        return client.post(f"/labelstudio/{created['id']}/{created['secret']}/webhook", json=payload)
    if mode == "basic":
        auth = "Basic " + base64.b64encode(f"ls:{created['secret']}".encode()).decode()
        return client.post(f"/labelstudio/{created['id']}/webhook", json=payload, headers={"Authorization": auth})
    return client.post(f"/labelstudio/{created['id']}/webhook", json=payload)  # no credentials


def annotate_and_send(
    client: TestClient, ls: FakeLabelStudio, created: dict[str, Any], ext: str, choice: str, mode: str = "url"
) -> None:
    task = ls.task_for_item(ext)
    annotation = ls.annotate(task["id"], choice)
    r = webhook(client, created, {"action": "ANNOTATION_CREATED", "annotation": annotation, "task": task}, mode)
    assert r.status_code == 200, r.text


def test_text_tasks_show_item_data_with_renames(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any, ls: FakeLabelStudio
) -> None:
    pool = make_pool(db, n=30, n_labeled=6)
    set_data(db, pool.pool_id, {e: {"body": f"the text of {e}", "lang": "en"} for e in pool.external_ids})
    created = connect(client, auth, pool.pool_id, ls, data_map={"body": "text"}).json()
    assert created["id"]
    batch = run_batch(client, auth, pool.pool_id, run_jobs, size=4, strategy="random")
    assert batch["delivery"] == "delivered"
    for rank, ext in enumerate(batch["item_ids"], start=1):
        data = ls.task_for_item(ext)["data"]
        assert data == {"text": f"the text of {ext}", "lang": "en", "item_id": ext,
                        "bait_batch": batch["id"], "bait_rank": rank}  # fmt: skip


def test_image_tasks_show_urls_and_signed_links_to_files(
    settings: Settings, db: sessionmaker[Session], auth: dict[str, str], run_jobs: Any, tmp_path: Path
) -> None:
    root = tmp_path / "data"  # BAIT_DATA_ROOT; the pool's tenant "acme" reads only <root>/acme/
    (root / "acme" / "img").mkdir(parents=True)
    (root / "other").mkdir(parents=True)
    (root / "other" / "theirs.png").write_bytes(PNG)
    (tmp_path / "secret.png").write_bytes(PNG)
    pool = make_pool(db, n=20, n_labeled=6)
    data: dict[str, dict[str, Any]] = {}
    for i, ext in enumerate(pool.external_ids):
        if i % 2:
            data[ext] = {"image": f"https://images.example.org/{ext}.png"}
        else:
            (root / "acme" / "img" / f"{ext}.png").write_bytes(PNG + ext.encode())
            data[ext] = {"image": f"file://{root}/acme/img/{ext}.png"}
    set_data(db, pool.pool_id, data)
    app_settings = settings.model_copy(update={"data_root": root})
    with fake_labelstudio(label_config=IMAGE_CONFIG) as ls, TestClient(create_app(app_settings)) as client:
        created = connect(client, auth, pool.pool_id, ls).json()
        assert created["status"] == "ok", created
        r = client.post(f"/v1/pools/{pool.pool_id}/batches", json={"size": 14, "strategy": "random"}, headers=auth)
        run_jobs(app_client=client, until=lambda: len(ls.tasks) == 14)
        links = 0
        for task in ls.tasks.values():
            ext, image = task["data"]["item_id"], task["data"]["image"]
            if data[ext]["image"].startswith("https://"):
                assert image == data[ext]["image"]
                continue
            assert image.startswith("http://testserver/labelstudio/content/") and str(root) not in image
            got = client.get(urlsplit(image).path)
            assert got.status_code == 200 and got.content == PNG + ext.encode()
            assert got.headers["content-type"] == "image/png"
            links += 1
        assert links == 7 and r.status_code == 202
        token = urlsplit(image if links else "").path.rsplit("/", 1)[-1]
        assert client.get(f"/labelstudio/content/{token[:-2]}xx").status_code == 403  # tampered
        expired = content.sign(app_settings, pool.pool_id, pool.external_ids[0], "image", ttl_s=-5)
        assert client.get(f"/labelstudio/content/{expired}").status_code == 403
        # an item whose file lies outside the data root is refused, even with a valid link
        set_data(db, pool.pool_id, {pool.external_ids[0]: {"image": f"file://{tmp_path}/secret.png"}})
        link = content.sign(app_settings, pool.pool_id, pool.external_ids[0], "image", ttl_s=60)
        r = client.get(f"/labelstudio/content/{link}")
        assert r.status_code == 403 and "outside the data root" in r.json()["error"]["message"]
        # ... and so is another tenant's folder under the same BAIT_DATA_ROOT
        set_data(db, pool.pool_id, {pool.external_ids[0]: {"image": f"file://{root}/other/theirs.png"}})
        r = client.get(f"/labelstudio/content/{link}")
        assert r.status_code == 403 and "outside the data root" in r.json()["error"]["message"]
        set_data(db, pool.pool_id, {pool.external_ids[0]: {"image": f"file://{root}/acme/../other/theirs.png"}})
        assert client.get(f"/labelstudio/content/{link}").status_code == 403


def test_user_imported_tasks_are_adopted_never_duplicated(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any, ls: FakeLabelStudio
) -> None:
    pool = make_pool(db, n=20, n_labeled=6)
    ids = pool.external_ids
    with session_scope(db) as s:
        unlabeled = [
            e
            for (e,) in s.execute(
                select(Item.external_id).where(Item.pool_id == pool.pool_id, Item.status == "unlabeled")
            )
        ]
    mine = [ls.add_task({"item_id": e, "text": f"user text {e}"}) for e in unlabeled[:3]]
    ls.add_task({"item_id": unlabeled[0], "text": "a copy"})  # a second task of the same item
    ls.add_task({"item_id": "not-in-the-pool", "text": "?"})
    stray = ls.add_task({"text": "no id at all"})
    ls.annotate(mine[0]["id"], "bee")
    ls.annotate(stray["id"], "cat")
    r = connect(client, auth, pool.pool_id, ls)
    assert r.status_code == 201, r.text
    created = r.json()
    assert created["reconcile"]["trigger"] == "connect" and created["reconcile"]["status"] == "queued"
    run_jobs()
    got = client.get(
        f"/v1/pools/{pool.pool_id}/integrations/{created['id']}/reconciles/{created['reconcile']['id']}", headers=auth
    ).json()
    assert got["status"] == "succeeded", got
    assert got["counts"]["adopted"] == 3 and got["counts"]["unknown"] == 1 and got["counts"]["ambiguous"] == 1
    assert got["counts"]["unmatched"] == 1 and got["counts"]["written"] == 1
    assert item_label(db, pool.pool_id, unlabeled[0]) == ("labeled", "bee")
    shown = client.get(f"/v1/pools/{pool.pool_id}/integrations/{created['id']}", headers=auth).json()
    assert shown["adoption"] == {"adopted": 3, "unknown": 1, "ambiguous": 1, "linked": 3}
    assert shown["unmatched_annotations"] == 1 and shown["tasks_linked"] == 3
    # a batch of every unlabeled item: the adopted ones get no second task
    available = len(unlabeled) - 1
    batch = run_batch(client, auth, pool.pool_id, run_jobs, size=available, strategy="random")
    assert batch["delivery"] == "delivered"
    assert batch["diagnostics"]["labelstudio"][created["id"]]["already_in_project"] == 2
    per_item: dict[str, int] = {}
    for t in ls.tasks.values():
        if "item_id" in t["data"]:
            per_item[t["data"]["item_id"]] = per_item.get(t["data"]["item_id"], 0) + 1
    assert per_item[unlabeled[0]] == 2  # the user's own two copies, nothing added
    assert all(n == 1 for e, n in per_item.items() if e != unlabeled[0])
    # an annotation on an adopted task becomes a label
    annotate_and_send(client, ls, created, unlabeled[1], "cat")
    run_jobs(until=lambda: item_label(db, pool.pool_id, unlabeled[1]) == ("labeled", "cat"))
    assert ids


@pytest.mark.parametrize("mode", ["url", "basic"])
def test_automatic_webhook_works_in_both_auth_modes_and_duplicates_apply_once(
    client: TestClient,
    auth: dict[str, str],
    db: sessionmaker[Session],
    run_jobs: Any,
    ls: FakeLabelStudio,
    mode: str,
) -> None:
    pool = make_pool(db, n=30, n_labeled=6)
    created = connect(client, auth, pool.pool_id, ls).json()
    batch = run_batch(client, auth, pool.pool_id, run_jobs, size=3, strategy="random")
    first, second, third = batch["item_ids"]
    # URL mode: the webhook URL holds the secret; Basic mode: Label Studio's automatic webhook sends no
    # credentials, so its event is a hint that is read back from Label Studio
    sent_as = "url" if mode == "url" else "none"
    task = ls.task_for_item(first)
    annotation = ls.annotate(task["id"], "bee")
    payload = {"action": "ANNOTATION_CREATED", "annotation": annotation, "task": task}
    for _ in range(2):  # the same event twice (a second webhook, a retry)
        assert webhook(client, created, payload, sent_as).status_code == 200
    run_jobs(until=lambda: item_label(db, pool.pool_id, first) == ("labeled", "bee"))
    run_jobs()
    with session_scope(db) as s:
        rows = s.execute(select(func.count()).select_from(Label).where(Label.annotator == "labelstudio:1")).scalar_one()
    assert rows == 1
    if mode == "basic":
        # a forged hint: the payload claims "cat", Label Studio says "ant"; Label Studio wins
        task = ls.task_for_item(second)
        real = ls.annotate(task["id"], "ant")
        forged = {**real, "result": [{**real["result"][0], "value": {"choices": ["cat"]}}]}
        webhook(client, created, {"action": "ANNOTATION_CREATED", "annotation": forged, "task": task}, "none")
        run_jobs(until=lambda: item_label(db, pool.pool_id, second)[0] == "labeled")
        assert item_label(db, pool.pool_id, second) == ("labeled", "ant")
        # a hint about an annotation Label Studio does not have writes nothing
        webhook(client, created, {"action": "ANNOTATION_CREATED", "annotation": {"id": 999}}, "none")
        # with credentials, they must be right; START_TRAINING without them is ignored
        wrong = {"Authorization": "Basic " + base64.b64encode(b"ls:wrong").decode()}
        r = client.post(f"/labelstudio/{created['id']}/webhook", json=payload, headers=wrong)
        assert r.status_code == 401
        r = webhook(client, created, {"action": "START_TRAINING"}, "none")
        assert r.json()["status"] == "ignored"
        annotate_and_send(client, ls, created, third, "cat", mode="basic")
        run_jobs(until=lambda: item_label(db, pool.pool_id, third) == ("labeled", "cat"))
    run_jobs()
    assert len(batches(db)) == 1
    with session_scope(db) as s:
        row = s.get(Integration, created["id"])
        assert row is not None and row.status == "ok", row.last_error


def test_start_training_follows_the_batch_done_policy(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any, ls: FakeLabelStudio
) -> None:
    pool = make_pool(db, n=60, n_labeled=9)
    created = connect(client, auth, pool.pool_id, ls, strategy="random", auto_batch={"size": 3}).json()
    assert created["config"]["auto_batch"] == {"size": 3, "when": "batch_done", "n": 3, "stop_when_recommended": False}
    train = {"action": "START_TRAINING", "project": {"id": 7}}
    assert webhook(client, created, train).json()["status"] == "queued"
    run_jobs(until=lambda: len(ls.tasks) == 3)
    first = [t["data"]["item_id"] for t in ls.tasks.values()]
    # "train on submission": one START_TRAINING per annotation, sent before the annotation's own webhook
    for i, ext in enumerate(first):
        webhook(client, created, train)
        run_jobs()
        assert len(batches(db)) == 1, f"a batch after {i} of 3 labels"
        annotate_and_send(client, ls, created, ext, "ant")
        run_jobs()
    run_jobs(until=lambda: len(ls.tasks) == 6)
    assert len(batches(db)) == 2 and all(b.size == 3 for b in batches(db))
    for _ in range(5):  # more requests while the new batch is open create nothing
        webhook(client, created, train)
    run_jobs()
    assert len(batches(db)) == 2 and len(ls.tasks) == 6


def test_start_training_every_n_labels(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any, ls: FakeLabelStudio
) -> None:
    pool = make_pool(db, n=60, n_labeled=9)
    policy = {"size": 4, "when": "every_n_labels", "n": 2}
    created = connect(client, auth, pool.pool_id, ls, strategy="random", auto_batch=policy).json()
    train = {"action": "START_TRAINING"}
    webhook(client, created, train)
    run_jobs(until=lambda: len(ls.tasks) == 4)
    exts = [t["data"]["item_id"] for t in ls.tasks.values()]
    webhook(client, created, train)
    annotate_and_send(client, ls, created, exts[0], "ant")
    run_jobs()
    assert len(batches(db)) == 1
    annotate_and_send(client, ls, created, exts[1], "bee")
    run_jobs(until=lambda: len(ls.tasks) == 8)
    assert len(batches(db)) == 2


def test_batch_reconciles_lost_webhooks_before_selecting(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any, ls: FakeLabelStudio
) -> None:
    pool = make_pool(db, n=40, n_labeled=6)
    created = connect(client, auth, pool.pool_id, ls).json()
    first = run_batch(client, auth, pool.pool_id, run_jobs, size=3, strategy="random")
    for ext in first["item_ids"]:
        ls.annotate(ls.task_for_item(ext)["id"], "cat")  # webhooks lost
    second = run_batch(client, auth, pool.pool_id, run_jobs, size=3, strategy="bait")
    assert second["status"] == "succeeded" and second["delivery"] == "delivered"
    assert second["diagnostics"]["n_labeled"] == 6 + 3  # the lost labels were trained on
    assert all(item_label(db, pool.pool_id, e) == ("labeled", "cat") for e in first["item_ids"])
    with session_scope(db) as s:
        runs = s.execute(select(ReconcileRun.trigger, ReconcileRun.status).order_by(ReconcileRun.created_at)).all()
    assert ("batch", "succeeded") in [tuple(r) for r in runs]
    assert created["id"]


def test_failed_push_is_a_clear_state_and_can_be_retried(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any, ls: FakeLabelStudio
) -> None:
    pool = make_pool(db, n=40, n_labeled=6)
    connect(client, auth, pool.pool_id, ls)
    run_jobs()
    ls.fail_with = 503
    batch = run_batch(client, auth, pool.pool_id, run_jobs, size=3, strategy="random")
    assert (
        batch["status"] == "succeeded"
        and batch["delivery"] == "failed"
        and "answered HTTP 503 Service Unavailable" in batch["error"]
    )
    ls.fail_with = None
    ls.add_task({"item_id": batch["item_ids"][0], "text": "the user's own copy"})  # meanwhile, by hand
    r = client.post(f"/v1/pools/{pool.pool_id}/batches/{batch['id']}/delivery", headers=auth)
    assert r.status_code == 202
    run_jobs(until=lambda: len(ls.tasks) == 3)
    run_jobs()
    again = client.get(f"/v1/pools/{pool.pool_id}/batches/{batch['id']}", headers=auth).json()
    assert again["delivery"] == "delivered" and again["error"] is None
    assert sorted(t["data"]["item_id"] for t in ls.tasks.values()) == sorted(batch["item_ids"])  # no duplicate
    queued = client.post(f"/v1/pools/{pool.pool_id}/batches", json={"size": 2, "strategy": "random"}, headers=auth)
    r = client.post(f"/v1/pools/{pool.pool_id}/batches/{queued.json()['id']}/delivery", headers=auth)
    assert r.status_code == 409
    run_jobs()


def test_reconcile_is_a_readable_resource(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any, ls: FakeLabelStudio
) -> None:
    pool = make_pool(db, n=40, n_labeled=6)
    created = connect(client, auth, pool.pool_id, ls).json()
    batch = run_batch(client, auth, pool.pool_id, run_jobs, size=2, strategy="random")
    ls.annotate(ls.task_for_item(batch["item_ids"][0])["id"], "ant")
    r = client.post(f"/v1/pools/{pool.pool_id}/integrations/{created['id']}/reconcile", headers=auth)
    assert r.status_code == 202 and r.json()["status"] == "queued"
    location = r.headers["Location"]
    run_jobs()
    got = client.get(location, headers=auth).json()
    assert got["status"] == "succeeded" and got["counts"]["written"] == 1 and got["counts"]["removed"] == 0
    assert got["finished_at"] is not None
    missing = location.rsplit("/", 1)[0] + "/nope"
    assert client.get(missing, headers=auth).status_code == 404


def test_secret_rotation(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], ls: FakeLabelStudio
) -> None:
    pool = make_pool(db, n=20, n_labeled=3)
    created = connect(client, auth, pool.pool_id, ls).json()
    r = client.post(f"/v1/pools/{pool.pool_id}/integrations/{created['id']}/rotate-secret", headers=auth)
    assert r.status_code == 200
    new = r.json()["secret"]
    assert new != created["secret"] and r.json()["ml_backend_url"].endswith(new)
    assert client.get(f"/labelstudio/{created['id']}/{created['secret']}/health").status_code == 401
    assert client.get(f"/labelstudio/{created['id']}/{new}/health").status_code == 200


@pytest.mark.parametrize(
    ("extra", "status", "says"),
    [
        ({"data_map": {"a": "text", "b": "text"}}, 400, "same task field"),
        ({"data_map": {"a": "item_id"}}, 400, "reserved"),
        ({"data_map": {"a": ""}}, 400, "non-empty"),
        ({"auto_batch": {"when": "sometimes"}}, 422, ""),
        ({"auto_batch": {"size": 0}}, 422, ""),
        ({"auto_batch": {"size": 2, "extra": 1}}, 422, ""),
    ],
)
def test_connect_rejects_bad_options_and_writes_nothing(
    client: TestClient,
    auth: dict[str, str],
    db: sessionmaker[Session],
    ls: FakeLabelStudio,
    extra: dict[str, Any],
    status: int,
    says: str,
) -> None:
    pool = make_pool(db, n=20, n_labeled=3)
    r = connect(client, auth, pool.pool_id, ls, **extra)
    assert r.status_code == status, r.text
    assert says in r.json()["error"]["message"]
    assert count(db, Integration) == 0 and count(db, ReconcileRun) == 0


def test_reconcile_before_a_batch_is_bounded_in_time(
    client: TestClient,
    auth: dict[str, str],
    db: sessionmaker[Session],
    run_jobs: Any,
    ls: FakeLabelStudio,
    settings: Settings,
) -> None:
    from worker import context
    from worker.annotation import before_batch

    pool = make_pool(db, n=40, n_labeled=6)
    created = connect(client, auth, pool.pool_id, ls).json()
    run_jobs()
    context.configure(settings)
    warnings = before_batch(pool.pool_id, budget_s=0.0)
    assert len(warnings) == 1 and "time budget" in warnings[0] and created["id"] in warnings[0]
    with session_scope(db) as s:
        run = s.execute(select(ReconcileRun).where(ReconcileRun.trigger == "batch")).scalar_one()
        assert run.status == "failed" and "time budget" in (run.error or "")
    # and a batch whose reconcile fails goes on with the labels it has, saying so
    ls.fail_with = 500
    batch = run_batch(client, auth, pool.pool_id, run_jobs, size=2, strategy="random")
    assert batch["status"] == "succeeded" and batch["delivery"] == "failed"
    assert "before selection" in batch["diagnostics"]["labelstudio_warnings"][0]


def test_items_given_by_uri_show_it_and_file_links_need_a_data_root(
    settings: Settings,
    client: TestClient,
    db: sessionmaker[Session],
    auth: dict[str, str],
    run_jobs: Any,
    tmp_path: Path,
) -> None:
    pool = make_pool(db, n=20, n_labeled=6)
    (tmp_path / "acme").mkdir()  # the tenant's folder under the data root given below
    (tmp_path / "acme" / "a.png").write_bytes(PNG)
    with session_scope(db) as s:
        for item in s.execute(select(Item).where(Item.pool_id == pool.pool_id)).scalars():
            item.uri = f"file://{tmp_path}/acme/a.png"
    with fake_labelstudio(label_config=IMAGE_CONFIG) as ls:
        created = connect(client, auth, pool.pool_id, ls, data_field="image").json()
        assert created["status"] == "ok", created
        run_batch(client, auth, pool.pool_id, run_jobs, size=2, strategy="random")
        image = next(iter(ls.tasks.values()))["data"]["image"]
    assert image.startswith("http://testserver/labelstudio/content/")
    r = client.get(urlsplit(image).path)  # this app has no BAIT_DATA_ROOT
    assert r.status_code == 403 and "BAIT_DATA_ROOT" in r.json()["error"]["message"]
    with TestClient(create_app(settings.model_copy(update={"data_root": tmp_path}))) as rooted:
        got = rooted.get(urlsplit(image).path)
        assert got.status_code == 200 and got.content == PNG

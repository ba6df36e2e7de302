"""Label Studio integrations over HTTP: connect (checked against a Label Studio peer), the token never
shown, the ML-backend routes (secret in the URL or HTTP Basic), webhooks queued and applied."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.db import session_scope
from service.store.models import Integration, Item, Label, TaskLink
from tests.fake_labelstudio import FakeLabelStudio, fake_labelstudio
from tests.service.test_checkpoints import _while_jobs_run
from tests.worker.factories import make_pool


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """The peers of these tests listen on 127.0.0.1, which the outbound guard refuses by default: the
    operator allowlist opens it, as the README's local setup does."""
    return settings.model_copy(update={"outbound_allow": "127.0.0.1"})


@pytest.fixture
def ls() -> Iterator[FakeLabelStudio]:
    with fake_labelstudio() as fake:
        yield fake


def give_text(db: sessionmaker[Session], pool_id: str) -> None:
    with session_scope(db) as s:
        s.execute(update(Item).where(Item.pool_id == pool_id).values(text="some text of " + Item.external_id))


def connect(client: TestClient, auth: dict[str, str], pool_id: str, ls: FakeLabelStudio, **extra: Any) -> Any:
    body = {"url": ls.url, "token": ls.token, "project_id": 7, **extra}
    return client.post(f"/v1/pools/{pool_id}/integrations/labelstudio", json=body, headers=auth)


def count(db: sessionmaker[Session], model: Any) -> int:
    with session_scope(db) as s:
        return int(s.execute(select(func.count()).select_from(model)).scalar_one())


def item_label(db: sessionmaker[Session], pool_id: str, ext: str) -> tuple[str, Any]:
    with session_scope(db) as s:
        row = s.execute(select(Item.status, Item.label).where(Item.pool_id == pool_id, Item.external_id == ext)).one()
        return str(row[0]), row[1]


def run_batch(
    client: TestClient, auth: dict[str, str], pool_id: str, run_jobs: Any, size: int = 5, strategy: str = "bait"
) -> dict[str, Any]:
    r = client.post(f"/v1/pools/{pool_id}/batches", json={"size": size, "strategy": strategy}, headers=auth)
    assert r.status_code == 202, r.text
    run_jobs()
    body: dict[str, Any] = client.get(f"/v1/pools/{pool_id}/batches/{r.json()['id']}", headers=auth).json()
    return body


def test_connect_checks_project_and_never_returns_token(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], ls: FakeLabelStudio
) -> None:
    pool = make_pool(db, n=40, n_labeled=6)
    r = connect(client, auth, pool.pool_id, ls)
    assert r.status_code == 201, r.text
    created = r.json()
    assert created["status"] == "ok" and created["project_id"] == 7
    assert created["mapping"]["from_name"] == "label" and created["mapping"]["control"] == "choices"
    assert created["ml_backend_url"].endswith(f"/labelstudio/{created['id']}/{created['secret']}")
    assert ls.token not in r.text.replace(created["secret"], "")
    got = client.get(f"/v1/pools/{pool.pool_id}/integrations/{created['id']}", headers=auth)
    assert got.status_code == 200 and ls.token not in got.text and "secret" not in got.json()
    listed = client.get(f"/v1/pools/{pool.pool_id}/integrations", headers=auth).json()["integrations"]
    assert [i["id"] for i in listed] == [created["id"]]
    with session_scope(db) as s:
        row = s.get(Integration, created["id"])
        assert row is not None
        assert ls.token.encode() not in row.token_encrypted and created["secret"] not in row.secret_hash


def test_connect_rejected_token_is_400_and_writes_nothing(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], ls: FakeLabelStudio
) -> None:
    pool = make_pool(db, n=20, n_labeled=3)
    r = connect(client, auth, pool.pool_id, ls, token="wrong-token")
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "labelstudio_error" and "token" in r.json()["error"]["message"]
    assert count(db, Integration) == 0


def test_connect_unreachable_is_502(client: TestClient, auth: dict[str, str], db: sessionmaker[Session]) -> None:
    pool = make_pool(db, n=20, n_labeled=3)
    fake = FakeLabelStudio().start()
    fake.stop()  # nothing listens on its port any more
    r = connect(client, auth, pool.pool_id, fake)
    assert r.status_code == 502 and r.json()["error"]["code"] == "labelstudio_unreachable"
    assert "unreachable" in r.json()["error"]["message"]
    assert count(db, Integration) == 0


def test_connect_unknown_project_is_400(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], ls: FakeLabelStudio
) -> None:
    pool = make_pool(db, n=20, n_labeled=3)
    r = client.post(
        f"/v1/pools/{pool.pool_id}/integrations/labelstudio",
        json={"url": ls.url, "token": ls.token, "project_id": 99},
        headers=auth,
    )
    assert r.status_code == 400 and "no project 99" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    ("extra", "config", "says"),
    [
        (
            {},
            '<View><Text name="text" value="$text"/><Choices name="label" toName="text"><Choice value="ant"/>'
            '<Choice value="dog"/></Choices></View>',
            "map to no class",
        ),
        ({"from_name": "nope"}, None, "no control named 'nope'"),
        ({"data_field": "body"}, None, "set `data_field` to 'text'"),
        ({"choice_map": {"ant": "wasp"}}, None, "map to no class"),
    ],
)
def test_connect_mapping_that_does_not_fit_is_400(
    client: TestClient,
    auth: dict[str, str],
    db: sessionmaker[Session],
    extra: dict[str, Any],
    config: str | None,
    says: str,
) -> None:
    pool = make_pool(db, n=20, n_labeled=3)
    kwargs = {} if config is None else {"label_config": config}
    with fake_labelstudio(**kwargs) as fake:
        r = connect(client, auth, pool.pool_id, fake, **extra)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["details"]["kind"] == "mapping" and says in r.json()["error"]["message"]
    assert count(db, Integration) == 0


def test_connect_regression_pool_needs_a_number_control(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], ls: FakeLabelStudio
) -> None:
    pool = make_pool(db, n=20, n_labeled=3, task="regression")
    r = connect(client, auth, pool.pool_id, ls)
    assert r.status_code == 400 and "<number>" in r.json()["error"]["message"]


def test_integration_of_another_tenant_is_404(
    client: TestClient,
    auth: dict[str, str],
    other_auth: dict[str, str],
    db: sessionmaker[Session],
    ls: FakeLabelStudio,
) -> None:
    pool = make_pool(db, n=20, n_labeled=3)
    created = connect(client, auth, pool.pool_id, ls).json()
    r = client.get(f"/v1/pools/{pool.pool_id}/integrations/{created['id']}", headers=other_auth)
    assert r.status_code == 404
    assert client.delete(f"/v1/pools/{pool.pool_id}/integrations/{created['id']}", headers=auth).status_code == 204
    assert count(db, Integration) == 0


def test_ml_backend_routes_authenticate_by_url_secret_or_basic(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], ls: FakeLabelStudio
) -> None:
    pool = make_pool(db, n=20, n_labeled=3)
    created = connect(client, auth, pool.pool_id, ls).json()
    iid, secret = created["id"], created["secret"]
    assert client.get(f"/labelstudio/{iid}/{secret}/health").json()["status"] == "UP"
    assert client.post(f"/labelstudio/{iid}/{secret}/setup", json={"project": "7.1"}).json() == {
        "model_version": "untrained"
    }
    basic = {"Authorization": "Basic " + base64.b64encode(f"labelstudio:{secret}".encode()).decode()}
    assert client.get(f"/labelstudio/{iid}/health", headers=basic).status_code == 200
    wrong = {"Authorization": "Basic " + base64.b64encode(b"labelstudio:nope").decode()}
    assert client.get(f"/labelstudio/{iid}/health", headers=wrong).status_code == 401
    assert client.get(f"/labelstudio/{iid}/health").status_code == 401
    assert client.get(f"/labelstudio/{iid}/wrong-secret/health").status_code == 401
    assert client.post(f"/labelstudio/{iid}/wrong-secret/webhook", json={"action": "X"}).status_code == 401
    # an API key is no ML-backend credential
    assert client.get(f"/labelstudio/{iid}/health", headers=auth).status_code == 401


def test_batch_imported_as_tasks_once_with_predictions(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any, ls: FakeLabelStudio
) -> None:
    pool = make_pool(db, n=60, n_labeled=9)
    give_text(db, pool.pool_id)
    created = connect(client, auth, pool.pool_id, ls).json()
    batch = run_batch(client, auth, pool.pool_id, run_jobs, size=5)
    assert batch["status"] == "succeeded" and batch["error"] is None and batch["delivery"] == "delivered"
    info = batch["diagnostics"]["labelstudio"][created["id"]]
    assert info == {"status": "ok", "imported": 5, "already_in_project": 0, "view_id": info["view_id"]}
    tasks = list(ls.tasks.values())
    assert sorted(t["data"]["item_id"] for t in tasks) == sorted(batch["item_ids"])
    assert all(t["data"]["text"] == "some text of " + t["data"]["item_id"] for t in tasks)
    assert all(t["data"]["bait_batch"] == batch["id"] for t in tasks)
    # the "next batch" view lists the batch's tasks in pick order
    assert ls.views[info["view_id"]]["data"]["title"] == "bait: next batch"
    assert [t["data"]["item_id"] for t in ls.view_tasks(info["view_id"])] == batch["item_ids"]
    pred = tasks[0]["predictions"][0]
    assert pred["model_version"] == batch["checkpoint_id"] and 0 < pred["score"] <= 1
    assert ls.projects[7]["model_version"] == batch["checkpoint_id"]  # the score column's version
    assert pred["result"][0]["from_name"] == "label" and pred["result"][0]["value"]["choices"][0] in {
        "ant",
        "bee",
        "cat",
    }
    # importing the same batch again creates no task
    from worker import context
    from worker.annotation import push_batch as import_batch

    context.configure(client.app.state.settings)  # type: ignore[attr-defined]
    assert import_batch(created["id"], batch["id"]) is True
    assert len(ls.tasks) == 5 and count(db, TaskLink) == 5
    got = client.get(f"/v1/pools/{pool.pool_id}/integrations/{created['id']}", headers=auth).json()
    assert got["tasks_linked"] == 5 and got["status"] == "ok" and got["last_synced_at"] is not None


def test_webhooks_write_update_and_remove_labels(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any, ls: FakeLabelStudio
) -> None:
    pool = make_pool(db, n=60, n_labeled=9)
    give_text(db, pool.pool_id)
    created = connect(client, auth, pool.pool_id, ls).json()
    hook = f"/labelstudio/{created['id']}/{created['secret']}/webhook"
    batch = run_batch(client, auth, pool.pool_id, run_jobs, size=3, strategy="random")
    ext = batch["item_ids"][0]
    task = ls.task_for_item(ext)

    annotation = ls.annotate(task["id"], "bee")
    r = client.post(hook, json={"action": "ANNOTATION_CREATED", "annotation": annotation, "task": task})
    assert r.status_code == 200 and r.json()["status"] == "queued"
    run_jobs(until=lambda: item_label(db, pool.pool_id, ext) == ("labeled", "bee"))
    with session_scope(db) as s:
        who = s.execute(select(Label.annotator).order_by(Label.id.desc()).limit(1)).scalar_one()
    assert who == "labelstudio:1"

    annotation["result"][0]["value"]["choices"] = ["cat"]
    annotation["updated_at"] = datetime.now(UTC).isoformat()  # Label Studio stamps every update
    client.post(hook, json={"action": "ANNOTATION_UPDATED", "annotation": annotation, "task": task})
    run_jobs(until=lambda: item_label(db, pool.pool_id, ext) == ("labeled", "cat"))

    ls.delete_annotations(task["id"])
    r = client.post(hook, json={"action": "ANNOTATIONS_DELETED", "annotations": [{"id": annotation["id"]}]})
    assert r.status_code == 200
    run_jobs(until=lambda: item_label(db, pool.pool_id, ext)[0] != "labeled")
    assert item_label(db, pool.pool_id, ext)[1] is None


def test_reconcile_recovers_a_lost_webhook(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any, ls: FakeLabelStudio
) -> None:
    pool = make_pool(db, n=60, n_labeled=9)
    give_text(db, pool.pool_id)
    created = connect(client, auth, pool.pool_id, ls).json()
    batch = run_batch(client, auth, pool.pool_id, run_jobs, size=3, strategy="random")
    for ext, choice in zip(batch["item_ids"], ["ant", "bee", "cat"], strict=True):
        ls.annotate(ls.task_for_item(ext)["id"], choice)  # no webhook sent
    assert item_label(db, pool.pool_id, batch["item_ids"][0])[0] == "reserved"
    r = client.post(f"/v1/pools/{pool.pool_id}/integrations/{created['id']}/reconcile", headers=auth)
    assert r.status_code == 202
    run_jobs(until=lambda: item_label(db, pool.pool_id, batch["item_ids"][2]) == ("labeled", "cat"))
    assert [item_label(db, pool.pool_id, e)[1] for e in batch["item_ids"]] == ["ant", "bee", "cat"]
    # a second reconcile changes nothing (no new history rows)
    with session_scope(db) as s:
        before = s.execute(select(func.count()).select_from(Label)).scalar_one()
    client.post(f"/v1/pools/{pool.pool_id}/integrations/{created['id']}/reconcile", headers=auth)
    run_jobs()
    with session_scope(db) as s:
        assert s.execute(select(func.count()).select_from(Label)).scalar_one() == before


def test_predict_answers_one_result_per_task_in_order(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any, ls: FakeLabelStudio
) -> None:
    pool = make_pool(db, n=60, n_labeled=9)
    created = connect(client, auth, pool.pool_id, ls, verify=True).json()
    base = f"/labelstudio/{created['id']}/{created['secret']}"
    tasks = [
        {"id": 1, "data": {"item_id": "item-00030"}},
        {"id": 2, "data": {"item_id": "not-ours"}},
        {"id": 3, "data": {"item_id": "item-00031"}},
    ]
    before = client.post(f"{base}/predict", json={"tasks": tasks}).json()["results"]
    assert [p["model_version"] for p in before] == ["untrained"] * 3 and all(p["result"] == [] for p in before)
    batch = run_batch(client, auth, pool.pool_id, run_jobs, size=3)
    version = client.post(f"{base}/setup", json={}).json()["model_version"]
    assert version == batch["checkpoint_id"]
    # the ML backend's /predict waits for a prediction job (RQ runs it in this thread)
    r = _while_jobs_run(run_jobs, lambda: client.post(f"{base}/predict", json={"tasks": tasks}))
    results = r.json()["results"]
    assert len(results) == 3 and all(r["model_version"] == version for r in results)
    assert results[1]["result"] == [] and results[1]["score"] == 0.0
    for r in (results[0], results[2]):
        assert r["result"][0]["type"] == "choices" and 1 / 3 <= r["score"] <= 1

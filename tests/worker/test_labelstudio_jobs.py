"""Label Studio jobs against a Label Studio peer on 127.0.0.1 that fails in the ways a real one does:
every failure shows on the integration (and, for an import, on the batch); nothing is dropped silently."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.db import session_scope
from service.store.models import Integration, TaskLink
from tests.fake_labelstudio import TEXT_CONFIG, FakeLabelStudio, fake_labelstudio
from tests.service.test_integrations import connect, give_text, item_label, run_batch
from tests.worker.factories import make_pool
from worker import context
from worker.annotation import apply_annotation, reconcile
from worker.annotation import push_batch as import_batch


@pytest.fixture
def settings(settings: Settings) -> Settings:
    """The peers of these tests listen on 127.0.0.1, which the outbound guard refuses by default: the
    operator allowlist opens it, as the README's local setup does."""
    return settings.model_copy(update={"outbound_allow": "127.0.0.1"})


@pytest.fixture
def ls() -> Iterator[FakeLabelStudio]:
    with fake_labelstudio() as fake:
        yield fake


def integration(db: sessionmaker[Session], integration_id: str) -> tuple[str, str | None]:
    with session_scope(db) as s:
        row = s.get(Integration, integration_id)
        assert row is not None
        return row.status, row.last_error


def links(db: sessionmaker[Session]) -> int:
    with session_scope(db) as s:
        return int(s.execute(select(func.count()).select_from(TaskLink)).scalar_one())


@pytest.mark.parametrize(
    ("breakage", "says"),
    [
        ("token", "rejected the API token"),
        ("down", "unreachable"),
        ("server_error", "answered HTTP 500 Internal Server Error"),
        ("mapping", "map to no class"),
        ("shows_other_field", "has no 'body' for the labeling config to show"),
    ],
)
def test_import_failure_shows_on_batch_and_integration(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], run_jobs: Any, breakage: str, says: str
) -> None:
    pool = make_pool(db, n=40, n_labeled=6)
    give_text(db, pool.pool_id)
    fake = FakeLabelStudio().start()
    try:
        created = connect(client, auth, pool.pool_id, fake).json()
        if breakage == "token":
            fake.token = "rotated"
        elif breakage == "down":
            fake.stop()
        elif breakage == "server_error":
            fake.fail_with = 500
        elif breakage == "shows_other_field":  # a second object tag shows a field we do not send
            fake.projects[7]["label_config"] = TEXT_CONFIG.replace("</View>", '<Text name="b" value="$body"/></View>')
        elif breakage == "mapping":
            fake.projects[7]["label_config"] = TEXT_CONFIG.replace('"cat"', '"dog"')
        batch = run_batch(client, auth, pool.pool_id, run_jobs, size=3, strategy="random")
    finally:
        if breakage != "down":
            fake.stop()
    assert batch["status"] == "succeeded"  # the selection itself did succeed
    assert batch["error"] is not None and "Label Studio import failed" in batch["error"] and says in batch["error"]
    info = batch["diagnostics"]["labelstudio"][created["id"]]
    assert info["status"] == "error" and says in info["error"]
    status, error = integration(db, created["id"])
    assert status == "error" and error is not None and says in error
    shown = client.get(f"/v1/pools/{pool.pool_id}/integrations/{created['id']}", headers=auth).json()
    assert shown["status"] == "error" and says in shown["last_error"]
    assert links(db) == 0 and fake.tasks == {}


def test_import_after_recovery_clears_the_error_and_imports_once(
    client: TestClient,
    auth: dict[str, str],
    db: sessionmaker[Session],
    run_jobs: Any,
    ls: FakeLabelStudio,
    settings: Any,
) -> None:
    pool = make_pool(db, n=40, n_labeled=6)
    give_text(db, pool.pool_id)
    created = connect(client, auth, pool.pool_id, ls).json()
    ls.fail_with = 502
    batch = run_batch(client, auth, pool.pool_id, run_jobs, size=3, strategy="random")
    assert integration(db, created["id"])[0] == "error"
    ls.fail_with = None
    context.configure(settings)
    assert import_batch(created["id"], batch["id"]) is True
    assert import_batch(created["id"], batch["id"]) is True
    assert len(ls.tasks) == 3 and links(db) == 3
    assert integration(db, created["id"]) == ("ok", None)


def test_reconcile_failure_and_bad_annotation_are_reported(
    client: TestClient,
    auth: dict[str, str],
    db: sessionmaker[Session],
    run_jobs: Any,
    ls: FakeLabelStudio,
    settings: Any,
) -> None:
    pool = make_pool(db, n=40, n_labeled=6)
    give_text(db, pool.pool_id)
    created = connect(client, auth, pool.pool_id, ls).json()
    batch = run_batch(client, auth, pool.pool_id, run_jobs, size=2, strategy="random")
    context.configure(settings)
    good, bad = (ls.task_for_item(e) for e in batch["item_ids"])
    ls.annotate(good["id"], "ant")
    ls.annotate(bad["id"], "wolf")  # not a choice of the config: does not fit the mapping
    counts = reconcile(created["id"])
    assert counts is not None and counts["written"] == 1
    assert item_label(db, pool.pool_id, batch["item_ids"][0]) == ("labeled", "ant")
    assert item_label(db, pool.pool_id, batch["item_ids"][1])[0] == "reserved"
    status, error = integration(db, created["id"])
    assert status == "error" and error is not None and "'wolf' maps to no class" in error
    ls.token = "rotated"
    reconcile(created["id"])
    assert "rejected the API token" in (integration(db, created["id"])[1] or "")


def test_reconcile_adopts_tasks_whose_links_were_lost(
    client: TestClient,
    auth: dict[str, str],
    db: sessionmaker[Session],
    run_jobs: Any,
    ls: FakeLabelStudio,
    settings: Any,
) -> None:
    pool = make_pool(db, n=40, n_labeled=6)
    give_text(db, pool.pool_id)
    created = connect(client, auth, pool.pool_id, ls).json()
    batch = run_batch(client, auth, pool.pool_id, run_jobs, size=2, strategy="random")
    with session_scope(db) as s:
        s.query(TaskLink).delete()
    context.configure(settings)
    counts = reconcile(created["id"])
    assert counts is not None and counts["adopted"] == 2 and links(db) == 2
    assert import_batch(created["id"], batch["id"]) is True
    assert len(ls.tasks) == 2  # adopted tasks are not imported again


def test_annotation_webhook_for_a_task_that_is_not_ours_is_ignored(
    client: TestClient, auth: dict[str, str], db: sessionmaker[Session], ls: FakeLabelStudio, settings: Any
) -> None:
    pool = make_pool(db, n=20, n_labeled=3)
    created = connect(client, auth, pool.pool_id, ls).json()
    context.configure(settings)
    event = {"action": "ANNOTATION_CREATED", "task_id": 999, "task_data": {"item_id": "someone-else"},
             "annotation": {"id": 1, "result": []}}  # fmt: skip
    assert apply_annotation(created["id"], event) == "not our task"
    result = [{"from_name": "label", "to_name": "text", "type": "choices", "value": {"choices": ["wolf"]}}]
    event = {"action": "ANNOTATION_CREATED", "task_id": 998, "task_data": {"item_id": "item-00010"},
             "annotation": {"id": 2, "result": result}}  # fmt: skip
    assert apply_annotation(created["id"], event).startswith("error: choice 'wolf'")
    assert "webhook ANNOTATION_CREATED" in (integration(db, created["id"])[1] or "")

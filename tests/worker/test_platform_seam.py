"""The annotation-platform seam: a second platform is one AnnotationPlatform subclass registered by kind, and
the jobs (reconcile before a batch, push after it, reconcile runs, annotation events), the integrations API
and the dashboard reach it through the interface alone, without any code of Label Studio's."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from service import crypto
from service.config import Settings
from service.db import session_scope
from service.domain import dashboard, platforms
from service.domain import integrations as integrations_domain
from service.domain.platforms import AnnotationPlatform, PlatformEnv, platform_for
from service.domain.platforms.labelstudio import LabelStudioPlatform
from service.queue import JobQueue
from service.store.models import Batch, Integration
from tests.worker.factories import make_pool, tenant_id


class RecordingPlatform(AnnotationPlatform):
    """A platform that records what the service asks of it."""

    kind = "recording"
    title = "Recording"

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def push_batch(self, env: PlatformEnv, integration_id: str, batch_id: str) -> bool:
        with session_scope(env.sessionmaker) as s:
            batch = s.get(Batch, batch_id)
            assert batch is not None
            held = (integration_id, batch.status, batch.progress_stage, list(batch.item_ids or []))
            self.calls.append(("push", held))
        return True

    def reconcile(
        self, env: PlatformEnv, integration_id: str, *, deadline: float | None = None, raise_errors: bool = False
    ) -> dict[str, int] | None:
        self.calls.append(("reconcile", integration_id))
        return {"tasks": 0, "written": 0}

    def apply_event(self, env: PlatformEnv, integration_id: str, event: dict[str, Any]) -> str:
        self.calls.append(("event", event))
        return "unchanged"

    def handle_webhook(
        self,
        session: Session,
        queue: JobQueue,
        integration: Integration,
        payload: dict[str, Any],
        *,
        verified: bool,
        hint_interval_s: float = 60.0,
    ) -> dict[str, Any]:
        return {"status": "ignored"}

    def predict(
        self,
        session: Session,
        queue: JobQueue,
        settings: Settings,
        integration: Integration,
        tasks: list[dict[str, Any]],
    ) -> list[dict[str, Any]]:
        return []

    def health(self, session: Session, integration: Integration) -> dict[str, Any]:
        self.calls.append(("health", integration.id))
        return integrations_domain.view(session, integration)


@pytest.fixture
def recording(monkeypatch: pytest.MonkeyPatch) -> RecordingPlatform:
    platform = RecordingPlatform()
    monkeypatch.setitem(platforms.PLATFORMS, platform.kind, platform)
    return platform


def connect_recording(db: sessionmaker[Session], settings: Settings, pool_id: str) -> str:
    now = datetime.now(UTC)
    with session_scope(db) as s:
        row = Integration(
            pool_id=pool_id,
            kind="recording",
            url="http://127.0.0.1:9",
            token_encrypted=crypto.encrypt(settings, "token"),
            project_id=1,
            config={},
            secret_hash=crypto.hash_secret(crypto.new_secret()),
            status="ok",
            state={},
            created_at=now,
            updated_at=now,
        )
        s.add(row)
        s.flush()
        return row.id


def test_every_registered_platform_implements_the_interface() -> None:
    assert isinstance(platform_for("labelstudio"), LabelStudioPlatform)
    for kind, platform in platforms.PLATFORMS.items():
        assert isinstance(platform, AnnotationPlatform) and platform.kind == kind
    with pytest.raises(LookupError, match="no annotation platform 'argilla'"):
        platform_for("argilla")


def test_a_batch_reconciles_then_pushes_through_the_platform_of_its_integration(
    client: TestClient,
    auth: dict[str, str],
    db: sessionmaker[Session],
    settings: Settings,
    run_jobs: Any,
    recording: RecordingPlatform,
) -> None:
    pool = make_pool(db, n=40, n_labeled=6)
    integration_id = connect_recording(db, settings, pool.pool_id)
    r = client.post(f"/v1/pools/{pool.pool_id}/batches", json={"size": 3, "strategy": "random"}, headers=auth)
    assert r.status_code == 202, r.text
    run_jobs()
    batch = client.get(r.headers["Location"], headers=auth).json()
    assert batch["status"] == "succeeded", batch["error"]
    # reconcile first (selection sees every label), then the push of the stored batch, still running (stage push)
    assert [c[0] for c in recording.calls] == ["reconcile", "push"]
    assert recording.calls[1][1] == (integration_id, "running", "push", batch["item_ids"])


def test_reconcile_runs_events_and_views_reach_the_platform(
    client: TestClient,
    auth: dict[str, str],
    db: sessionmaker[Session],
    settings: Settings,
    run_jobs: Any,
    recording: RecordingPlatform,
) -> None:
    from worker import context
    from worker.annotation import apply_annotation

    pool = make_pool(db, n=20, n_labeled=4)
    integration_id = connect_recording(db, settings, pool.pool_id)
    base = f"/v1/pools/{pool.pool_id}/integrations/{integration_id}"
    r = client.post(f"{base}/reconcile", headers=auth)
    assert r.status_code == 202, r.text
    run_jobs()
    run = client.get(f"{base}/reconciles/{r.json()['id']}", headers=auth).json()
    assert (run["status"], run["counts"]) == ("succeeded", {"tasks": 0, "written": 0})
    context.configure(settings)
    assert apply_annotation(integration_id, {"annotation": {"id": 1}}) == "unchanged"
    got = client.get(base, headers=auth).json()
    assert (got["id"], got["kind"], got["status"]) == (integration_id, "recording", "ok")
    with session_scope(db) as s:
        page = dashboard.pool_page(s, tenant_id(db, "acme"), pool.pool_id)
    assert [i["kind"] for i in page["integrations"]] == ["recording"]
    assert [c[0] for c in recording.calls] == ["reconcile", "event", "health", "health"]

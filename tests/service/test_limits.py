"""GET /v1/limits: the operator's size and rate limits, as configured, for a key with `read`."""

from __future__ import annotations

from fastapi.testclient import TestClient
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.db import session_scope
from service.domain.keys import create_key
from service.main import create_app


def test_limits_are_the_configured_ones(settings: Settings, db: sessionmaker[Session], auth: dict[str, str]) -> None:
    changed = settings.model_copy(
        update={"max_upload_bytes": 123_456, "max_items_per_request": 777, "rate_limit_expensive": "9/minute"}
    )
    with TestClient(create_app(changed)) as c:
        body = c.get("/v1/limits", headers=auth).json()
        assert body["max_upload_bytes"] == 123_456 and body["max_items_per_request"] == 777
        assert body["max_json_bytes"] == changed.max_json_bytes
        assert body["max_upload_inflated_bytes"] == changed.max_upload_inflated_bytes
        assert (body["rate_limit"], body["rate_limit_expensive"]) == ("off", "9/minute")
        assert c.get("/v1/limits").status_code == 401
        with session_scope(db) as s:
            labeler, _ = create_key(s, "acme", scopes=["label"])
        denied = c.get("/v1/limits", headers={"Authorization": f"Bearer {labeler}"})
        assert denied.status_code == 403 and denied.json()["error"]["details"]["required_scope"] == "read"

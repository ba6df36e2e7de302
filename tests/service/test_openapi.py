"""The OpenAPI document describes every route: request bodies (with schemas) for every route that takes
one, and the error responses each route can answer with (issue #13)."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.config import Settings
from service.main import create_app

# Routes that take no body (their POST is an action on the resource the path names). Anything else that is
# POST/PUT/PATCH must document a request body.
BODILESS = {
    ("post", "/v1/pools/{pool}/batches/{batch_id}/cancel"),
    ("post", "/v1/pools/{pool}/integrations/{integration_id}/reconcile"),
    ("post", "/v1/pools/{pool}/embed"),
    ("post", "/v1/pools/{pool}/batches/{batch_id}/delivery"),  # retry the push to Label Studio
    ("post", "/v1/pools/{pool}/integrations/{integration_id}/rotate-secret"),
    ("post", "/labelstudio/{integration_id}/{secret}/setup"),  # Label Studio sends a body; it is not read
    ("post", "/labelstudio/{integration_id}/setup"),
}
# Every /v1 route can answer these (bad input, no key, no scope, nothing there, rate limit, a bug, an outage).
COMMON_ERRORS = {"400", "401", "403", "404", "422", "429", "500", "503"}
UPLOADS = {("post", "/v1/select"), ("post", "/v1/pools/{pool}/items:bulk")}


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    url = f"sqlite:///{tmp_path_factory.mktemp('openapi')}/unused.db"
    app = create_app(Settings(database_url=url, print_bootstrap_key=False), check_migrations=False)
    doc: dict[str, Any] = app.openapi()
    return doc


def operations(spec: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(m, path, op) for path, ops in spec["paths"].items() for m, op in ops.items()]


def test_every_route_that_takes_a_body_documents_it(spec: dict[str, Any]) -> None:
    missing = []
    for method, path, op in operations(spec):
        if method not in ("post", "put", "patch") or (method, path) in BODILESS:
            continue
        content = (op.get("requestBody") or {}).get("content") or {}
        if not content or not all(media.get("schema") for media in content.values()):
            missing.append(f"{method.upper()} {path}")
    assert not missing, f"routes without a documented request body: {missing}"


def test_bodiless_list_names_real_routes(spec: dict[str, Any]) -> None:
    known = {(m, p) for m, p, _ in operations(spec)}
    assert known >= BODILESS


def test_every_v1_route_declares_its_error_responses(spec: dict[str, Any]) -> None:
    problems = []
    for method, path, op in operations(spec):
        if not path.startswith("/v1/"):
            continue
        declared = set(op.get("responses", {}))
        if not declared >= COMMON_ERRORS:
            problems.append(f"{method.upper()} {path}: missing {sorted(COMMON_ERRORS - declared)}")
        for code in declared & COMMON_ERRORS:
            schema = op["responses"][code]["content"]["application/json"]["schema"]
            if schema.get("$ref") != "#/components/schemas/ErrorBody":
                problems.append(f"{method.upper()} {path}: {code} is not the error body")
    assert not problems, problems


def test_upload_routes_declare_415(spec: dict[str, Any]) -> None:
    for method, path in UPLOADS:
        assert "415" in spec["paths"][path][method]["responses"], path


def test_select_documents_both_body_forms(spec: dict[str, Any]) -> None:
    body = spec["paths"]["/v1/select"]["post"]["requestBody"]
    assert body["required"] is True
    json_form = body["content"]["application/json"]
    assert set(json_form["schema"]["required"]) == {"strategy", "batch_size", "embeddings"}
    assert set(json_form["schema"]["properties"]) >= {"embeddings", "probs", "labeled", "reserved", "params"}
    assert json_form["example"]["strategy"] == "bait"
    form = body["content"]["multipart/form-data"]["schema"]
    assert form["properties"]["arrays"] == {
        "type": "string",
        "format": "binary",
        "description": form["properties"]["arrays"]["description"],
    }
    assert set(form["properties"]) == {"arrays", "strategy", "batch_size", "task", "params"}
    assert "max_select_inflated_bytes" in body["description"]


def test_bulk_upload_documents_its_file_body(spec: dict[str, Any]) -> None:
    content = spec["paths"]["/v1/pools/{pool}/items:bulk"]["post"]["requestBody"]["content"]
    assert content["application/octet-stream"]["schema"]["format"] == "binary"
    assert content["multipart/form-data"]["schema"]["properties"]["file"]["format"] == "binary"


def test_request_models_carry_examples(spec: dict[str, Any]) -> None:
    schemas = spec["components"]["schemas"]
    for name in ("PoolCreate", "ItemsUpsert", "LabelsPut", "BatchCreate", "PredictionsIn", "WebhookCreate"):
        assert schemas[name].get("examples"), name


def test_the_documented_415_is_what_select_answers(client: TestClient, auth: dict[str, str]) -> None:
    resp = client.post("/v1/select", content=b"embeddings", headers={**auth, "Content-Type": "text/plain"})
    assert resp.status_code == 415, resp.text
    assert resp.json()["error"]["code"] == "unsupported_media_type"


def test_the_json_example_of_select_is_accepted(client: TestClient, auth: dict[str, str], run_jobs: Any) -> None:
    from concurrent.futures import ThreadPoolExecutor

    example = client.app.openapi()["paths"]["/v1/select"]["post"]["requestBody"]["content"]["application/json"]  # type: ignore[attr-defined]
    with ThreadPoolExecutor(1) as ex:
        fut = ex.submit(client.post, "/v1/select", json=example["example"], headers=auth)
        run_jobs(until=fut.done)
        resp = fut.result()
    assert resp.status_code == 200, resp.text
    assert len(resp.json()["indices"]) == 2

"""The client covers the whole API, and the sync and async clients stay one surface.

ROUTES maps every operation of the service's OpenAPI document (``service.main.create_app().openapi()``)
to the client method that calls it; EXCLUDED names the routes that are not for SDK users, each with why.
A new route in neither fails here, as does a mapped method that does not exist or a stale entry.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import pytest
from bait_client import AsyncClient, Client

from service.config import Settings
from service.main import create_app

ROUTES: dict[tuple[str, str], str] = {
    # pools
    ("GET", "/v1/pools"): "pools",
    ("POST", "/v1/pools"): "create_pool",
    ("GET", "/v1/pools/{pool}"): "pool",
    ("PATCH", "/v1/pools/{pool}"): "update_pool",
    ("DELETE", "/v1/pools/{pool}"): "delete_pool",
    # items and their split
    ("POST", "/v1/pools/{pool}/items"): "add_items",
    ("GET", "/v1/pools/{pool}/items"): "items",
    ("PATCH", "/v1/pools/{pool}/items"): "move_items",
    ("POST", "/v1/pools/{pool}/items:bulk"): "upload",
    ("GET", "/v1/pools/{pool}/items/{item_id}"): "item",
    ("POST", "/v1/pools/{pool}/items:import"): "import_items",
    ("GET", "/v1/pools/{pool}/imports"): "imports",
    ("GET", "/v1/pools/{pool}/imports/{import_id}"): "get_import",
    # labels
    ("PUT", "/v1/pools/{pool}/labels"): "label",
    ("DELETE", "/v1/pools/{pool}/labels/{item_id}"): "delete_label",
    ("GET", "/v1/pools/{pool}/labels/{item_id}/history"): "label_history",
    # batches
    ("POST", "/v1/pools/{pool}/batches"): "request_batch",
    ("GET", "/v1/pools/{pool}/batches"): "batches",
    ("GET", "/v1/pools/{pool}/batches/{batch_id}"): "batch",
    ("POST", "/v1/pools/{pool}/batches/{batch_id}/delivery"): "redeliver_batch",
    ("POST", "/v1/pools/{pool}/batches/{batch_id}/cancel"): "cancel_batch",
    # model and quality
    ("GET", "/v1/pools/{pool}/checkpoints"): "checkpoints",
    ("POST", "/v1/pools/{pool}/predictions"): "predictions",
    ("GET", "/v1/pools/{pool}/curve"): "curve",
    ("GET", "/v1/pools/{pool}/map"): "pool_map",
    # stateless selection and strategies
    ("POST", "/v1/select"): "select",
    ("GET", "/v1/select/{job_id}"): "selection",
    ("GET", "/v1/strategies"): "strategies",
    ("GET", "/v1/limits"): "limits",
    # Label Studio integrations
    ("POST", "/v1/pools/{pool}/integrations/labelstudio"): "connect_labelstudio",
    ("GET", "/v1/pools/{pool}/integrations"): "integrations",
    ("GET", "/v1/pools/{pool}/integrations/{integration_id}"): "integration",
    ("DELETE", "/v1/pools/{pool}/integrations/{integration_id}"): "delete_integration",
    ("POST", "/v1/pools/{pool}/integrations/{integration_id}/reconcile"): "reconcile",
    ("GET", "/v1/pools/{pool}/integrations/{integration_id}/reconciles"): "reconciles",
    ("GET", "/v1/pools/{pool}/integrations/{integration_id}/reconciles/{run_id}"): "reconcile_run",
    ("POST", "/v1/pools/{pool}/integrations/{integration_id}/rotate-secret"): "rotate_integration_secret",
    # webhooks
    ("POST", "/v1/pools/{pool}/webhooks"): "add_webhook",
    ("GET", "/v1/pools/{pool}/webhooks"): "webhooks",
    ("GET", "/v1/pools/{pool}/webhooks/{webhook_id}"): "webhook",
    ("DELETE", "/v1/pools/{pool}/webhooks/{webhook_id}"): "delete_webhook",
    ("GET", "/v1/pools/{pool}/webhooks/{webhook_id}/deliveries"): "deliveries",
    # encoders and embed jobs
    ("GET", "/v1/encoders"): "encoders",
    ("POST", "/v1/encoders"): "upload_encoder",
    ("GET", "/v1/encoders/{encoder_id}"): "encoder",
    ("DELETE", "/v1/encoders/{encoder_id}"): "delete_encoder",
    ("POST", "/v1/pools/{pool}/embed"): "start_embed",
    ("GET", "/v1/pools/{pool}/embed"): "embed_job",
    ("GET", "/v1/pools/{pool}/embed/jobs"): "embed_jobs",
    ("GET", "/v1/pools/{pool}/embed/{job_id}"): "embed_job",
}

_PROBE = "probes for orchestrators and load balancers, not for SDK users (no key)"
_ML_BACKEND = "Label Studio's ML-backend protocol: Label Studio calls it, authenticated by the integration's secret"
EXCLUDED: dict[tuple[str, str], str] = {
    ("GET", "/healthz"): _PROBE,
    ("GET", "/readyz"): _PROBE,
    ("GET", "/metrics"): "Prometheus scrapes it with the operator's metrics token, not an API key",
    ("GET", "/labelstudio/content/{token}"): "signed content links that Label Studio's browser opens",
    **{
        (method, f"/labelstudio/{{integration_id}}{secret}/{name}"): _ML_BACKEND
        for secret in ("/{secret}", "")
        for method, name in (("GET", "health"), ("POST", "setup"), ("POST", "predict"), ("POST", "webhook"))
    },
}


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    db = tmp_path_factory.mktemp("openapi") / "bait.db"
    settings = Settings(database_url=f"sqlite:///{db}", print_bootstrap_key=False, secret_key="x" * 20)
    return create_app(settings, check_migrations=False).openapi()


def operations(spec: dict[str, Any]) -> set[tuple[str, str]]:
    methods = {"get", "post", "put", "patch", "delete"}
    return {(m.upper(), path) for path, ops in spec["paths"].items() for m in ops if m in methods}


def test_every_route_of_the_openapi_document_has_a_client_method_or_a_reason(spec: dict[str, Any]) -> None:
    routes = operations(spec)
    unmapped = sorted(routes - set(ROUTES) - set(EXCLUDED))
    assert not unmapped, f"routes without a client method (add one to bait_client and to ROUTES): {unmapped}"
    stale = sorted((set(ROUTES) | set(EXCLUDED)) - routes)
    assert not stale, f"ROUTES/EXCLUDED name routes the service no longer has: {stale}"
    assert not set(ROUTES) & set(EXCLUDED)
    assert all(reason.strip() for reason in EXCLUDED.values())
    assert all(not path.startswith("/v1/") for _, path in EXCLUDED), "every /v1 route is for SDK users"


@pytest.mark.parametrize("cls", [Client, AsyncClient])
def test_every_mapped_method_exists(cls: type) -> None:
    missing = sorted({name for name in ROUTES.values() if not callable(getattr(cls, name, None))})
    assert not missing, f"{cls.__name__} lacks {missing}"


def test_each_mapped_method_calls_its_route() -> None:
    """The method's operation builds the route's path (read from the source of bait_client._ops)."""
    import bait_client._ops as ops

    for (method, path), name in ROUTES.items():
        body = inspect.getsource(getattr(ops.Operations, name))
        assert f'"{method}"' in body, f"{name} does not send {method}"
        assert f'"{path.replace("{pool}", "{pool_id}")}"' in body, f"{name} does not build {path}"


def _public(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in vars(cls).items()
        if callable(member) and not name.startswith("_") and name not in ("close", "aclose")
    }


def test_the_async_client_has_the_same_surface_as_the_sync_client() -> None:
    sync, aio = _public(Client), _public(AsyncClient)
    assert sorted(sync) == sorted(aio)
    for name, sig in sync.items():
        assert list(sig.parameters) == list(aio[name].parameters), name
        for p in sig.parameters.values():
            other = aio[name].parameters[p.name]
            assert (p.kind, p.default) == (other.kind, other.default), (name, p.name)
        is_async = inspect.iscoroutinefunction(getattr(AsyncClient, name))
        emits = "Iterator" in str(sig.return_annotation)
        assert is_async != emits, f"AsyncClient.{name}: awaitable unless it iterates"


def test_the_client_package_declares_only_client_dependencies() -> None:
    import tomllib

    meta = tomllib.loads((Path(__file__).resolve().parents[2] / "client" / "pyproject.toml").read_text())
    deps = {d.split(">")[0].split("=")[0].split("[")[0].strip() for d in meta["project"]["dependencies"]}
    assert deps == {"httpx", "pydantic", "numpy", "tqdm"}
    server_side = {"fastapi", "sqlalchemy", "torch", "redis", "rq", "uvicorn", "alembic"}
    extras = {d.split(">")[0].strip() for ds in meta["project"]["optional-dependencies"].values() for d in ds}
    assert not (deps | extras) & server_side

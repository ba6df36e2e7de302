"""API key scopes and the one table that says which scope each route needs.

A key carries a set of scopes:

- ``read``: every ``GET`` of the tenant's pools, items, labels, batches, checkpoints, jobs, encoders;
- ``label``: write and delete labels (what an annotation tool needs, with ``read``);
- ``select``: create and change pools, upload items, request and cancel batches (and retry their Label
  Studio delivery), start embed jobs,
  stateless ``/v1/select``, predictions;
- ``admin``: anything that configures code or outbound traffic, or destroys a pool: upload and delete
  encoders, webhooks, Label Studio integrations, ``DELETE /v1/pools/{pool}``.

The table is keyed by the endpoint function (``module:name``), so it does not depend on how routers
are mounted; :func:`service.deps.get_tenant` looks the matched route's endpoint up on every request. A
route that authenticates but is missing here needs ``admin`` (fail closed) and the test suite fails
(``tests/service/test_security_scopes.py`` checks every authenticated route is listed).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

READ = "read"
LABEL = "label"
SELECT = "select"
ADMIN = "admin"
ALL_SCOPES: tuple[str, ...] = (READ, LABEL, SELECT, ADMIN)
#: not a scope: a route any valid key (or dashboard session) may use, such as signing out
SIGNED_IN = "signed_in"
#: what `bait keys create` grants without --scope: everything but admin (an operator grants admin on purpose)
DEFAULT_CLI_SCOPES: tuple[str, ...] = (READ, LABEL, SELECT)

# endpoint (module:function) -> the scope it needs
ROUTE_SCOPES: dict[str, str] = {
    # pools
    "service.api.pools:list_pools": READ,
    "service.api.pools:get_pool": READ,
    "service.api.pools:create_pool": SELECT,
    "service.api.pools:patch_pool": SELECT,  # picks among encoders an admin uploaded
    "service.api.pools:delete_pool": ADMIN,
    # items
    "service.api.items:list_items": READ,
    "service.api.items:get_item": READ,
    "service.api.items:upsert_items": SELECT,
    "service.api.items:bulk_upload": SELECT,
    "service.api.imports:import_items": SELECT,  # import by reference: the bulk upload's scope
    "service.api.imports:list_imports": READ,
    "service.api.imports:get_import": READ,
    # validation split and model quality
    "service.api.quality:move_items": SELECT,  # moves items between the train and validation splits
    "service.api.quality:curve": READ,
    "service.api.quality:pool_map": READ,
    # labels
    "service.api.labels:label_history": READ,
    "service.api.labels:put_labels": LABEL,
    "service.api.labels:delete_label": LABEL,
    # batches
    "service.api.batches:list_batches": READ,
    "service.api.batches:get_batch": READ,
    "service.api.batches:create_batch": SELECT,
    "service.api.batches:cancel_batch": SELECT,
    "service.api.batches:retry_delivery": SELECT,  # pushes a succeeded batch to Label Studio again
    # checkpoints and predictions
    "service.api.checkpoints:list_checkpoints": READ,
    "service.api.checkpoints:predictions": SELECT,
    # stateless selection
    "service.api.select:list_strategies": READ,
    # the operator's limits (what a client chunks uploads under)
    "service.api.limits:get_limits": READ,
    "service.api.select:get_select": READ,
    "service.api.select:select": SELECT,
    # embed jobs (run the pool's encoder)
    "service.api.embed_jobs:latest_embed": READ,
    "service.api.embed_jobs:list_embed_jobs": READ,
    "service.api.embed_jobs:get_embed": READ,
    "service.api.embed_jobs:start_embed": SELECT,
    # encoders: code that workers run
    "service.api.encoders:list_encoders": READ,
    "service.api.encoders:get_encoder": READ,
    "service.api.encoders:upload_encoder": ADMIN,
    "service.api.encoders:delete_encoder": ADMIN,
    # outbound traffic: webhooks and Label Studio integrations (their listings show targets and secrets' hints)
    "service.api.webhooks:create_webhook": ADMIN,
    "service.api.webhooks:list_webhooks": ADMIN,
    "service.api.webhooks:get_webhook": ADMIN,
    "service.api.webhooks:delete_webhook": ADMIN,
    "service.api.webhooks:list_deliveries": ADMIN,
    "service.api.integrations:connect_labelstudio": ADMIN,
    "service.api.integrations:list_integrations": ADMIN,
    "service.api.integrations:get_integration": ADMIN,
    "service.api.integrations:delete_integration": ADMIN,
    "service.api.integrations:reconcile": ADMIN,
    "service.api.integrations:get_reconcile": ADMIN,
    "service.api.integrations:list_reconciles": ADMIN,
    "service.api.integrations:rotate_secret": ADMIN,
    # the dashboard (/ui): each page needs the scope of the API route that serves the same data
    "service.web.routes:pools_page": READ,  # GET /v1/pools
    "service.web.routes:pool_page": READ,  # GET /v1/pools/{pool}, its batches and curve
    "service.web.routes:batches_fragment": READ,  # GET /v1/pools/{pool}/batches
    "service.web.routes:curve_json": READ,  # GET /v1/pools/{pool}/curve
    "service.web.routes:map_json": READ,  # GET /v1/pools/{pool}/map
    "service.web.routes:batch_page": READ,  # GET /v1/pools/{pool}/batches/{batch}
    "service.web.routes:export_batch": READ,  # GET /v1/pools/{pool}/batches/{batch} + items
    "service.web.routes:request_batch": SELECT,  # POST /v1/pools/{pool}/batches
    "service.web.routes:cancel_batch": SELECT,  # POST .../batches/{batch}/cancel
    "service.web.routes:label_item": LABEL,  # PUT /v1/pools/{pool}/labels
    "service.web.routes:logout": SIGNED_IN,
    "service.web.routes:sessions_page": ADMIN,  # the tenant's keys' sessions
    "service.web.routes:end_session": ADMIN,
}

# Routes that cost the service real work (uploads, jobs, outbound calls): they count against the
# lower BAIT_RATE_LIMIT_EXPENSIVE as well as BAIT_RATE_LIMIT.
EXPENSIVE_ROUTES: frozenset[str] = frozenset(
    {
        "service.api.items:upsert_items",
        "service.api.items:bulk_upload",
        "service.api.imports:import_items",
        "service.api.batches:create_batch",
        "service.api.checkpoints:predictions",
        "service.api.select:select",
        "service.api.embed_jobs:start_embed",
        "service.api.encoders:upload_encoder",
        "service.api.integrations:connect_labelstudio",
        "service.api.integrations:reconcile",
        "service.api.batches:retry_delivery",
        "service.web.routes:request_batch",
    }
)


def endpoint_name(endpoint: Callable[..., Any]) -> str:
    """``module:function`` of a route's endpoint: the key of :data:`ROUTE_SCOPES`."""
    return f"{endpoint.__module__}:{endpoint.__qualname__}"


def required_scope(endpoint: Callable[..., Any] | None) -> str:
    """The scope a route needs; ``admin`` for a route missing from the table (fail closed)."""
    if endpoint is None:
        return ADMIN
    return ROUTE_SCOPES.get(endpoint_name(endpoint), ADMIN)


def parse_scopes(text: str | Iterable[str]) -> tuple[str, ...]:
    """Scopes from ``"read,label"`` (commas or spaces) or a list, in canonical order, without repeats.

    Raises:
        ValueError: an unknown scope, or none at all.
    """
    words = text.replace(",", " ").split() if isinstance(text, str) else [str(w).strip() for w in text]
    unknown = sorted({w for w in words if w not in ALL_SCOPES})
    if unknown:
        raise ValueError(f"unknown scope(s) {unknown}; choose from {list(ALL_SCOPES)}")
    if not words:
        raise ValueError(f"a key needs at least one scope; choose from {list(ALL_SCOPES)}")
    return tuple(s for s in ALL_SCOPES if s in words)


def format_scopes(scopes: Iterable[str]) -> str:
    """How scopes are stored in ``api_keys.scopes``: space-separated, canonical order."""
    return " ".join(parse_scopes(list(scopes)))

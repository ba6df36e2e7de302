"""The FastAPI application factory."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.types import ASGIApp

from service import web
from service.api import batches, checkpoints, health, integrations, items, labels, labelstudio_backend, pools, webhooks
from service.api import embed_jobs as embed_jobs_api
from service.api import encoders as encoders_api
from service.api import imports as imports_api
from service.api import limits as limits_api
from service.api import quality as quality_api
from service.api import select as select_api
from service.config import Settings, get_settings
from service.crypto import check_secret_key
from service.db import make_engine, make_sessionmaker
from service.domain.jobs import RecoveryTicker, recover_jobs
from service.domain.webhooks import SweepTicker
from service.errors import install_error_handlers
from service.headers import SecurityHeaders
from service.logredact import install_log_redaction
from service.metrics import Metrics, MetricsMiddleware
from service.middleware import UPLOAD_PATHS, BodySizeLimitMiddleware
from service.migrate import check_schema
from service.queue import make_queue
from service.ratelimit import KeyRateLimiter
from service.textcheck import InvalidTextMiddleware


class BaitApp(FastAPI):
    """FastAPI with :class:`service.headers.SecurityHeaders` around the whole stack, outside even the
    500 handler, so every response carries the security headers."""

    def build_middleware_stack(self) -> ASGIApp:
        return SecurityHeaders(super().build_middleware_stack())


def create_app(settings: Settings | None = None, *, check_migrations: bool = True) -> FastAPI:
    """Build the app. Refuses to start (raises SchemaOutdated) on a schema behind the migrations."""
    settings = settings or get_settings()
    install_log_redaction()  # no URL credentials in any log line of this process, whichever library writes it
    check_secret_key(settings)  # PostgreSQL without BAIT_SECRET_KEY: refuse to start
    engine = make_engine(settings)
    if check_migrations:
        check_schema(engine, settings.database_url, settings.database_label())
    factory = make_sessionmaker(engine)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        queue = make_queue(settings)
        queue.start()
        ticker = SweepTicker(queue, settings.webhook_sweep_seconds)  # retries of outgoing webhooks
        ticker.start()
        app.state.queue = queue
        recovery: RecoveryTicker | None = None
        if queue.mode == "inprocess":
            # Jobs left queued or running in the database belonged to a process that is gone.
            recover_jobs(factory, queue, settings, assume_dead=True)
            recovery = RecoveryTicker(factory, queue, settings)  # and jobs that meet a database outage later
            recovery.start()
        try:
            yield
        finally:
            if recovery is not None:
                recovery.stop()
            ticker.stop()
            queue.stop()
            engine.dispose()

    app = BaitApp(
        title="bait-service",
        version="0.1.0",
        description="Which items to label next: BAIT batch active learning as a service.",
        lifespan=lifespan,
        docs_url=None,  # /docs and /redoc are served by service.web with vendored assets (offline)
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.engine = engine
    app.state.sessionmaker = factory
    app.state.rate_limiter = KeyRateLimiter(settings.rate_limit, settings.rate_limit_expensive, settings.redis_url)
    install_error_handlers(app)
    for module in (health, pools, items, labels, batches, checkpoints, select_api, integrations, webhooks):
        app.include_router(module.router)
    app.include_router(labelstudio_backend.content_router)  # before the ML-backend routes it shares a prefix with
    app.include_router(labelstudio_backend.router)
    app.include_router(encoders_api.router)
    app.include_router(embed_jobs_api.router)
    app.include_router(imports_api.router)
    app.include_router(quality_api.router)
    app.include_router(limits_api.router)
    web.install(app)
    # Outermost last: metrics see every response, including the body limit's 413s.
    app.add_middleware(
        BodySizeLimitMiddleware,
        max_json_bytes=settings.max_json_bytes,
        max_upload_bytes=settings.max_upload_bytes,
        upload_paths=(*UPLOAD_PATHS, encoders_api.UPLOAD_PATH),
    )
    app.add_middleware(InvalidTextMiddleware)  # NUL/control characters in the URL: 400 before any route
    app.state.metrics = Metrics(factory)
    app.add_middleware(MetricsMiddleware, metrics=app.state.metrics)
    return app

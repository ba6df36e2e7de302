"""Property-based tests of the whole API from its OpenAPI document (schemathesis), against a real uvicorn
server on 127.0.0.1, authenticated with a test key: no 5xx, and every status code, content type and body
as documented. Bounded (a few derandomized examples per operation) so the run stays short on 2 cores.

Generated data can name any host (webhook and Label Studio URLs, http(s) item references): name resolution
and connects to anything but loopback are refused in this process while the tests run, so no packet can
leave the machine even if a guard in the service were broken.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.main import create_app
from tests.service.live import serve_in_thread

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


def _loopback(host: Any) -> bool:
    if host in ("localhost", "127.0.0.1", "::1"):
        return True
    try:
        return ipaddress.ip_address(str(host).split("%")[0]).is_loopback
    except ValueError:
        return False


@pytest.fixture
def loopback_only(monkeypatch: pytest.MonkeyPatch) -> None:
    real_getaddrinfo = socket.getaddrinfo
    real_connect = socket.socket.connect
    real_connect_ex = socket.socket.connect_ex

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host is not None and not _loopback(host):
            raise socket.gaierror(socket.EAI_NONAME, f"test: name resolution of {host!r} refused (loopback only)")
        return real_getaddrinfo(host, *args, **kwargs)

    def check(address: Any) -> None:
        if isinstance(address, tuple) and not _loopback(address[0]):
            raise ConnectionRefusedError(f"test: connect to {address!r} refused (loopback only)")

    def connect(self: socket.socket, address: Any) -> None:
        check(address)
        real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> int:
        check(address)
        return real_connect_ex(self, address)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)
    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)


@pytest.fixture
def fuzz_server(settings: Settings, db: sessionmaker[Session], loopback_only: None) -> Iterator[str]:
    # Synchronous selections and predictions wait at most a second for their job (nothing runs RQ jobs here).
    app = create_app(settings.model_copy(update={"sync_select_wait_seconds": 1.0}))
    with serve_in_thread(app) as base:
        yield base


def _openapi() -> dict[str, Any]:
    """The app's OpenAPI document (the app is built, not started: no database is touched)."""
    app = create_app(Settings(database_url="sqlite://", print_bootstrap_key=False), check_migrations=False)
    return app.openapi()


schema = schemathesis.openapi.from_dict(_openapi())


@schema.parametrize()
@settings(
    max_examples=6,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_api_conforms_to_its_openapi(case: Any, fuzz_server: str, api_key: str) -> None:
    case.call_and_validate(
        base_url=fuzz_server, headers={"Authorization": f"Bearer {api_key}"}, checks=CHECKS, timeout=30
    )

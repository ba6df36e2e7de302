"""A real S3 endpoint for tests: moto's server mode on 127.0.0.1 (a dev dependency), with the credentials every
process that reaches it takes from its environment, as the service and the Dask workers do."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.e2e.procs import free_port

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test", "AWS_EC2_METADATA_DISABLED": "true"}


@contextmanager
def moto_server(log_path: Path, env: pytest.MonkeyPatch) -> Iterator[int]:
    """Start the server (its output in ``log_path``), set the credentials in ``env``; yields its port. Stopped
    after (SIGTERM, then SIGKILL)."""
    port = free_port()
    with open(log_path, "wb") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and server.poll() is None, log_path.read_text()
                time.sleep(0.1)
        for key, value in CREDENTIALS.items():
            env.setenv(key, value)
        yield port
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(5)

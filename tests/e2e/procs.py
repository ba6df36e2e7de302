"""Real `bait serve` / `bait worker` processes for the end-to-end and worker-death tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bait_env(database_url: str, redis_url: str | None, queue_name: str, **extra: Any) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BAIT_")}
    env.update(
        BAIT_DATABASE_URL=database_url,
        BAIT_QUEUE_NAME=queue_name,
        BAIT_DEVICE="cpu",
        BAIT_PRINT_BOOTSTRAP_KEY="false",
        BAIT_LOG_LEVEL="INFO",
        BAIT_SECRET_KEY="e2e-secret-key-0123456789",
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
    )
    if redis_url:
        env["BAIT_REDIS_URL"] = redis_url
    env.update({f"BAIT_{k.upper()}": str(v) for k, v in extra.items()})
    return env


def bait(*args: str, env: dict[str, str], timeout: float = 120) -> str:
    """Run a `bait` command to completion; its stdout."""
    out = subprocess.run(
        [sys.executable, "-m", "service.cli", *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
    assert out.returncode == 0, f"bait {' '.join(args)} failed:\n{out.stdout}\n{out.stderr}"
    return out.stdout


class Proc:
    """A `bait` process in its own process group (so a kill takes down everything it started)."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.args = args
        self.log = log
        self._fh = log.open("ab")
        self.p = subprocess.Popen(
            [sys.executable, "-m", "service.cli", *args],
            env=env,
            cwd=ROOT,
            stdout=self._fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def alive(self) -> bool:
        return self.p.poll() is None

    def kill9(self) -> None:
        """Die as a machine dies: SIGKILL to the whole group, no cleanup."""
        if self.alive():
            os.killpg(self.p.pid, signal.SIGKILL)
        self.p.wait(30)
        self._fh.close()

    def stop(self) -> None:
        if self.alive():
            os.killpg(self.p.pid, signal.SIGTERM)
            try:
                self.p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.p.pid, signal.SIGKILL)
                self.p.wait(30)
        self._fh.close()

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def serve(env: dict[str, str], log: Path, *, migrate: bool = False) -> tuple[Proc, str]:
    port = free_port()
    args = ["serve", "--host", "127.0.0.1", "--port", str(port)] + (["--migrate"] if migrate else [])
    proc = Proc(args, env, log)
    base = f"http://127.0.0.1:{port}"
    wait_for(lambda: _up(base), 90, f"`bait serve` did not come up:\n{proc.output()}", proc)
    return proc, base


def _up(base: str) -> bool:
    try:
        return httpx.get(f"{base}/v1/pools", timeout=2).status_code in (200, 401)
    except httpx.HTTPError:
        return False


def wait_for(cond: Callable[[], Any], timeout: float, message: str, proc: Proc | None = None) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        if proc is not None and not proc.alive():
            raise AssertionError(f"process exited: {message}\n{proc.output()[-4000:]}")
        time.sleep(0.1)
    raise AssertionError(message() if callable(message) else message)

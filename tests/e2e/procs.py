"""Real `bait serve` / `bait worker` processes for the end-to-end, worker-death and fault tests, and
private Redis and PostgreSQL servers that the fault tests kill and restart."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
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
        [sys.executable, "-m", "bait.cli", *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout
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
            [sys.executable, "-m", "bait.cli", *args],
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


# ------------------------------------------------------------------------------------------------
# Private Redis and PostgreSQL servers (the fault tests kill and restart them)
# ------------------------------------------------------------------------------------------------


def _as_postgres(cmd: list[str]) -> list[str]:
    """initdb and postgres refuse to run as root: run them as the `postgres` user then."""
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


def postgres_bin() -> Path | None:
    """The folder of initdb/pg_ctl (Debian's /usr/lib/postgresql/<version>/bin), or None."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    if found:
        return found[-1].parent
    which = shutil.which("pg_ctl")
    return Path(which).parent if which else None


class PrivateRedis:
    """A redis-server on a free 127.0.0.1 port, without persistence (a restart loses every key)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.p: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.p = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.folder)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        wait_for(self._up, 20, f"redis-server on port {self.port} did not come up")

    def _up(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def kill9(self) -> None:
        if self.p is not None and self.p.poll() is None:
            self.p.kill()
            self.p.wait(10)

    def stop(self) -> None:
        self.kill9()


class PrivatePostgres:
    """A PostgreSQL cluster in a new temp folder (initdb), on a free 127.0.0.1 port (pg_ctl). The folder
    is made under the system temp folder (not pytest's, which the `postgres` user cannot enter) and
    removed by :meth:`stop`."""

    def __init__(self) -> None:
        bin_dir = postgres_bin()
        assert bin_dir is not None, "no PostgreSQL server binaries (initdb, pg_ctl)"
        self.bin = bin_dir
        self.folder = Path(tempfile.mkdtemp(prefix="bait-faults-pg-"))
        self.data = self.folder / "data"
        self.port = free_port()
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"
        if os.geteuid() == 0:
            shutil.chown(self.folder, "postgres")
        self._run([str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync",
                   "-E", "UTF8"])  # fmt: skip

    def _run(self, cmd: list[str]) -> None:
        out = subprocess.run(_as_postgres(cmd), capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, f"{' '.join(cmd)} failed:\n{out.stdout}\n{out.stderr}"

    def start(self) -> None:
        opts = f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=100"
        self._run([str(self.bin / "pg_ctl"), "-D", str(self.data), "-o", opts, "-l", str(self.folder / "log"),
                   "-w", "-t", "60", "start"])  # fmt: skip

    def crash(self) -> None:
        """Stop as a crash would (``-m immediate``: no checkpoint; the next start replays the WAL)."""
        self._run([str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"])

    def stop(self) -> None:
        subprocess.run(
            _as_postgres([str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"]),
            capture_output=True, timeout=60,
        )  # fmt: skip
        shutil.rmtree(self.folder, ignore_errors=True)

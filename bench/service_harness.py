"""The harness of the benchmarks that measure the service over real HTTP: a scratch database (a SQLite
temp file, or a database created on a PostgreSQL server and dropped after), the api under uvicorn in a
subprocess, a key, the payloads, and the result table (:class:`Row`, :func:`print_table`).

Used by ``bench/service_throughput.py``, ``bench/batch_latency.py``, ``bench/service_many_classes.py``
and the other service benchmarks; :func:`bench_api` is the whole setup in one ``with``.
"""

from __future__ import annotations

import io
import os
import platform
import secrets
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from service.config import Settings  # noqa: E402
from service.db import make_engine, make_sessionmaker, session_scope  # noqa: E402
from service.domain.keys import create_key  # noqa: E402
from service.migrate import upgrade  # noqa: E402


@dataclass
class Row:
    """One line of the result table."""

    what: str
    n: int
    seconds: float
    mb: float | None = None  # payload megabytes (float32 embedding bytes), for MB/s
    note: str = ""

    @property
    def per_second(self) -> float:
        return self.n / self.seconds if self.seconds > 0 else float("inf")


@dataclass
class BenchContext:
    """What a row function gets: a client on the running api, a key, the sizes and a place for pools."""

    client: httpx.Client
    auth: dict[str, str]
    n: int
    d: int
    smoke: bool
    database: str
    pools: dict[str, str] = field(default_factory=dict)  # name -> pool id, made by earlier rows


# ------------------------------------------------------------------------------------------- machine


def machine() -> dict[str, str]:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f"{kb / 2**20:.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    load = ""
    if hasattr(os, "getloadavg"):
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return {
        "python": platform.python_version(),
        "os": f"{platform.system()} {platform.release()}",
        "cpu": f"{cpu} x {os.cpu_count()}",
        "memory": mem,
        "load avg (1/5/15 min)": load,
    }


# ------------------------------------------------------------------------------------------ database


@contextmanager
def scratch_database(database_url: str | None) -> Iterator[tuple[str, str]]:
    """A migrated scratch database: ``(url, description)``; dropped (PostgreSQL) or deleted (SQLite) after."""
    if database_url is None:
        with tempfile.TemporaryDirectory(prefix="bait-bench-") as tmp:
            url = f"sqlite:///{tmp}/bench.db"
            upgrade(url)
            yield url, f"SQLite {sqlite3.sqlite_version} (temp file)"
        return
    admin = make_url(database_url)
    name = f"bait_bench_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin_engine = create_engine(admin, isolation_level="AUTOCOMMIT")
    with admin_engine.connect() as conn:
        version = conn.execute(text("SHOW server_version")).scalar_one()
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = admin.set(database=name).render_as_string(hide_password=False)
    try:
        upgrade(url)
        yield url, f"PostgreSQL {version} ({admin.host}:{admin.port}, scratch database {name})"
    finally:
        with admin_engine.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin_engine.dispose()


def mint_key(url: str) -> str:
    engine = make_engine(Settings(database_url=url))
    with session_scope(make_sessionmaker(engine)) as s:
        key, _ = create_key(s, "bench")
    engine.dispose()
    return key


@contextmanager
def api_server(url: str) -> Iterator[str]:
    """uvicorn serving ``service.main:create_app`` on a free port; yields its base URL."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {
        **os.environ,
        "BAIT_DATABASE_URL": url,
        "BAIT_PRINT_BOOTSTRAP_KEY": "false",
        "BAIT_MAX_UPLOAD_BYTES": str(8 * 2**30),
        "BAIT_LOG_LEVEL": "WARNING",
        # PostgreSQL requires a secret key (it encrypts integration secrets); the scratch database
        # holds none, so a throwaway key will do when the caller has not set one.
        "BAIT_SECRET_KEY": os.environ.get("BAIT_SECRET_KEY") or secrets.token_urlsafe(32),
    }
    env.pop("BAIT_REDIS_URL", None)
    cmd = [sys.executable, "-m", "uvicorn", "service.main:create_app", "--factory", "--port", str(port)]
    proc = subprocess.Popen([*cmd, "--log-level", "warning"], env=env, cwd=REPO)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, proc, 60)
        yield base
    finally:
        proc.terminate()
        # A job still running when the api stops gets 30 s, then dies with the process; a commit that wrote
        # gigabytes on SQLite may still be checkpointing its write-ahead log meanwhile: give the exit time.
        proc.wait(timeout=600)


def wait_healthy(base: str, proc: subprocess.Popen[Any], timeout: float) -> None:
    """Wait until the api at ``base`` answers /healthz; RuntimeError if ``proc`` exits or time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the api did not start")
        time.sleep(0.2)


# ------------------------------------------------------------------------------------------ payloads


def make_data(n: int, d: int, seed: int = 0) -> tuple[list[str], np.ndarray]:
    rng = np.random.default_rng(seed)
    return [f"item-{i:07d}" for i in range(n)], rng.standard_normal((n, d), dtype=np.float32)


def npz_body(ids: list[str], emb: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, ids=np.array(ids), embeddings=emb)
    return buf.getvalue()


def parquet_body(ids: list[str], emb: np.ndarray) -> bytes:
    d = emb.shape[1]
    values = pa.array(emb.reshape(-1), type=pa.float32())
    col = pa.FixedSizeListArray.from_arrays(values, d)
    buf = io.BytesIO()
    pq.write_table(pa.table({"id": ids, "embedding": col}), buf, compression="none")
    return buf.getvalue()


def create_pool(ctx: BenchContext, name: str, head: dict[str, Any] | None = None) -> str:
    classes = [f"c{i}" for i in range(10)]
    body: dict[str, Any] = {"name": name, "task": "classification", "classes": classes, "embedding_dim": ctx.d}
    if head is not None:
        body["head"] = head
    resp = ctx.client.post("/v1/pools", json=body, headers=ctx.auth)
    resp.raise_for_status()
    pool_id: str = resp.json()["id"]
    ctx.pools[name] = pool_id
    return pool_id


def file_like(body: bytes, chunk: int = 2**20) -> Iterator[bytes]:
    """Send a body the way a client sends a file: streamed in chunks. (httpx given one big ``bytes``
    spends ~15 s of client CPU on 300 MB before the server sees it; a stream takes ~1.5 s.)"""
    view = memoryview(body)
    for start in range(0, len(view), chunk):
        yield bytes(view[start : start + chunk])


def timed_upload(ctx: BenchContext, pool: str, body: bytes) -> tuple[float, dict[str, Any]]:
    headers = {"Content-Type": "application/octet-stream", "Content-Length": str(len(body))}
    return timed_post(ctx, f"/v1/pools/{pool}/items:bulk", content=file_like(body), headers=headers)


def timed_post(ctx: BenchContext, path: str, **kwargs: Any) -> tuple[float, dict[str, Any]]:
    t0 = time.perf_counter()
    resp = ctx.client.post(path, headers={**ctx.auth, **kwargs.pop("headers", {})}, **kwargs)
    seconds = time.perf_counter() - t0
    if resp.status_code != 200:
        raise RuntimeError(f"{path}: {resp.status_code} {resp.text[:500]}")
    out: dict[str, Any] = resp.json()
    return seconds, out


# -------------------------------------------------------------------------------------------- output


def print_table(rows: list[Row]) -> None:
    header = f"| {'measurement':44} | {'n':>9} | {'seconds':>8} | {'rows/s':>10} | {'MB/s':>7} | note"
    print(header)
    print("|" + "-" * 46 + "|" + "-" * 11 + "|" + "-" * 10 + "|" + "-" * 12 + "|" + "-" * 9 + "|------")
    for r in rows:
        mbs = f"{r.mb / r.seconds:7.1f}" if r.mb is not None and r.seconds > 0 else " " * 7
        print(f"| {r.what:44} | {r.n:>9,} | {r.seconds:8.2f} | {r.per_second:>10,.0f} | {mbs} | {r.note}")


@contextmanager
def bench_api(
    title: str, database_url: str | None, inputs: str, n: int, d: int, smoke: bool, timeout: float = 600
) -> Iterator[BenchContext]:
    """Print ``title``, the machine, the database and ``inputs``; then a scratch database, a key and the api
    serving it, as the :class:`BenchContext` the row functions take."""
    print(title)
    for key, value in machine().items():
        print(f"  {key:22} {value}")
    with scratch_database(database_url) as (url, description):
        print(f"  {'database':22} {description}")
        print(f"  {'inputs':22} {inputs}")
        print()
        key = mint_key(url)
        with api_server(url) as base, httpx.Client(base_url=base, timeout=timeout) as client:
            yield BenchContext(client, {"Authorization": f"Bearer {key}"}, n, d, smoke, description)

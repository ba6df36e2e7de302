"""Bulk upload and reads at database scale: 10^6 x 768 into PostgreSQL through the HTTP api.

Every upload runs against a fresh uvicorn process (``service.main:create_app``, in-process job runner) on
a scratch database of its own, so the api's peak memory is its own: ``VmHWM`` of the server process from
/proc/<pid>/status after the upload (Python, the app and everything the upload allocated). The file is an
.npz (or Parquet) written to disk in chunks and streamed to the api from disk, as a client would.

Rows of the upload table, in one run on the same machine:

- ``this tree`` at ``--baseline-rows`` and at ``--rows``;
- ``@REF`` (``--baseline-ref``, default ``main``): the code of that git ref (``git archive`` into a
  temporary folder that goes first on ``PYTHONPATH`` of its server, migrated by its own code) at
  ``--baseline-rows``: the baseline.

Then, on the ``--rows`` pool (with 1,000 items labeled, spread over the pool), the reads
a client and the dashboard make: ``GET /v1/pools/{pool}`` (item counts) and item pages, each repeated; and,
as the baseline of the counts, the query the counts were before (a GROUP BY over the pool's rows) run
on the same database.

The api's upload limits are raised for the run (10^6 x 768 float32 is 3.07 GB; the defaults are 2 GiB):
``BAIT_MAX_UPLOAD_BYTES`` and ``BAIT_MAX_UPLOAD_INFLATED_BYTES`` = 8 GiB. ``--smoke`` runs a small size (and
small blocks, so every upload has several) for the test suite; without ``--admin-url`` the databases are
SQLite files.

    python bench/upload_scale.py --admin-url postgresql+psycopg://postgres@127.0.0.1:5432/postgres
"""

from __future__ import annotations

import argparse
import io
import os
import secrets
import shutil
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.service_harness import machine, wait_healthy  # noqa: E402

LIMIT_BYTES = 8 * 2**30


def load() -> str:
    return f"{os.getloadavg()[0]:.2f}"


# ------------------------------------------------------------------------------------------ the file


def write_npz(path: Path, n: int, d: int, seed: int = 0, chunk: int = 50_000) -> None:
    """An .npz (stored, like ``numpy.savez``) of ``ids`` (``item-0000000``...) and ``n x d`` float32
    ``embeddings``, written in chunks: the whole matrix is never in this process's memory."""
    rng = np.random.default_rng(seed)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        ids = np.array([f"item-{i:07d}" for i in range(n)])
        with zf.open("ids.npy", "w", force_zip64=True) as fp:
            np.lib.format.write_array(fp, ids, allow_pickle=False)
        with zf.open("embeddings.npy", "w", force_zip64=True) as fp:
            np.lib.format.write_array_header_2_0(fp, {"descr": "<f4", "fortran_order": False, "shape": (n, d)})
            for start in range(0, n, chunk):
                m = min(chunk, n - start)
                fp.write(rng.standard_normal((m, d), dtype=np.float32).tobytes())


def write_parquet(path: Path, n: int, d: int, seed: int = 0, chunk: int = 50_000) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    schema = pa.schema([("id", pa.string()), ("embedding", pa.list_(pa.float32(), d))])
    with pq.ParquetWriter(path, schema, compression="none") as writer:
        for start in range(0, n, chunk):
            m = min(chunk, n - start)
            values = pa.array(rng.standard_normal(m * d, dtype=np.float32))
            writer.write_table(
                pa.table(
                    {
                        "id": [f"item-{i:07d}" for i in range(start, start + m)],
                        "embedding": pa.FixedSizeListArray.from_arrays(values, d),
                    },
                    schema=schema,
                )
            )


# ------------------------------------------------------------------------------------- code and db


def baseline_tree(ref: str) -> str:
    """The code of git ref ``ref``, extracted into a new temporary folder."""
    proc = subprocess.run(["git", "archive", "--format=tar", ref], cwd=REPO, capture_output=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"--baseline-ref {ref!r}: git archive failed: {proc.stderr.decode(errors='replace')}")
    out = tempfile.mkdtemp(prefix="bait-baseline-")
    with tarfile.open(fileobj=io.BytesIO(proc.stdout)) as tar:
        tar.extractall(out, filter="data")
    return out


def code_env(code_dir: str | None) -> dict[str, str]:
    env = dict(os.environ)
    if code_dir is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (code_dir, env.get("PYTHONPATH", "")) if p)
    return env


def run_code(code_dir: str | None, source: str, *args: str) -> str:
    """Run ``source`` in a Python subprocess on the given code (``None``: this tree); its stdout."""
    proc = subprocess.run(
        [sys.executable, "-c", source, *args],
        env=code_env(code_dir),
        cwd=code_dir or REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"subprocess failed: {proc.stderr[-3000:]}")
    return proc.stdout


MIGRATE = "import sys; from service.migrate import upgrade; upgrade(sys.argv[1])"
MINT = (
    "import sys\n"
    "from service.config import Settings\n"
    "from service.db import make_engine, make_sessionmaker, session_scope\n"
    "from service.domain.keys import create_key\n"
    "with session_scope(make_sessionmaker(make_engine(Settings(database_url=sys.argv[1])))) as s:\n"
    "    print(create_key(s, 'bench')[0])\n"
)


@contextmanager
def scratch_database(admin_url: str | None, tmp: Path, code_dir: str | None) -> Iterator[str]:
    """A new database migrated by the given code; dropped after (PostgreSQL) or a file in ``tmp`` (SQLite)."""
    if admin_url is None:
        url = f"sqlite:///{tmp / f'bench-{uuid.uuid4().hex[:6]}.db'}"
        run_code(code_dir, MIGRATE, url)
        yield url
        return
    admin = make_url(admin_url)
    name = f"bait_bulk_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    engine = create_engine(admin, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = admin.set(database=name).render_as_string(hide_password=False)
    try:
        run_code(code_dir, MIGRATE, url)
        yield url
    finally:
        with engine.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        engine.dispose()


@dataclass
class Server:
    base: str
    proc: subprocess.Popen[Any]

    def peak_rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return float("nan")


@contextmanager
def api_server(url: str, code_dir: str | None, block_bytes: int | None) -> Iterator[Server]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = code_env(code_dir)
    env.update(
        {
            "BAIT_DATABASE_URL": url,
            "BAIT_PRINT_BOOTSTRAP_KEY": "false",
            "BAIT_MAX_UPLOAD_BYTES": str(LIMIT_BYTES),
            "BAIT_MAX_UPLOAD_INFLATED_BYTES": str(LIMIT_BYTES),
            "BAIT_RATE_LIMIT": "off",
            "BAIT_RATE_LIMIT_EXPENSIVE": "off",
            "BAIT_LOG_LEVEL": "WARNING",
            "BAIT_SECRET_KEY": os.environ.get("BAIT_SECRET_KEY") or secrets.token_urlsafe(32),
        }
    )
    if block_bytes is not None:
        env["BAIT_BULK_BLOCK_BYTES"] = str(block_bytes)
    env.pop("BAIT_REDIS_URL", None)
    cmd = [sys.executable, "-m", "uvicorn", "service.main:create_app", "--factory", "--port", str(port)]
    proc = subprocess.Popen([*cmd, "--log-level", "warning"], env=env, cwd=code_dir or REPO)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, proc, 120)
        yield Server(base, proc)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


# ------------------------------------------------------------------------------------------- runs


@dataclass
class Upload:
    name: str
    rows: int
    dim: int
    seconds: float
    peak_mb: float
    load: str


def file_chunks(path: Path, chunk: int = 4 * 2**20) -> Iterator[bytes]:
    with path.open("rb") as f:
        while block := f.read(chunk):
            yield block


def make_pool(client: httpx.Client, dim: int) -> str:
    body = {"name": f"p{uuid.uuid4().hex[:6]}", "task": "classification", "classes": ["a", "b", "c"]}
    resp = client.post("/v1/pools", json={**body, "embedding_dim": dim, "head": {"kind": "linear"}})
    resp.raise_for_status()
    return str(resp.json()["id"])


def upload(client: httpx.Client, pool: str, path: Path, fmt: str, n: int) -> float:
    t0 = time.perf_counter()
    resp = client.post(
        f"/v1/pools/{pool}/items:bulk",
        params={"format": fmt},
        content=file_chunks(path),
        headers={"Content-Type": "application/octet-stream"},
    )
    seconds = time.perf_counter() - t0
    if resp.status_code != 200 or resp.json().get("created") != n:
        raise RuntimeError(f"upload failed: {resp.status_code} {resp.text[:500]}")
    return seconds


def timed_get(client: httpx.Client, path: str, repeat: int, **params: Any) -> tuple[list[float], Any]:
    times = []
    body = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        resp = client.get(path, params=params)
        times.append(time.perf_counter() - t0)
        resp.raise_for_status()
        body = resp.json()
    return times, body


OLD_COUNTS = """
SELECT CASE WHEN status = 'reserved' AND reserved_until IS NOT NULL AND reserved_until <= :now
            THEN 'unlabeled' ELSE status END AS eff, count(*)
FROM items WHERE pool_id = :pool GROUP BY eff
"""
OLD_EMBEDDING = "SELECT embedding_status, count(*) FROM items WHERE pool_id = :pool GROUP BY embedding_status"
OLD_VALIDATION = "SELECT status, count(*) FROM items WHERE pool_id = :pool AND split = 'validation' GROUP BY status"


def reads(server: Server, url: str, key: str, pool: str, n: int, repeat: int) -> list[tuple[str, list[float]]]:
    """Label 1,000 items spread over the pool, then time the reads."""
    out: list[tuple[str, list[float]]] = []
    with httpx.Client(base_url=server.base, headers={"Authorization": f"Bearer {key}"}, timeout=None) as client:
        step = max(1, n // 1000)
        labels = [{"item_id": f"item-{i:07d}", "label": "abc"[i % 3]} for i in range(0, n, step)][:1000]
        client.put(f"/v1/pools/{pool}/labels", json={"labels": labels}).raise_for_status()
        times, view = timed_get(client, f"/v1/pools/{pool}", repeat)
        out.append(("GET pool (counts)", times))
        counts = view.get("counts", view)
        expected_labeled = len(labels)
        if (counts.get("labeled"), counts.get("items")) != (expected_labeled, n):
            raise RuntimeError(f"wrong counts: {counts}")
        engine = create_engine(url)
        with engine.connect() as conn:
            times = []
            now = time.strftime("%Y-%m-%d %H:%M:%S+00", time.gmtime())
            for _ in range(max(1, repeat // 4)):
                t0 = time.perf_counter()
                conn.execute(text(OLD_COUNTS), {"pool": pool, "now": now}).all()
                conn.execute(text(OLD_EMBEDDING), {"pool": pool}).all()
                conn.execute(text(OLD_VALIDATION), {"pool": pool}).all()
                times.append(time.perf_counter() - t0)
            out.append(("baseline: the count queries of before (GROUP BY over the rows, SQL only)", times))
            last_ids = conn.execute(
                text("SELECT id FROM items WHERE pool_id = :pool ORDER BY id DESC LIMIT 101"), {"pool": pool}
            ).all()
        engine.dispose()
        times, _ = timed_get(client, f"/v1/pools/{pool}/items", repeat, limit=100)
        out.append(("GET items, first page (100)", times))
        deep = _cursor(int(last_ids[-1][0]))
        times, page = timed_get(client, f"/v1/pools/{pool}/items", repeat, limit=100, cursor=deep)
        if len(page["items"]) != 100:
            raise RuntimeError(f"deep page holds {len(page['items'])} items")
        out.append(("GET items, last page (cursor)", times))
        for status in ("labeled", "unlabeled", "reserved"):
            times, _ = timed_get(client, f"/v1/pools/{pool}/items", repeat, limit=100, status=status)
            out.append((f"GET items ?status={status}, first page", times))
        times, _ = timed_get(client, f"/v1/pools/{pool}/items", repeat, limit=100, embedding_status="pending")
        out.append(("GET items ?embedding_status=pending (none)", times))
    return out


def _cursor(internal_id: int) -> str:
    import base64

    return base64.urlsafe_b64encode(f"i{internal_id}".encode()).decode().rstrip("=")


def run_upload(
    name: str, admin_url: str | None, tmp: Path, code_dir: str | None, path: Path, fmt: str, n: int, d: int, args: Any
) -> tuple[Upload, list[tuple[str, list[float]]] | None]:
    with scratch_database(admin_url, tmp, code_dir) as url:
        key = run_code(None, MINT, url).strip().splitlines()[-1]
        with api_server(url, code_dir, args.block_bytes) as server:
            headers = {"Authorization": f"Bearer {key}"}
            with httpx.Client(base_url=server.base, headers=headers, timeout=None) as client:
                pool = make_pool(client, d)
                seconds = upload(client, pool, path, fmt, n)
            result = Upload(name, n, d, seconds, server.peak_rss_mb(), load())
            print(
                f"  {name}: {n:,} x {d} in {seconds:.1f} s, api peak RSS {result.peak_mb:.0f} MB, load {result.load}",
                flush=True,
            )
            measured = reads(server, url, key, pool, n, args.repeat) if args.reads and code_dir is None else None
    return result, measured


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=768)
    p.add_argument("--baseline-rows", type=int, default=100_000)
    p.add_argument("--baseline-ref", default="main", help="git ref of the baseline code ('' : no baseline)")
    p.add_argument("--format", choices=["npz", "parquet"], default="npz")
    p.add_argument("--admin-url", default=None, help="PostgreSQL URL to create scratch databases next to")
    p.add_argument("--repeat", type=int, default=20, help="times each read is repeated")
    p.add_argument("--block-bytes", type=int, default=None, help="BAIT_BULK_BLOCK_BYTES of this tree's api")
    p.add_argument("--no-reads", dest="reads", action="store_false")
    p.add_argument("--tmp", default=None, help="folder for the generated files (default: the system's)")
    p.add_argument("--smoke", action="store_true", help="3,000 x 16 (baseline 1,000), 64 KiB blocks")
    args = p.parse_args(argv)
    if args.smoke:
        args.rows, args.dim, args.baseline_rows, args.repeat = 3000, 16, 1000, 3
        args.block_bytes = args.block_bytes or 64 * 2**10
    print("bait-service bulk upload at scale (HTTP api in a uvicorn subprocess per upload)")
    for k, v in machine().items():
        print(f"  {k}: {v}")
    backend = "PostgreSQL" if args.admin_url else "SQLite"
    print(f"  database: {backend}; file: {args.format}; api upload limits raised to {LIMIT_BYTES:,} bytes")
    if args.block_bytes:
        print(f"  BAIT_BULK_BLOCK_BYTES={args.block_bytes}")
    tmp = Path(tempfile.mkdtemp(prefix="bait-upload-", dir=args.tmp))
    base_dir = baseline_tree(args.baseline_ref) if args.baseline_ref else None
    writer = write_npz if args.format == "npz" else write_parquet
    uploads: list[Upload] = []
    measured: list[tuple[str, list[float]]] | None = None
    try:
        small = tmp / f"small.{args.format}"
        writer(small, args.baseline_rows, args.dim)
        if base_dir is not None:
            u, _ = run_upload(
                f"@{args.baseline_ref}", args.admin_url, tmp, base_dir, small, args.format, args.baseline_rows,
                args.dim, args,
            )  # fmt: skip
            uploads.append(u)
        u, _ = run_upload(
            "this tree", args.admin_url, tmp, None, small, args.format, args.baseline_rows, args.dim, args
        )
        uploads.append(u)
        small.unlink()
        big = tmp / f"big.{args.format}"
        t0 = time.perf_counter()
        writer(big, args.rows, args.dim)
        print(f"  wrote {big.stat().st_size:,} bytes in {time.perf_counter() - t0:.1f} s", flush=True)
        u, measured = run_upload("this tree", args.admin_url, tmp, None, big, args.format, args.rows, args.dim, args)
        uploads.append(u)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if base_dir is not None:
            shutil.rmtree(base_dir, ignore_errors=True)
    print()
    print("| upload | rows | dim | seconds | rows/s | api peak RSS (MB) | load |")
    print("|---|---|---|---|---|---|---|")
    for u in uploads:
        print(
            f"| {u.name} | {u.rows:,} | {u.dim} | {u.seconds:.1f} | {u.rows / u.seconds:,.0f} | {u.peak_mb:.0f} "
            f"| {u.load} |"
        )
    if measured:
        print()
        print(f"Reads on the {args.rows:,}-item pool (1,000 labeled), {args.repeat} times each:")
        print()
        print("| read | median ms | max ms |")
        print("|---|---|---|")
        for name, times in measured:
            print(f"| {name} | {1000 * statistics.median(times):.1f} | {1000 * max(times):.1f} |")
    print(f"\nload avg at the end: {load()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

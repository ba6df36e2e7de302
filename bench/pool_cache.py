"""Warm workers: batch jobs on a big pool with the worker's pool cache (worker/pool_cache.py) cold, warm and
after small changes, against the code path before it (every batch reads the whole pool) in the same run.

Each batch is a real job (``worker.batch_job.run_batch`` on a queued batch row: heartbeat, load, select, reserve,
store) run in a fresh worker process, so its peak RSS is its own (the modules a job imports on its first run
are imported before the clock starts, as in a worker that has run jobs before); the cache folder and the OS
page cache persist between them, as they do for a worker that keeps running. Rows:

- ``before``: the code path before the cache: the whole pool read from the database (ids, external ids and
  every embedding) and handed to the strategy, for every batch (the baseline);
- ``uncached``: the cache off (``BAIT_WORKER_CACHE_DIR=``): random reads ids only, margin the whole pool;
- ``cold``: an empty cache: random reads ids only (and fills nothing); margin fills the cache;
- ``warm``: the pool unchanged since the cache was filled: nothing of the pool is read from the database;
- ``+1,000 rows`` / ``10 updated`` / ``10 moved out``: after a small change, the refresh reads the changed
  rows only: new rows are appended in place; updated embeddings make a patched copy of the entry (a
  kernel-side file copy); rows leaving the pool (deleted, moved to the validation split) a merged entry.

Setup inserts the items straight into the database (binary COPY on PostgreSQL, executemany on SQLite),
not through the upload API (bulk upload is measured by bench/service_throughput.py).

    python bench/pool_cache.py                   # SQLite file, 1,000,000 x 768, k = 10, B = 100
    python bench/pool_cache.py --database-url postgresql+psycopg://postgres@127.0.0.1:5432/postgres
    python bench/pool_cache.py --smoke           # 3,000 x 16, seconds
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sqlalchemy import bindparam, insert, text  # noqa: E402

from bench.service_harness import machine, scratch_database  # noqa: E402
from service.config import Settings  # noqa: E402
from service.db import make_engine, make_sessionmaker, session_scope  # noqa: E402
from service.store.models import Batch, Item, Pool, Tenant  # noqa: E402

CHUNK = 20_000


# ------------------------------------------------------------------------------------------- setup


def build_pool(url: str, n: int, d: int, k: int, seed: int = 0) -> str:
    """A classification pool of ``n`` float32 items of width ``d`` (2 labeled per class); its id."""
    engine = make_engine(Settings(database_url=url))
    factory = make_sessionmaker(engine)
    now = datetime.now(UTC)
    classes = [f"c{i}" for i in range(k)]
    with session_scope(factory) as s:
        tenant = Tenant(name="bench", created_at=now)
        s.add(tenant)
        s.flush()
        head = {"kind": "linear", "max_epochs": 50}
        pool = Pool(tenant_id=tenant.id, name="big", task="classification", classes=classes, n_outputs=k,
                    embedding_dim=d, head=head, created_at=now, updated_at=now)  # fmt: skip
        s.add(pool)
        s.flush()
        pool_id = pool.id
    rng = np.random.default_rng(seed)
    centres = rng.normal(0, 3, size=(k, d)).astype(np.float32)
    postgres = engine.dialect.name == "postgresql"
    for begin in range(0, n, CHUNK):
        m = min(CHUNK, n - begin)
        y = rng.integers(0, k, size=m)
        X = (centres[y] + rng.normal(0, 1, size=(m, d))).astype("<f4")
        ext = [f"item-{begin + i:08d}" for i in range(m)]
        with engine.begin() as conn:
            if postgres:
                raw: Any = conn.connection.driver_connection
                with (
                    raw.cursor() as cur,
                    cur.copy(
                        "COPY items (pool_id, external_id, embedding, status, embedding_status, split, created_at, "
                        "updated_at) FROM STDIN (FORMAT BINARY)"
                    ) as copy,
                ):
                    copy.set_types(["text", "text", "bytea", "text", "text", "text", "timestamptz", "timestamptz"])
                    for i in range(m):
                        copy.write_row((pool_id, ext[i], X[i].tobytes(), "unlabeled", "ready", "train", now, now))
            else:
                conn.execute(
                    insert(Item),
                    [{"pool_id": pool_id, "external_id": ext[i], "embedding": X[i].tobytes(), "status": "unlabeled",
                      "created_at": now, "updated_at": now} for i in range(m)],
                )  # fmt: skip
    with engine.begin() as conn:  # two labeled items per class: the first ones whose blob is that class
        for c in range(k):
            conn.execute(
                text(
                    "UPDATE items SET status = 'labeled', label = :label WHERE pool_id = :p AND external_id IN :ids"
                ).bindparams(bindparam("ids", expanding=True)),
                {"label": json.dumps(classes[c]), "p": pool_id, "ids": [f"item-{2 * c:08d}", f"item-{2 * c + 1:08d}"]},
            )
    engine.dispose()
    return pool_id


def change_pool(url: str, pool_id: str, d: int, added: int, updated: int, tag: str, moved: int = 0) -> float:
    """Insert ``added`` items, rewrite the embeddings of ``updated`` existing ones and move ``moved`` to the
    validation split (out of the selectable rows); seconds."""
    engine = make_engine(Settings(database_url=url))
    now = datetime.now(UTC)
    rng = np.random.default_rng(len(tag))
    t = time.perf_counter()
    with engine.begin() as conn:
        if added:
            X = rng.normal(size=(added, d)).astype("<f4")
            conn.execute(
                insert(Item),
                [{"pool_id": pool_id, "external_id": f"{tag}-{i}", "embedding": X[i].tobytes(), "status": "unlabeled",
                  "created_at": now, "updated_at": now} for i in range(added)],
            )  # fmt: skip
        for i in range(updated):
            conn.execute(
                text("UPDATE items SET embedding = :e WHERE pool_id = :p AND external_id = :x"),
                {"e": rng.normal(size=d).astype("<f4").tobytes(), "p": pool_id, "x": f"item-{1000 + 7 * i:08d}"},
            )
        for i in range(moved):
            conn.execute(
                text("UPDATE items SET split = 'validation' WHERE pool_id = :p AND external_id = :x"),
                {"p": pool_id, "x": f"item-{2000 + 11 * i:08d}"},
            )
    engine.dispose()
    return time.perf_counter() - t


# ------------------------------------------------------------------------------------------- one batch


def phase(args: argparse.Namespace) -> None:
    """Child process: run one batch job and print its figures as JSON on the last line."""
    from worker import batch as batch_steps
    from worker import batch_job, context  # imported here: the child measures its own memory from here on
    from worker.pool_data import load_pool

    settings = Settings(
        database_url=args.url,
        device="cpu",
        secret_key="bench-secret-key-0123456789",
        worker_cache_dir=args.cache_dir if args.mode != "off" else "",
        worker_cache_max_gb=args.cache_gb,
        log_level="WARNING",
    )
    if args.mode == "before":  # the code before the cache: the whole pool, and its embeddings to the strategy
        batch_steps.load_pool = lambda *a, **kw: load_pool(*a, **{**kw, "cache": None, "embeddings": True})
        batch_steps.selection_inputs = lambda data, _needs: data.X  # type: ignore[assignment]
    env = context.configure(settings)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if args.mode == "fill":  # no batch: what a strategy that reads embeddings waits for on an empty cache
        from worker import pool_cache

        with session_scope(env.sessionmaker) as s:
            pool = s.get(Pool, args.pool)
            assert pool is not None
            t = time.perf_counter()
            data = load_pool(s, pool, datetime.now(UTC), cache=pool_cache.for_settings(settings))
            seconds = time.perf_counter() - t
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps({"seconds": seconds, "load": seconds, "how": data.cache["how"],
                          "rows_read": data.cache["rows_read"], "rss_start": rss0, "rss_peak": peak}))  # fmt: skip
        return
    now = datetime.now(UTC)
    with session_scope(env.sessionmaker) as s:
        batch = Batch(pool_id=args.pool, size=args.size, strategy=args.strategy, params={"seed": args.seed},
                      status="queued", created_at=now)  # fmt: skip
        s.add(batch)
        s.flush()
        batch_id = batch.id
    t = time.perf_counter()
    batch_job.run_batch(batch_id)
    seconds = time.perf_counter() - t
    with session_scope(env.sessionmaker) as s:
        row = s.get(Batch, batch_id)
        assert row is not None
        if row.status != "succeeded":
            raise SystemExit(f"batch {row.status}: {row.error}")
        diag = dict(row.diagnostics or {})
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    cache = diag.get("pool_cache") or {}
    print(json.dumps({"seconds": seconds, "load": diag["timings"]["load"], "how": cache.get("how", "before"),
                      "rows_read": cache.get("rows_read"), "rss_start": rss0, "rss_peak": peak}))  # fmt: skip


def run_phase(
    url: str, pool_id: str, cache_dir: Path, mode: str, strategy: str, size: int, seed: int, gb: float
) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--phase", "--url", url, "--pool", pool_id, "--cache-dir", str(cache_dir),
           "--mode", mode, "--strategy", strategy, "--size", str(size), "--seed", str(seed),
           "--cache-gb", str(gb)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} {strategy} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


# ------------------------------------------------------------------------------------------- main


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--d", type=int, default=768)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--size", type=int, default=100, help="batch size B")
    p.add_argument(
        "--strategies",
        default="random",
        help="comma-separated; e.g. random,margin (margin reads the embeddings: at 10^6 x 768 its head's features "
        "alone take 3 GiB more)",
    )
    p.add_argument("--database-url", default=None, help="PostgreSQL server (a scratch database is made and dropped)")
    p.add_argument("--cache-gb", type=float, default=20.0)
    p.add_argument("--smoke", action="store_true", help="3,000 x 16: seconds")
    # child process
    p.add_argument("--phase", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    p.add_argument("--pool", help=argparse.SUPPRESS)
    p.add_argument("--cache-dir", help=argparse.SUPPRESS)
    p.add_argument("--mode", help=argparse.SUPPRESS)
    p.add_argument("--strategy", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.phase:
        phase(args)
        return
    if args.smoke:
        args.n, args.d = 3000, 16
    strategies = [s for s in args.strategies.split(",") if s]

    print("# pool cache: batch jobs on an n x d pool, cache cold / warm / after small changes, vs. reading it all")
    for key, value in machine().items():
        print(f"{key}: {value}")
    with scratch_database(args.database_url) as (url, where), tempfile.TemporaryDirectory(prefix="bait-cache-") as tmp:
        print(f"database: {where}")
        print(f"pool: n = {args.n:,}, d = {args.d}, k = {args.k}, B = {args.size}; float32 embeddings "
              f"{args.n * args.d * 4 / 2**30:.2f} GiB; each batch a fresh worker process")  # fmt: skip
        t = time.perf_counter()
        pool_id = build_pool(url, args.n, args.d, args.k)
        print(f"setup (direct inserts, not the API): {time.perf_counter() - t:.1f} s\n")
        cache_dir = Path(tmp) / "cache"
        rows: list[tuple[str, dict[str, Any]]] = []
        seed = [0]

        def run(label: str, mode: str, strategy: str) -> None:
            seed[0] += 1
            result = run_phase(url, pool_id, cache_dir, mode, strategy, args.size, seed[0], args.cache_gb)
            rows.append((f"{strategy} {label}", result))
            print(f"  {strategy} {label}: {result['seconds']:.2f} s (load {result['load']:.2f} s, {result['how']})",
                  flush=True)  # fmt: skip

        for strategy in strategies:
            run("before (whole pool read per batch)", "before", strategy)
            run("uncached (cache off)", "off", strategy)
        shutil.rmtree(cache_dir, ignore_errors=True)
        for strategy in strategies:
            run("cold (empty cache)", "on", strategy)
        shutil.rmtree(cache_dir, ignore_errors=True)
        run("fill (empty cache, no batch)", "fill", "load")
        run("fill again (pool unchanged, no batch)", "fill", "load")
        for strategy in strategies:
            run("warm (pool unchanged)", "on", strategy)
        changes: list[str] = []
        seconds = change_pool(url, pool_id, args.d, added=1000, updated=0, tag="added")
        changes.append(f"+1,000 rows inserted ({seconds:.2f} s)")
        for strategy in strategies:
            run("warm after +1,000 rows", "on", strategy)
        seconds = change_pool(url, pool_id, args.d, added=0, updated=10, tag="updated")
        changes.append(f"10 embeddings rewritten ({seconds:.2f} s)")
        for strategy in strategies:
            run("warm after 10 updated", "on", strategy)
        seconds = change_pool(url, pool_id, args.d, added=0, updated=0, tag="moved", moved=10)
        changes.append(f"10 rows moved to the validation split ({seconds:.2f} s)")
        for strategy in strategies:
            run("warm after 10 moved out", "on", strategy)
        size = sum(f.stat().st_size for f in cache_dir.rglob("*") if f.is_file())

    print()
    print("| batch | seconds (POST-free job run) | load stage s | pool cache | rows read from the DB | peak RSS MiB "
          "| RSS before the job MiB |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for label, r in rows:
        rows_read = "all" if r["rows_read"] is None else f"{r['rows_read']:,}"
        print(f"| {label} | {r['seconds']:.2f} | {r['load']:.2f} | {r['how']} | {rows_read} | {r['rss_peak']:.0f} "
              f"| {r['rss_start']:.0f} |")  # fmt: skip
    print()
    print(f"changes: {'; '.join(changes)}; cache folder at the end: {size / 2**30:.2f} GiB")
    print(f"load avg at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()

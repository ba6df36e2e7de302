"""Batch latency over real HTTP: ``POST /v1/pools/{pool}/batches`` until ``succeeded``, split into the
job's stages (load, train, embed, select, store) as the batch's diagnostics report them.

- ``random`` is the service overhead (queue, load, head, store) around a selection that costs nothing;
  it is the baseline of the ``bait`` row, measured in the same run on the same pool.
- A ``random`` batch on the ``bulk-parquet`` pool of :mod:`bench.service_throughput` (n x 768, nothing
  labeled) measures loading n x 768 embeddings from the database.

Used by ``bench/service_throughput.py`` (its ``batch_rows``), or alone:

    python bench/batch_latency.py                 # SQLite file, 100,000 items, d=128, k=10, B=100
    python bench/batch_latency.py --database-url postgresql+psycopg://postgres@127.0.0.1:5432/postgres
    python bench/batch_latency.py --smoke         # 2,000 items, seconds
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.service_harness import (  # noqa: E402
    BenchContext,
    Row,
    bench_api,
    create_pool,
    npz_body,
    print_table,
    timed_upload,
)

STAGES = ("load", "train", "embed", "select", "store")


def run_batch(ctx: BenchContext, pool: str, strategy: str, size: int) -> tuple[float, dict[str, Any]]:
    """Seconds from POST to ``succeeded`` (polling every 20 ms) and the finished batch."""
    t0 = time.perf_counter()
    resp = ctx.client.post(f"/v1/pools/{pool}/batches", json={"size": size, "strategy": strategy}, headers=ctx.auth)
    if resp.status_code != 202:
        raise RuntimeError(f"POST batches: {resp.status_code} {resp.text[:500]}")
    url = resp.headers["Location"]
    while True:
        batch: dict[str, Any] = ctx.client.get(url, headers=ctx.auth).json()
        if batch["status"] in ("succeeded", "failed", "cancelled"):
            break
        time.sleep(0.02)
    seconds = time.perf_counter() - t0
    if batch["status"] != "succeeded":
        raise RuntimeError(f"batch {strategy} {batch['status']}: {batch['error']}")
    # give the items back, so the next batch sees the same pool
    ctx.client.post(f"{url}/cancel", headers=ctx.auth).raise_for_status()
    return seconds, batch


def stage_rows(label: str, n: int, seconds: float, batch: dict[str, Any]) -> list[Row]:
    t = batch["diagnostics"]["timings"]
    sel = batch["diagnostics"].get("selection", {})
    note = f"device {sel.get('device')}, d_pen={sel.get('d')}, k={sel.get('k')}"
    rows = [Row(f"{label}: POST -> succeeded", n, seconds, note=note)]
    rows += [Row(f"  {label}: {stage}", n, float(t.get(stage, 0.0))) for stage in STAGES]
    rows.append(Row(f"  {label}: queue + polling + http", n, seconds - float(t.get("total", 0.0))))
    return rows


def labeled_pool(
    ctx: BenchContext,
    n: int,
    d: int,
    k: int,
    n_labeled: int,
    name: str | None = None,
    head: dict[str, Any] | None = None,
) -> str:
    """A pool of n x d Gaussian embeddings, classes from a planted linear rule, n_labeled labeled."""
    rng = np.random.default_rng(1)
    emb = rng.standard_normal((n, d), dtype=np.float32)
    y = (emb @ rng.standard_normal((d, k)).astype(np.float32)).argmax(axis=1)
    ids = [f"b-{i:07d}" for i in range(n)]
    saved_d, ctx.d = ctx.d, d
    try:
        pool = create_pool(ctx, name or f"batches-{d}", head)
    finally:
        ctx.d = saved_d
    timed_upload(ctx, pool, npz_body(ids, emb))
    if n_labeled:
        labels = [{"item_id": ids[i], "label": f"c{int(y[i])}"} for i in range(n_labeled)]
        resp = ctx.client.put(f"/v1/pools/{pool}/labels", json={"labels": labels}, headers=ctx.auth)
        if resp.status_code != 200:
            raise RuntimeError(f"PUT labels: {resp.status_code} {resp.text[:500]}")
    return pool


def warm_up(ctx: BenchContext) -> None:
    """One small batch first: the job runner imports the numerics on its first job (not measured)."""
    pool = labeled_pool(ctx, 200, 8, 2, 20, name="warm-up")
    run_batch(ctx, pool, "random", 5)


def batch_rows(
    ctx: BenchContext,
    *,
    d: int = 128,
    k: int = 10,
    size: int = 100,
    n_labeled: int = 1000,
    load_d: int | None = None,
    bait_n: int | None = None,
) -> list[Row]:
    """Rows: random on an n x 768 unlabeled pool (loading: the ``bulk-parquet`` pool of
    service_throughput, or one uploaded here with ``load_d``), then random and bait on n x d, k classes
    (bait on the first ``bait_n`` items when given)."""
    warm_up(ctx)
    rows: list[Row] = []
    load_pool = ctx.pools.get("bulk-parquet")
    if load_pool is None and load_d is not None:
        load_pool = labeled_pool(ctx, ctx.n, load_d, k, 0, name=f"load-{load_d}")
    if load_pool is not None:
        seconds, batch = run_batch(ctx, load_pool, "random", size)
        rows += stage_rows(f"random B={size}, d={load_d or ctx.d}, 0 labels", ctx.n, seconds, batch)
    n_labeled = min(n_labeled, ctx.n // 10)
    pool = labeled_pool(ctx, ctx.n, d, k, n_labeled)
    seconds, batch = run_batch(ctx, pool, "random", size)
    rows += stage_rows(f"random B={size}, d={d}, k={k}, {n_labeled} labels", ctx.n, seconds, batch)
    n_bait = ctx.n if bait_n is None else min(bait_n, ctx.n)
    if n_bait != ctx.n:
        n_labeled = min(n_labeled, n_bait // 10)
        pool = labeled_pool(ctx, n_bait, d, k, n_labeled, name=f"bait-{n_bait}")
    seconds, batch = run_batch(ctx, pool, "bait", size)
    rows += stage_rows(f"bait B={size}, d={d}, k={k}, {n_labeled} labels", n_bait, seconds, batch)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--database-url", default=None, help="PostgreSQL server to create a scratch database on")
    p.add_argument("--n", type=int, default=100_000)
    p.add_argument("--d", type=int, default=128)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--load-d", type=int, default=768, help="dimension of the unlabeled pool that times loading")
    p.add_argument("--bait-n", type=int, default=None, help="items of the bait pool (default: --n)")
    p.add_argument("--smoke", action="store_true", help="2,000 items: checks the script runs")
    args = p.parse_args(argv)
    n = 2_000 if args.smoke else args.n
    title = "bait-service batch latency (HTTP api in a uvicorn subprocess, in-process job runner)"
    inputs = f"n={n:,} items, d={args.d}, k={args.k}, B={args.size}; loading at d={args.load_d}"
    with bench_api(title, args.database_url, inputs, n, args.d, args.smoke) as ctx:
        rows = batch_rows(ctx, d=args.d, k=args.k, size=args.size, load_d=args.load_d, bait_n=args.bait_n)
    print_table(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

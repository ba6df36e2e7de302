"""Service throughput over real HTTP: bulk item upload and label writes (and, later, batch latency).

Starts the api with uvicorn in a subprocess on a scratch database, then measures through the public API:

- bulk upload of n x d float32 embeddings as one .npz (create, then the same file again: the update
  path) and as one Parquet file into a second pool;
- the baseline measured in the same run: the JSON upsert (`POST /items`, 1,000 items a request) on a
  slice of the same data;
- label writes (`PUT /labels`, 10,000 labels a request) over every item of the pool.

Usage:
    python bench/service_throughput.py                      # SQLite file in a temp dir, 100,000 x 768
    python bench/service_throughput.py --database-url postgresql+psycopg://postgres@127.0.0.1:5432/postgres
    python bench/service_throughput.py --smoke              # 2,000 x 64, seconds

With ``--database-url`` a scratch database is created on that PostgreSQL server and dropped afterwards.
Batch latency rows (POST /batches to succeeded, bait vs random) come from :mod:`bench.batch_latency`.
The harness (scratch database, api subprocess, table) is :mod:`bench.service_harness`.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.batch_latency import batch_rows as latency_rows  # noqa: E402
from bench.service_harness import (  # noqa: E402
    BenchContext,
    Row,
    bench_api,
    create_pool,
    make_data,
    npz_body,
    parquet_body,
    print_table,
    timed_post,
    timed_upload,
)

# ---------------------------------------------------------------------------------------------- rows


def upload_rows(ctx: BenchContext) -> list[Row]:
    ids, emb = make_data(ctx.n, ctx.d)
    mb = emb.nbytes / 1e6
    rows: list[Row] = []

    body = npz_body(ids, emb)
    pool = create_pool(ctx, "bulk-npz")
    seconds, out = timed_upload(ctx, pool, body)
    assert out == {"created": ctx.n, "updated": 0}, out
    rows.append(Row("bulk upload .npz (create)", ctx.n, seconds, mb, f"body {len(body) / 1e6:.0f} MB"))
    seconds, out = timed_upload(ctx, pool, body)
    assert out == {"created": 0, "updated": ctx.n}, out
    rows.append(Row("bulk upload .npz again (identical: no-op)", ctx.n, seconds, mb))
    emb2 = emb + np.float32(1.0)
    body = npz_body(ids, emb2)
    del emb2
    seconds, out = timed_upload(ctx, pool, body)
    assert out == {"created": 0, "updated": ctx.n}, out
    rows.append(Row("bulk upload .npz (new embeddings: update)", ctx.n, seconds, mb))
    del body

    body = parquet_body(ids, emb)
    pool2 = create_pool(ctx, "bulk-parquet")
    seconds, out = timed_upload(ctx, pool2, body)
    assert out == {"created": ctx.n, "updated": 0}, out
    rows.append(Row("bulk upload Parquet (create)", ctx.n, seconds, mb, f"body {len(body) / 1e6:.0f} MB"))
    del body

    # Baseline in the same run: the JSON path, 1,000 items a request, on a slice of the same data.
    n_json = min(ctx.n, 2_000 if ctx.smoke else 10_000)
    pool3 = create_pool(ctx, "json")
    total = 0.0
    for start in range(0, n_json, 1_000):
        items = [{"id": ids[i], "embedding": emb[i].tolist()} for i in range(start, min(start + 1_000, n_json))]
        seconds, _ = timed_post(ctx, f"/v1/pools/{pool3}/items", json={"items": items})
        total += seconds
    rows.append(Row("baseline: JSON upsert, 1,000 items/request", n_json, total, emb[:n_json].nbytes / 1e6))
    return rows


def label_rows(ctx: BenchContext) -> list[Row]:
    pool = ctx.pools["bulk-npz"]
    per_request = 10_000
    ids, _ = make_data(ctx.n, 1)
    total = 0.0
    for start in range(0, ctx.n, per_request):
        labels = [{"item_id": ids[i], "label": f"c{i % 10}"} for i in range(start, min(start + per_request, ctx.n))]
        t0 = time.perf_counter()
        resp = ctx.client.put(
            f"/v1/pools/{pool}/labels", json={"labels": labels, "annotator": "bench"}, headers=ctx.auth
        )
        total += time.perf_counter() - t0
        resp.raise_for_status()
    counts = ctx.client.get(f"/v1/pools/{pool}", headers=ctx.auth).json()["counts"]
    assert counts["labeled"] == ctx.n, counts
    return [Row(f"label writes, {per_request:,} labels/request", ctx.n, total)]


def batch_rows(ctx: BenchContext) -> list[Row]:
    """Batch latency (POST /v1/pools/{pool}/batches until `succeeded`, split by stage; random = the
    service overhead, bait): see bench/batch_latency.py."""
    return latency_rows(ctx)


ROW_FUNCTIONS: list[Callable[[BenchContext], list[Row]]] = [upload_rows, label_rows, batch_rows]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--database-url", default=None, help="PostgreSQL server to create a scratch database on")
    p.add_argument("--n", type=int, default=100_000, help="items")
    p.add_argument("--d", type=int, default=768, help="embedding dimension")
    p.add_argument("--smoke", action="store_true", help="tiny sizes (2,000 x 64): checks the script runs")
    args = p.parse_args(argv)
    n, d = (2_000, 64) if args.smoke else (args.n, args.d)

    title = "bait-service throughput (HTTP api in a uvicorn subprocess)"
    inputs = f"n={n:,} items x d={d} float32 ({n * d * 4 / 1e6:.0f} MB of embeddings)"
    rows: list[Row] = []
    with bench_api(title, args.database_url, inputs, n, d, args.smoke) as ctx:
        for fn in ROW_FUNCTIONS:
            rows += fn(ctx)
    print_table(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

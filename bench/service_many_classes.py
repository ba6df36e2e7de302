"""Many classes inside the service: ``POST /v1/pools/{pool}/batches`` (bait) until ``succeeded`` on a 26-class pool.

The issue's row: k = 26 classes, d = 128, n = 5,000 items, B = 20, target < 5 s from POST to succeeded on
the 2-core CPU. The api runs in a uvicorn subprocess on 127.0.0.1 with its in-process job runner (as in
:mod:`bench.batch_latency`); the pool is uploaded over HTTP, ``--labeled`` items are labeled (every class
present), and each batch is cancelled after it is timed, so every row sees the same pool. Rows, on the
same pool in the same run:

- ``random``: the baseline, the service's own cost (queue, load, store) around a selection that costs nothing;
- ``bait`` with no parameters: what a user gets (the cost model's default plan, exact where it fits);
- ``bait`` with ``approx="topc"`` (top-c classes per candidate, named in the diagnostics).

For each it prints the wall time, the job's stages (``diagnostics.timings``), the selection's setup /
forward / backward split and the plan (``diagnostics.selection.approximation``), and the load average.

    python bench/service_many_classes.py            # SQLite file, the issue's sizes
    python bench/service_many_classes.py --database-url postgresql+psycopg://postgres@127.0.0.1:5432/postgres
    python bench/service_many_classes.py --smoke    # 600 items, k = 6, d = 16: checks the script runs
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.batch_latency import warm_up  # noqa: E402
from bench.service_harness import BenchContext, bench_api, npz_body, timed_upload  # noqa: E402

STAGES = ("load", "train", "embed", "validate", "select", "store", "total")


def post_batch(ctx: BenchContext, pool: str, strategy: str, size: int, params: dict[str, Any]) -> tuple[float, dict]:
    """Seconds from POST to ``succeeded`` and the finished batch; the batch is then cancelled.

    Polls every 20 ms at first, backing off to 250 ms: a steady 20 ms poll of a many-second batch ran into
    the key's rate limit (600 requests a minute), and each 429's Retry-After then inflated the figure."""
    t0 = time.perf_counter()
    body = {"size": size, "strategy": strategy, "params": {"seed": 0, **params}}
    resp = ctx.client.post(f"/v1/pools/{pool}/batches", json=body, headers=ctx.auth)
    if resp.status_code != 202:
        raise RuntimeError(f"POST batches: {resp.status_code} {resp.text[:500]}")
    url = resp.headers["Location"]
    wait = 0.02
    while True:
        got = ctx.client.get(url, headers=ctx.auth)
        if got.status_code == 429:  # the key's rate limit: wait as told, the batch keeps running
            time.sleep(float(got.headers.get("Retry-After", "0.5")))
            continue
        if got.status_code != 200:
            raise RuntimeError(f"GET {url}: {got.status_code} {got.text[:500]}")
        batch: dict[str, Any] = got.json()
        if batch["status"] in ("succeeded", "failed", "cancelled"):
            break
        time.sleep(wait)
        wait = min(0.25, wait * 1.25)
    seconds = time.perf_counter() - t0
    if batch["status"] != "succeeded":
        raise RuntimeError(f"batch {strategy} {batch['status']}: {batch['error']}")
    ctx.client.post(f"{url}/cancel", headers=ctx.auth).raise_for_status()
    return seconds, batch


def class_pool(ctx: BenchContext, n: int, d: int, k: int, n_labeled: int) -> str:
    """A k-class pool of n x d Gaussian embeddings, classes from a planted linear rule; ``n_labeled`` items
    labeled, the same number from every class (as far as the class has items)."""
    rng = np.random.default_rng(1)
    emb = rng.standard_normal((n, d), dtype=np.float32)
    y = (emb @ rng.standard_normal((d, k)).astype(np.float32)).argmax(axis=1)
    classes = [f"c{i}" for i in range(k)]
    body = {"name": f"classes-{k}", "task": "classification", "classes": classes, "embedding_dim": d}
    resp = ctx.client.post("/v1/pools", json=body, headers=ctx.auth)
    resp.raise_for_status()
    pool: str = resp.json()["id"]
    ids = [f"m-{i:07d}" for i in range(n)]
    timed_upload(ctx, pool, npz_body(ids, emb))
    per_class = max(1, n_labeled // k)
    chosen = np.sort(np.concatenate([np.flatnonzero(y == c)[:per_class] for c in range(k)]))
    labels = [{"item_id": ids[i], "label": f"c{int(y[i])}"} for i in chosen]
    resp = ctx.client.put(f"/v1/pools/{pool}/labels", json={"labels": labels}, headers=ctx.auth)
    if resp.status_code != 200:
        raise RuntimeError(f"PUT labels: {resp.status_code} {resp.text[:500]}")
    return pool


def describe_plan(sel: dict[str, Any]) -> str:
    plan = sel.get("approximation")
    if not plan:
        return "-"
    parts = [str(plan["kind"])]
    for key in ("pca_dim", "classes"):
        if key in plan:
            parts.append(f"{key}={plan[key]}")
    if "prefilter" in plan:
        parts.append("prefilter")
    parts.append(f"est {plan['estimated_seconds']:.3g} s")
    if "matrix_dtype" in sel:
        parts.append(f"D={sel.get('D')} {sel['matrix_dtype']}")
    return ", ".join(parts)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--database-url", default=None, help="PostgreSQL server to create a scratch database on")
    p.add_argument("--n", type=int, default=5_000)
    p.add_argument("--d", type=int, default=128)
    p.add_argument("--k", type=int, default=26)
    p.add_argument("--size", type=int, default=20)
    p.add_argument("--labeled", type=int, default=260, help="labeled items (the first ones; every class present)")
    p.add_argument("--smoke", action="store_true", help="600 items, d = 16, k = 6, B = 5: checks the script runs")
    args = p.parse_args(argv)
    n, d, k, size, n_labeled = args.n, args.d, args.k, args.size, args.labeled
    if args.smoke:
        n, d, k, size, n_labeled = 600, 16, 6, 5, 60
    title = "bait-service, many classes: POST a bait batch -> succeeded (uvicorn subprocess, in-process job runner)"
    variants: list[tuple[str, str, dict[str, Any]]] = [
        ("random (baseline)", "random", {}),
        ("bait, default plan", "bait", {}),
        ("bait, approx=topc", "bait", {"approx": "topc"}),
    ]
    results = []
    inputs = f"n={n:,} items, d={d}, k={k}, B={size}, {n_labeled} labeled"
    with bench_api(title, args.database_url, inputs, n, d, args.smoke, timeout=1800) as ctx:
        warm_up(ctx)
        pool = class_pool(ctx, n, d, k, n_labeled)
        for label, strategy, params in variants:
            before = os.getloadavg()[0]
            seconds, batch = post_batch(ctx, pool, strategy, size, params)
            results.append((label, seconds, batch, before, os.getloadavg()[0]))
    print("| variant | POST -> succeeded s | " + " | ".join(STAGES) + " | BAIT setup / fwd / bwd s | plan | load 1m |")
    print("|---|---|" + "---|" * len(STAGES) + "---|---|---|")
    for label, seconds, batch, before, after in results:
        diag = batch["diagnostics"]
        t = diag["timings"]
        sel = diag.get("selection") or {}
        st = sel.get("timings", {})
        dims = f"k={sel.get('k')}, d_pen={sel.get('d')}"
        split = "-" if "setup" not in st else f"{st['setup']:.2f} / {st['forward']:.2f} / {st['backward']:.2f}"
        print(
            f"| {label} | {seconds:.2f} | "
            + " | ".join(f"{float(t.get(s, 0.0)):.2f}" for s in STAGES)
            + f" | {split} | {describe_plan(sel)}, {dims} | {before:.1f}/{after:.1f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

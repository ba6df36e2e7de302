"""How fast the dashboard answers for a large pool: a 100,000-item pool with 50 checkpoints (each with
its validation metrics and a stored 20,000-point map), 50 succeeded batches of 100 items, 5,000 labels
and 2,000 validation items, served by uvicorn over real HTTP.

Rows: each page and JSON route the pool page needs (median and worst of ``--repeat`` requests after a
warm-up, signed in with a session cookie), and, as the baseline measured in the same run, the pools list
page (one small pool query) and ``/healthz``. The target: the pool page under 1 s.

The pool is written straight into the database (the same repository functions the API and the worker
use) rather than by training 50 heads, which would measure training, not the dashboard.

    python bench/dashboard_speed.py                 # SQLite file, 100,000 items, 50 checkpoints
    python bench/dashboard_speed.py --database-url postgresql+psycopg://postgres@127.0.0.1:5432/postgres
    python bench/dashboard_speed.py --smoke         # 5,000 items, 5 checkpoints: seconds
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.service_harness import api_server, machine, mint_key, scratch_database  # noqa: E402
from service.config import Settings  # noqa: E402
from service.db import make_engine, make_sessionmaker, session_scope  # noqa: E402
from service.store import items as items_repo  # noqa: E402
from service.store import quality as quality_repo  # noqa: E402
from service.store.models import ApiKey, Batch, Checkpoint, Pool  # noqa: E402

CLASSES = [f"class-{c}" for c in range(10)]


def build_pool(url: str, n: int, d: int, n_checkpoints: int, n_labeled: int, n_val: int, map_points: int) -> str:
    """Write the pool, its items, labels, batches, checkpoints and maps; returns the pool id."""
    engine = make_engine(Settings(database_url=url))
    factory = make_sessionmaker(engine)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, d), dtype=np.float32)
    y = rng.integers(0, len(CLASSES), size=n)
    ids = [f"item-{i:06d}" for i in range(n)]
    t0 = datetime.now(UTC) - timedelta(hours=n_checkpoints)
    with session_scope(factory) as s:
        tenant_id = s.query(ApiKey.tenant_id).first()[0]  # type: ignore[index]
        pool = Pool(
            tenant_id=tenant_id, name="large", task="classification", classes=CLASSES, n_outputs=len(CLASSES),
            embedding_dim=d, head={"kind": "linear"}, created_at=t0, updated_at=t0,
        )  # fmt: skip
        s.add(pool)
        s.flush()
        pool_id = pool.id
        items_repo.upsert_embeddings(s, pool_id, ids, X, t0)
    with session_scope(factory) as s:
        internal = items_repo.internal_ids(s, pool_id, ids)
        val = ids[n - n_val :]
        quality_repo.set_split(s, pool_id, [internal[i] for i in val], "validation", t0)
        labeled = ids[:n_labeled] + val
        items_repo.set_labels(s, [(internal[i], CLASSES[int(y[int(i[5:])])]) for i in labeled], t0)
    size = 100
    for r in range(n_checkpoints):
        at = t0 + timedelta(minutes=60 * r)
        chosen = ids[n_labeled + r * size : n_labeled + (r + 1) * size]
        with session_scope(factory) as s:
            batch = Batch(
                pool_id=pool_id, size=size, strategy="bait" if r % 2 == 0 else "margin", params={},
                status="succeeded", progress_stage="done", progress_done=size, progress_total=size,
                item_ids=chosen, objective=float(100 - r), attempts=1,
                diagnostics={"timings": {"total": 1.5, "train": 0.5, "select": 0.8}},
                created_at=at, started_at=at, finished_at=at + timedelta(seconds=2),
            )  # fmt: skip
            s.add(batch)
            s.flush()
            acc = 0.5 + 0.4 * r / max(n_checkpoints - 1, 1)
            cp = Checkpoint(
                pool_id=pool_id, batch_id=batch.id, round=r + 1, n_labels=n_labeled + r * size,
                config={"kind": "linear", "input_dim": d, "n_outputs": len(CLASSES)},
                metrics={"train_accuracy": 0.99, "train_loss": 0.05, "epochs": 40},
                validation_metrics={"n": n_val, "metrics": {
                    "accuracy": acc, "macro_f1": acc - 0.02, "log_loss": 1.5 - acc, "ece": 0.05,
                    "per_class_recall": dict.fromkeys(CLASSES, acc)}},
                weights=rng.bytes(4 * (d + 1) * len(CLASSES)), created_at=at + timedelta(seconds=2),
            )  # fmt: skip
            s.add(cp)
            s.flush()
            batch.checkpoint_id = cp.id
            m = min(map_points, n)
            rows = np.sort(rng.choice(n, size=m, replace=False))
            xy = rng.standard_normal((m, 2))
            payload = {
                "total": n, "n_points": m, "classes": CLASSES, "method": "pca of penultimate features",
                "points": {
                    "id": [ids[i] for i in rows], "x": [round(float(v), 4) for v in xy[:, 0]],
                    "y": [round(float(v), 4) for v in xy[:, 1]],
                    "status": ["labeled" if i < n_labeled else "unlabeled" for i in rows],
                    "label": [CLASSES[int(y[i])] if i < n_labeled else None for i in rows],
                    "predicted": [CLASSES[int(y[i])] for i in rows],
                    "confidence": [0.5] * m,
                },
            }  # fmt: skip
            quality_repo.put_map(s, cp.id, pool_id, json.dumps(payload).encode(), m, at)
    engine.dispose()
    return pool_id


def sign_in(base: str, key: str) -> httpx.Client:
    client = httpx.Client(base_url=base, timeout=120)
    form = client.get("/ui/login")  # the sign-in form's pre-session token, bound to its bait_login cookie
    token = re.search(r'name="login_csrf" value="([^"]+)"', form.text)
    if token is None:
        raise RuntimeError(f"no sign-in form at {base}/ui/login: {form.status_code}")
    r = client.post("/ui/login", data={"api_key": key, "login_csrf": token.group(1)}, follow_redirects=False)
    if r.status_code != 303:
        raise RuntimeError(f"sign-in failed: {r.status_code} {r.text[:300]}")
    return client


def timed(client: httpx.Client, path: str, repeat: int) -> tuple[float, float, int]:
    """Median and worst seconds of ``repeat`` GETs after one warm-up, and the body size."""
    r = client.get(path)
    if r.status_code != 200:
        raise RuntimeError(f"GET {path}: {r.status_code} {r.text[:300]}")
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        r = client.get(path)
        times.append(time.perf_counter() - t)
        if r.status_code != 200:
            raise RuntimeError(f"GET {path}: {r.status_code}")
    return statistics.median(times), max(times), len(r.content)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--database-url", help="PostgreSQL admin URL (a scratch database is made); default SQLite")
    ap.add_argument("--n", type=int, default=100_000, help="items in the pool")
    ap.add_argument("--checkpoints", type=int, default=50)
    ap.add_argument("--d", type=int, default=64, help="embedding dimension")
    ap.add_argument("--repeat", type=int, default=7, help="timed requests per row (after a warm-up)")
    ap.add_argument("--smoke", action="store_true", help="5,000 items, 5 checkpoints, 3 repeats")
    args = ap.parse_args(argv)
    if args.smoke:
        args.n, args.checkpoints, args.repeat = 5_000, 5, 3
    n_labeled, n_val = min(5_000, args.n // 20), min(2_000, args.n // 50)
    map_points = 20_000
    with scratch_database(args.database_url) as (url, database):
        key = mint_key(url)
        t = time.perf_counter()
        pool = build_pool(url, args.n, args.d, args.checkpoints, n_labeled, n_val, map_points)
        build_s = time.perf_counter() - t
        with api_server(url) as base:
            client = sign_in(base, key)
            latest_batch = re.findall(r'class="batch-link" href="([^"]+)"', client.get(f"/ui/pools/{pool}").text)[0]
            paths = [
                ("baseline: /healthz", "/healthz"),
                ("baseline: pools list page /ui", "/ui"),
                ("pool page (HTML)", f"/ui/pools/{pool}"),
                ("  batches table fragment (polled)", f"/ui/pools/{pool}/batches-fragment"),
                (f"  curve.json ({args.checkpoints} points)", f"/ui/pools/{pool}/curve.json"),
                (f"  map.json ({min(map_points, args.n):,} points)", f"/ui/pools/{pool}/map.json"),
                ("batch page (100 items)", latest_batch),
            ]
            rows = [(label, *timed(client, path, args.repeat)) for label, path in paths]
    page = {label: med for label, med, _, _ in rows}
    full = sum(v for k, v in page.items() if k.startswith(("pool page", "  curve", "  map")))
    print("# Dashboard speed")
    for k, v in machine().items():
        print(f"- {k}: {v}")
    print(f"- database: {database}")
    print(f"- pool: {args.n:,} items x {args.d} dims, {n_labeled:,} labeled, {n_val:,} validation, "
          f"{args.checkpoints} checkpoints with metrics and a {map_points:,}-point map each, "
          f"{args.checkpoints} batches of 100 (written in {build_s:.1f} s)")  # fmt: skip
    print(f"- each row: median and worst of {args.repeat} GETs over HTTP after a warm-up, signed in\n")
    print(f"| {'measurement':40} | {'median ms':>9} | {'worst ms':>8} | {'bytes':>10} |")
    print("|" + "-" * 42 + "|" + "-" * 11 + "|" + "-" * 10 + "|" + "-" * 12 + "|")
    for label, med, worst, size in rows:
        print(f"| {label:40} | {1000 * med:9.1f} | {1000 * worst:8.1f} | {size:>10,} |")
    print(f"| {'pool page + curve + map (sum)':40} | {1000 * full:9.1f} | {'':>8} | {'':>10} |")
    verdict = "under" if page["pool page (HTML)"] < 1.0 else "OVER"
    print(f"\npool page: {1000 * page['pool page (HTML)']:.0f} ms ({verdict} the 1 s target); with its curve and map "
          f"JSON {1000 * full:.0f} ms")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

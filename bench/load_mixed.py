"""Mixed load on the API while a BAIT selection runs: requests/s, p50, p99 and errors.

Starts, on localhost only, a uvicorn api and one `bait worker` on a scratch PostgreSQL database and a
Redis queue of their own, makes a pool (n x d float32, 10 classes, 1% labeled), then runs the same
mixed workload twice at a fixed concurrency (threads, one HTTP client each), in turn:

    GET pool, GET items (a page of 100), PUT 100 labels (random items, random order), GET batch

- baseline: nothing else runs;
- with selection: a `bait` batch of ``--size`` items runs in the worker during the whole phase (the
  phase ends when the selection finishes or a phase limit is reached, whichever is first).

Each phase is bounded by ``--requests`` and ``--seconds``. Targets: 0 errors, and p99 within 10x p50
while a selection runs.

Usage:
    python bench/load_mixed.py --database-url postgresql+psycopg://postgres@127.0.0.1:5432/postgres \\
        --redis-url redis://127.0.0.1:6379/0
    python bench/load_mixed.py --database-url ... --redis-url ... --smoke     # seconds
"""

from __future__ import annotations

import argparse
import io
import os
import random
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.service_harness import REPO, machine, mint_key, scratch_database, wait_healthy

OPS = ("GET pool", "GET items", "PUT 100 labels", "GET batch")
CLASSES = [f"c{i}" for i in range(10)]


@dataclass
class Phase:
    """What one phase measured."""

    name: str
    latencies: list[float] = field(default_factory=list)  # seconds, answered requests
    per_op: dict[str, list[float]] = field(default_factory=lambda: {op: [] for op in OPS})
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0
    note: str = ""

    def pct(self, q: float, values: list[float] | None = None) -> float:
        v = self.latencies if values is None else values
        return float(np.percentile(np.asarray(v), q)) * 1000 if v else float("nan")


@contextmanager
def stack(url: str, redis_url: str, log_dir: str) -> Iterator[str]:
    """uvicorn (the api) and one `bait worker` on ``url`` and a private queue on ``redis_url``."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("BAIT_")}
    env.update(
        BAIT_DATABASE_URL=url,
        BAIT_REDIS_URL=redis_url,
        BAIT_QUEUE_NAME=f"bait-load-{uuid.uuid4().hex[:8]}",
        BAIT_PRINT_BOOTSTRAP_KEY="false",
        BAIT_LOG_LEVEL="WARNING",
        BAIT_DEVICE="cpu",
        BAIT_SECRET_KEY=os.environ.get("BAIT_SECRET_KEY") or secrets.token_urlsafe(32),
        OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
    )
    api_cmd = [sys.executable, "-m", "uvicorn", "service.main:create_app", "--factory", "--port", str(port)]
    api = subprocess.Popen(
        [*api_cmd, "--host", "127.0.0.1", "--log-level", "warning"],
        env=env,
        cwd=REPO,
        stdout=open(f"{log_dir}/api.log", "wb"),  # noqa: SIM115 (closed with the process)
        stderr=subprocess.STDOUT,
    )
    worker = subprocess.Popen(
        [sys.executable, "-m", "bait.cli", "worker"],
        env=env,
        cwd=REPO,
        stdout=open(f"{log_dir}/worker.log", "wb"),  # noqa: SIM115
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, api, 90)
        yield base
    finally:
        for proc in (worker, api):
            proc.terminate()
        for proc in (worker, api):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def make_pool(http: httpx.Client, auth: dict[str, str], n: int, d: int) -> tuple[str, list[str]]:
    r = http.post(
        "/v1/pools",
        json={"name": "load", "task": "classification", "classes": CLASSES, "embedding_dim": d},
        headers=auth,
    )
    r.raise_for_status()
    pool_id: str = r.json()["id"]
    ids = [f"item-{i:07d}" for i in range(n)]
    buf = io.BytesIO()
    np.savez(buf, ids=np.asarray(ids), embeddings=np.random.default_rng(0).standard_normal((n, d), dtype=np.float32))
    http.post(f"/v1/pools/{pool_id}/items:bulk", content=buf.getvalue(), headers=auth).raise_for_status()
    seed = [{"item_id": ids[i], "label": CLASSES[i % 10]} for i in range(0, n, 100)]
    http.put(f"/v1/pools/{pool_id}/labels", json={"labels": seed}, headers=auth).raise_for_status()
    return pool_id, ids


def post_batch(http: httpx.Client, auth: dict[str, str], pool_id: str, size: int, strategy: str) -> str:
    r = http.post(f"/v1/pools/{pool_id}/batches", json={"size": size, "strategy": strategy}, headers=auth)
    r.raise_for_status()
    batch_id: str = r.json()["id"]
    return batch_id


def batch_status(http: httpx.Client, auth: dict[str, str], pool_id: str, batch_id: str) -> dict[str, Any]:
    r = http.get(f"/v1/pools/{pool_id}/batches/{batch_id}", headers=auth)
    r.raise_for_status()
    out: dict[str, Any] = r.json()
    return out


def run_phase(
    name: str,
    base: str,
    auth: dict[str, str],
    pool_id: str,
    label_ids: list[str],
    batch_id: str,
    *,
    concurrency: int,
    max_requests: int,
    max_seconds: float,
    until: Any = None,
) -> Phase:
    """``concurrency`` threads run the mix until ``max_requests`` were sent, ``max_seconds`` passed, or
    ``until()`` holds."""
    phase = Phase(name)
    lock = threading.Lock()
    sent = [0]
    stop = threading.Event()
    barrier = threading.Barrier(concurrency + 1)

    def worker(t: int) -> None:
        rng = random.Random(t)
        with httpx.Client(base_url=base, timeout=60, headers=auth) as http:
            barrier.wait()
            k = t
            while not stop.is_set():
                with lock:
                    if sent[0] >= max_requests:
                        return
                    sent[0] += 1
                op = OPS[k % len(OPS)]
                k += 1
                t0 = time.perf_counter()
                try:
                    if op == "GET pool":
                        r = http.get(f"/v1/pools/{pool_id}")
                    elif op == "GET items":
                        r = http.get(f"/v1/pools/{pool_id}/items", params={"limit": 100})
                    elif op == "PUT 100 labels":
                        chosen = rng.sample(label_ids, 100)  # random items in a random order
                        labels = [{"item_id": i, "label": rng.choice(CLASSES)} for i in chosen]
                        r = http.put(f"/v1/pools/{pool_id}/labels", json={"labels": labels, "annotator": "load"})
                    else:
                        r = http.get(f"/v1/pools/{pool_id}/batches/{batch_id}")
                    error = None if r.status_code == 200 else f"{op}: {r.status_code} {r.text[:200]}"
                except httpx.HTTPError as exc:
                    error = f"{op}: {type(exc).__name__}: {exc}"
                elapsed = time.perf_counter() - t0
                with lock:
                    if error is None:
                        phase.latencies.append(elapsed)
                        phase.per_op[op].append(elapsed)
                    else:
                        phase.errors.append(error)

    threads = [threading.Thread(target=worker, args=(t,), daemon=True) for t in range(concurrency)]
    for th in threads:
        th.start()
    barrier.wait()
    t0 = time.perf_counter()
    deadline = time.monotonic() + max_seconds
    while any(th.is_alive() for th in threads):
        if time.monotonic() > deadline or (until is not None and until()):
            stop.set()
        time.sleep(0.05)
    phase.seconds = time.perf_counter() - t0
    return phase


def print_table(phases: list[Phase]) -> None:
    heads = ("requests", "req/s", "p50 ms", "p99 ms", "p99/p50", "errors")
    print(f"| {'phase':30} | " + " | ".join(f"{h:>8}" for h in heads) + " |")
    print("|" + "-" * 32 + "|" + "|".join("-" * 10 for _ in heads) + "|")
    for p in phases:
        n = len(p.latencies) + len(p.errors)
        p50, p99 = p.pct(50), p.pct(99)
        cells = (f"{n:,}", f"{n / p.seconds:.1f}", f"{p50:.1f}", f"{p99:.1f}", f"{p99 / p50:.1f}", f"{len(p.errors)}")
        print(f"| {p.name:30} | " + " | ".join(f"{c:>8}" for c in cells) + " |")
    print()
    print(f"| {'p50 / p99 ms by request':30} | " + " | ".join(f"{op:>15}" for op in OPS) + " |")
    print("|" + "-" * 32 + "|" + "|".join("-" * 17 for _ in OPS) + "|")
    for p in phases:
        per_op = [f"{p.pct(50, p.per_op[op]):6.0f} / {p.pct(99, p.per_op[op]):6.0f}" for op in OPS]
        print(f"| {p.name:30} | " + " | ".join(f"{c:>15}" for c in per_op) + " |")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--database-url", required=True, help="PostgreSQL server to create a scratch database on")
    p.add_argument("--redis-url", required=True, help="Redis for the queue (a private queue name is used)")
    p.add_argument("--n", type=int, default=50_000, help="items in the pool")
    p.add_argument("--d", type=int, default=64, help="embedding dimension")
    p.add_argument("--size", type=int, default=200, help="size of the bait batch selected during the load")
    p.add_argument("--concurrency", type=int, default=20)
    p.add_argument("--requests", type=int, default=2_000, help="at most this many requests per phase")
    p.add_argument("--seconds", type=float, default=60.0, help="at most this long per phase")
    p.add_argument("--smoke", action="store_true", help="2,000 x 16, 200 requests a phase: checks the script runs")
    args = p.parse_args(argv)
    if not args.database_url.startswith("postgresql"):
        p.error("--database-url must be a PostgreSQL URL (the benchmark is of the production stack)")
    host = httpx.URL(args.redis_url.replace("redis://", "http://", 1)).host
    if host not in ("127.0.0.1", "localhost", "::1"):
        p.error("--redis-url must be on localhost")
    if args.smoke:
        args.n, args.d, args.size, args.requests, args.seconds = 2_000, 16, 50, 200, 20.0

    print("bait-service mixed load (uvicorn api + one RQ worker + PostgreSQL + Redis, all on localhost)")
    for k, v in machine().items():
        print(f"  {k:22} {v}")
    with scratch_database(args.database_url) as (url, description):
        print(f"  {'database':22} {description}")
        print(
            f"  {'inputs':22} pool n={args.n:,} x d={args.d}, 10 classes, 1% labeled; bait batch of {args.size}; "
            f"concurrency {args.concurrency}; per phase at most {args.requests:,} requests / {args.seconds:.0f} s"
        )
        print(f"  {'mix':22} {', '.join(OPS)} (in turn)")
        print()
        key = mint_key(url)
        auth = {"Authorization": f"Bearer {key}"}
        with (
            tempfile.TemporaryDirectory(prefix="bait-load-") as logs,
            stack(url, args.redis_url, logs) as base,
            httpx.Client(base_url=base, timeout=600) as http,
        ):
            pool_id, ids = make_pool(http, auth, args.n, args.d)
            label_ids = [ids[i] for i in range(args.n) if i % 100][: max(1_000, args.n // 10)]
            # a finished batch for GET batch (and a warm worker: imports, first selection)
            warm = post_batch(http, auth, pool_id, 20, "bait")
            deadline = time.monotonic() + 300
            while batch_status(http, auth, pool_id, warm)["status"] not in ("succeeded", "failed"):
                if time.monotonic() > deadline:
                    raise RuntimeError("the warm-up batch did not finish")
                time.sleep(0.2)
            common = {"concurrency": args.concurrency, "max_requests": args.requests, "max_seconds": args.seconds}
            phases = [run_phase("baseline (no selection)", base, auth, pool_id, label_ids, warm, **common)]

            batch_id = post_batch(http, auth, pool_id, args.size, "bait")
            while batch_status(http, auth, pool_id, batch_id)["status"] == "queued":
                time.sleep(0.05)
            poller = httpx.Client(base_url=base, timeout=60)

            def selection_done() -> bool:
                return batch_status(poller, auth, pool_id, batch_id)["status"] not in ("queued", "running")

            loaded = run_phase(
                "with a bait selection running", base, auth, pool_id, label_ids, warm, until=selection_done, **common
            )
            still_running = not selection_done()
            while not selection_done() and time.monotonic() < deadline + 600:
                time.sleep(0.5)
            poller.close()
            final = batch_status(http, auth, pool_id, batch_id)
            loaded.note = (
                f"batch {final['status']} in {final['diagnostics'].get('timings', {}).get('total', float('nan')):.1f} s"
                f"{' (ran past the phase)' if still_running else ''}"
            )
            phases.append(loaded)
    print_table(phases)
    print()
    print(f"selection during the loaded phase: {loaded.note}; loaded phase lasted {loaded.seconds:.1f} s")
    for ph in phases:
        for e in sorted(set(ph.errors))[:5]:
            print(f"error ({ph.name}): {e}")
    ratio = loaded.pct(99) / loaded.pct(50)
    verdict = "met" if not any(ph.errors for ph in phases) and ratio <= 10 else "NOT met"
    print(f"targets (0 errors; p99 <= 10 x p50 with a selection running): {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

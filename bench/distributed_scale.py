"""BAIT on a Dask cluster against the single-process path, through the service (issue 26).

One scratch database and one pool (``--n`` x ``--d`` float32, 10 classes, ``--labeled`` labels), served by
the api under uvicorn with its in-process job runner, twice: first with no cluster (the single-process batch, the
baseline), then with ``BAIT_DASK_SCHEDULER`` naming a real ``dask scheduler`` with ``--workers`` ``dask worker``
processes on 127.0.0.1 (``--memory-limit`` each) and a pool store in a temporary folder. Rows, in one run:

- ``local``: ``bait`` with a fixed seed, POST -> succeeded (the single-process path);
- ``dask, store cold``: the first cluster batch, which writes the pool store (Parquet shards) first;
- ``dask, N workers``: the same batch with the store warm, for each N of ``--workers`` (largest first; workers are
  stopped between rows), with the stages of the cluster passes (scores + Fisher reduction, gather) and the greedy.

Each batch is cancelled after it is timed, so every row selects from the same pool; every row says whether its
picks equal the single-process picks. Both paths draw a pre-filter's random stratum by item id, so with the same
pre-filter they pick the same items; the default plan chooses how many candidates to keep from the cost model and
rates each process measures for itself, so under load the two paths can choose different counts and then pick
differently. ``--prefilter-top N`` (with ``--prefilter-random M``) gives both paths the same pre-filter. The peak
resident memory (``VmHWM``) of the api process (where the job runs) and of each Dask worker during each cluster
row is printed at the end (each process's peak is reset through ``/proc/PID/clear_refs`` before a row, so a warm
row's figure is not the cold row's store writing). Everything is written under a temporary folder and removed.

    python bench/distributed_scale.py                      # 10^5 x 128, k = 10, B = 100, workers 2 and 1
    python bench/distributed_scale.py --n 1000000 --workers 2,1
    python bench/distributed_scale.py --n 1000000 --prefilter-top 15000 --prefilter-random 5000   # same picks
    python bench/distributed_scale.py --smoke              # 3,000 x 16, k = 10, B = 10: checks the script runs

At 10^7 rows the pool does not fit a single process, and not the upload either: ``--via import`` writes the pool as
Parquet files in the temporary folder (a shard of rows at a time) and registers them by reference
(``POST .../items:import``: its seconds, rows/s and the api's peak memory are a row of their own), ``--no-local``
leaves out the single-process batch (the cluster rows are then compared with the first cluster row's picks) and
``--drop-source`` removes the Parquet files once imported (the disk then holds the database and the store only):

    python bench/distributed_scale.py --n 10000000 --d 256 --via import --no-local --drop-source --workers 2,1
    python bench/distributed_scale.py --n 10000000 --d 768 --via import --no-local --drop-source --workers 2 \
        --max-memory-gb 2 --database-url postgresql+psycopg://postgres@127.0.0.1:5432/test

(On SQLite a 30 GB import's one transaction passes through the write-ahead log, 30 GB more on disk until it is
checkpointed: with the source and the store the 10^7 x 768 run needs PostgreSQL on this box's 80 GB.)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.batch_latency import labeled_pool, warm_up  # noqa: E402
from bench.service_harness import (  # noqa: E402
    BenchContext,
    Row,
    api_server,
    create_pool,
    machine,
    mint_key,
    print_table,
    scratch_database,
)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Cluster:
    """A ``dask scheduler`` and ``dask worker`` processes on 127.0.0.1 (logs in ``folder``)."""

    def __init__(self, folder: Path, workers: int, memory_limit: str) -> None:
        self.folder = folder
        port = _free_port()
        self.address = f"tcp://127.0.0.1:{port}"
        self.scheduler = self._start(["scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"], "s")
        self.workers = [
            self._start(
                [
                    "worker",
                    self.address,
                    "--host",
                    "127.0.0.1",
                    "--nthreads",
                    "1",
                    "--memory-limit",
                    memory_limit,
                    "--no-dashboard",
                    "--no-nanny",
                    "--name",
                    f"w{i}",
                ],
                f"w{i}",
            )
            for i in range(workers)
        ]
        self.wait_for(workers)

    def _start(self, args: list[str], name: str) -> subprocess.Popen[bytes]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("BAIT_")}
        env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", DASK_DISTRIBUTED__WORKER__DAEMON="false")
        with open(self.folder / f"{name}.log", "ab") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "dask", *args],
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def wait_for(self, n: int, timeout: float = 120) -> None:
        from distributed import Client

        with Client(self.address, timeout=30, set_as_default=False) as c:
            deadline = time.monotonic() + timeout
            while len(c.scheduler_info(n_workers=-1)["workers"]) != n:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the cluster did not reach {n} worker(s); logs in {self.folder}")
                time.sleep(0.2)

    def stop_worker(self) -> None:
        proc = self.workers.pop()
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        self.wait_for(len(self.workers))

    def close(self) -> None:
        for proc in [*self.workers, self.scheduler]:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


def write_source(folder: Path, n: int, d: int, k: int, labeled: int, file_rows: int) -> tuple[list[str], list[str]]:
    """``n`` x ``d`` float32 Gaussian rows as Parquet files of ``file_rows`` rows under ``folder`` (written a file at a
    time: memory stays at one file's rows), ids ``b-00000000``...; the first ``labeled`` rows' classes by a planted
    linear rule. Returns those rows' ids and labels."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    W = np.random.default_rng(1).standard_normal((d, k)).astype(np.float32)
    ids: list[str] = []
    labels: list[str] = []
    for index, start in enumerate(range(0, n, file_rows)):
        m = min(file_rows, n - start)
        X = np.random.default_rng([2, index]).standard_normal((m, d), dtype=np.float32)
        names = [f"b-{i:08d}" for i in range(start, start + m)]
        if start < labeled:
            take = min(labeled - start, m)
            ids.extend(names[:take])
            labels.extend(f"c{int(c)}" for c in (X[:take] @ W).argmax(axis=1))
        table = pa.table(
            {"id": pa.array(names), "embedding": pa.FixedSizeListArray.from_arrays(pa.array(X.reshape(-1)), d)}
        )
        pq.write_table(table, folder / f"part-{index:05d}.parquet", compression="none")
    return ids, labels


def import_pool(
    ctx: BenchContext,
    name: str,
    source: Path,
    ids: list[str],
    labels: list[str],
    api_pid: int | None,
    head: dict[str, Any] | None = None,
) -> tuple[str, Row, float | None]:
    """A pool filled by ``POST .../items:import`` of ``source`` (under the tenant's data folder), then labeled:
    its id, the import's row (seconds from POST to succeeded, rows/s) and the api process's peak memory after it."""
    pool = create_pool(ctx, name, head)
    t0 = time.perf_counter()
    resp = ctx.client.post(
        f"/v1/pools/{pool}/items:import", json={"source": source.resolve().as_uri()}, headers=ctx.auth
    )
    if resp.status_code != 202:
        raise RuntimeError(f"POST items:import: {resp.status_code} {resp.text[:500]}")
    url = resp.headers["Location"]
    stage = ""
    while True:
        job: dict[str, Any] = ctx.client.get(url, headers=ctx.auth).json()
        progress = job.get("progress") or {}
        if progress.get("stage") != stage:
            stage = str(progress.get("stage"))
            print(f"  import: {stage} at {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        if job["status"] in ("succeeded", "failed"):
            break
        time.sleep(1.0)
    seconds = time.perf_counter() - t0
    if job["status"] != "succeeded":
        raise RuntimeError(f"import {job['status']}: {job.get('error')}")
    peak = peak_rss_mb(api_pid) if api_pid is not None else None
    rows = int(job.get("rows_imported") or 0)
    for begin in range(0, len(ids), 5000):
        chunk = [
            {"item_id": i, "label": c}
            for i, c in zip(ids[begin : begin + 5000], labels[begin : begin + 5000], strict=True)
        ]
        put = ctx.client.put(f"/v1/pools/{pool}/labels", json={"labels": chunk}, headers=ctx.auth)
        if put.status_code != 200:
            raise RuntimeError(f"PUT labels: {put.status_code} {put.text[:500]}")
    note = f"{job.get('counts')}; api peak RSS after it {peak:,.0f} MB" if peak else str(job.get("counts"))
    return pool, Row("import by reference (items:import)", rows, seconds, note=note), peak


def peak_rss_mb(pid: int) -> float | None:
    """The process's peak resident set (``VmHWM``) in MB, or None once it has exited."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def reset_peak(pid: int) -> None:
    """Start the process's ``VmHWM`` again from its current resident set (``/proc/PID/clear_refs``), so the next
    reading is the peak of what ran since (plus whatever the process kept from before)."""
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/clear_refs").write_text("5")


def timed_bait(ctx: BenchContext, pool: str, size: int, params: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """Seconds from POST to ``succeeded`` of a ``bait`` batch with ``params`` (a fixed seed), and the batch (then
    cancelled)."""
    t0 = time.perf_counter()
    body = {"size": size, "strategy": "bait", "params": params}
    resp = ctx.client.post(f"/v1/pools/{pool}/batches", json=body, headers=ctx.auth)
    if resp.status_code != 202:
        raise RuntimeError(f"POST batches: {resp.status_code} {resp.text[:500]}")
    url = resp.headers["Location"]
    delay = 0.02
    while True:
        batch: dict[str, Any] = ctx.client.get(url, headers=ctx.auth).json()
        if batch["status"] in ("succeeded", "failed", "cancelled"):
            break
        time.sleep(delay)
        delay = min(delay * 1.5, 0.25)
    seconds = time.perf_counter() - t0
    if batch["status"] != "succeeded":
        raise RuntimeError(f"bait batch {batch['status']}: {batch['error']}")
    ctx.client.post(f"{url}/cancel", headers=ctx.auth).raise_for_status()
    return seconds, batch


def stage_note(batch: dict[str, Any], baseline: list[str] | None) -> str:
    diag = batch["diagnostics"]
    sel = diag.get("selection", {})
    parts = [f"engine {diag.get('engine')}" + (f" ({diag['engine_note']})" if diag.get("engine_note") else "")]
    if baseline is not None:
        parts.append("same picks" if batch["item_ids"] == baseline else "DIFFERENT picks")
    cluster = sel.get("cluster") or {}
    ct = cluster.get("timings") or {}
    if ct:
        stages = ", ".join(
            f"{k} {float(v):.2f}" for k, v in ct.items() if k in ("scores", "fisher", "gather", "passes")
        )
        parts.append(f"cluster: {stages} s; {cluster.get('workers_used')} worker(s), {cluster.get('tasks')} tasks")
        parts.append(f"rows gathered {cluster.get('rows_gathered')}")
    t = diag.get("timings", {})
    parts.append(", ".join(f"{k} {float(t[k]):.2f}" for k in ("train", "pool_store", "select", "total") if k in t))
    st = sel.get("timings", {})
    if "forward" in st:
        parts.append(f"greedy {float(st.get('setup', 0)) + float(st['forward']) + float(st.get('backward', 0)):.2f} s")
    return "; ".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--d", type=int, default=128)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--labeled", type=int, default=1000)
    ap.add_argument("--workers", default="2,1", help="worker counts to time, e.g. 2,1 (one cluster, workers stopped)")
    ap.add_argument("--memory-limit", default="3GB")
    ap.add_argument("--shard-rows", type=int, default=65536)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument(
        "--prefilter-top",
        type=int,
        default=0,
        help="both paths pre-filter to this many candidates by score (plus --prefilter-random at random); 0: the "
        "default plan",
    )
    ap.add_argument(
        "--prefilter-random", type=int, default=0, help="with --prefilter-top: candidates kept at random besides"
    )
    ap.add_argument(
        "--head-dtype", choices=("float32", "float64"), default="float32", help="the pool's head (mlp) dtype"
    )
    ap.add_argument("--via", choices=("upload", "import"), default="upload", help="how the pool is filled")
    ap.add_argument("--file-rows", type=int, default=250_000, help="rows per Parquet file with --via import")
    ap.add_argument("--no-local", action="store_true", help="leave out the single-process batch")
    ap.add_argument("--drop-source", action="store_true", help="remove the imported Parquet files once imported")
    ap.add_argument(
        "--max-memory-gb", type=float, default=None, help="the batch's max_memory_gb (the greedy's memory budget)"
    )
    ap.add_argument(
        "--database-url",
        default=None,
        help="a PostgreSQL server to make a scratch database on (default: a SQLite file in the temporary folder)",
    )
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    if args.smoke:
        args.n, args.d, args.size, args.labeled, args.shard_rows = 3000, 16, 10, 300, 700
        args.file_rows = 1000
    params: dict[str, Any] = {"seed": args.seed}
    if args.max_memory_gb:
        params["max_memory_gb"] = args.max_memory_gb
    if args.prefilter_top:
        params["prefilter"] = {"top": args.prefilter_top, "random": args.prefilter_random}
    head = {"kind": "mlp", "dtype": args.head_dtype}
    counts = sorted({int(w) for w in args.workers.split(",")}, reverse=True)
    if not counts or counts[-1] < 1:
        ap.error("--workers must be positive counts, e.g. 2,1")

    print(f"BAIT on a Dask cluster against the single-process path: n={args.n:,} d={args.d} k=10 B={args.size}")
    for key, value in machine().items():
        print(f"  {key:22} {value}")
    print(f"  {'batch params':22} {params}; head {head}")
    print(f"  {'database':22} {'PostgreSQL (scratch database)' if args.database_url else 'SQLite (temporary file)'}")
    print(f"  {'pool':22} filled by {args.via}, {args.labeled:,} labeled; store shards of {args.shard_rows:,} rows")
    print(f"  {'cluster':22} 1 scheduler + {counts[0]} worker(s), 1 thread, --memory-limit {args.memory_limit} each")
    print()
    rows: list[Row] = []
    peaks: dict[str, float | None] = {}
    row_peak: dict[str, list[tuple[str, float | None]]] = {}
    passes: dict[int, float] = {}
    with (
        tempfile.TemporaryDirectory(prefix="bait-dist-bench-") as tmp,
        scratch_database(args.database_url) as (url, description),
    ):
        folder = Path(tmp)
        key = mint_key(url)
        auth = {"Authorization": f"Bearer {key}"}
        os.environ.update(
            BAIT_POOL_STORE=str(folder / "store"),
            BAIT_POOL_STORE_SHARD_ROWS=str(args.shard_rows),
            BAIT_DATA_ROOT=str(folder / "data"),
        )
        os.environ.pop("BAIT_DASK_SCHEDULER", None)
        local: dict[str, Any] | None = None
        with api_server(url) as base, httpx.Client(base_url=base, timeout=3600) as client:
            ctx = BenchContext(client, auth, args.n, args.d, args.smoke, description)
            warm_up(ctx)
            if args.via == "import":
                source = folder / "data" / "bench" / "pool"
                t0 = time.perf_counter()
                ids, labels = write_source(source, args.n, args.d, 10, args.labeled, args.file_rows)
                print(f"  source written in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
                api = [p.pid for p in _children_of(os.getpid()) if "uvicorn" in " ".join(p.cmdline())]
                pool, row, peak = import_pool(ctx, "dist", source, ids, labels, api[0] if api else None, head)
                rows.append(row)
                peaks["api + import job (after the import)"] = peak
                if args.drop_source:
                    shutil.rmtree(source)
            else:
                ctx.d = args.d
                pool = labeled_pool(ctx, args.n, args.d, 10, args.labeled, name="dist", head=head)
            if not args.no_local:
                seconds, local = timed_bait(ctx, pool, args.size, params)
                rows.append(Row("local (single process)", args.n, seconds, note=stage_note(local, None)))
        cluster = Cluster(folder, counts[0], args.memory_limit)
        try:
            os.environ["BAIT_DASK_SCHEDULER"] = cluster.address
            with api_server(url) as base, httpx.Client(base_url=base, timeout=3600) as client:
                ctx = BenchContext(client, auth, args.n, args.d, args.smoke, description)
                server_pids = [p.pid for p in _children_of(os.getpid()) if "uvicorn" in " ".join(p.cmdline())]

                def row_peaks(label: str) -> None:
                    """The peaks of the row just timed (each process's ``VmHWM`` was reset before it)."""
                    got = [(f"api + job (pid {pid})", peak_rss_mb(pid)) for pid in server_pids]
                    got += [(f"dask worker w{i}", peak_rss_mb(proc.pid)) for i, proc in enumerate(cluster.workers)]
                    row_peak[label] = got
                    for pid in [*server_pids, *(proc.pid for proc in cluster.workers)]:
                        reset_peak(pid)

                for pid in [*server_pids, *(proc.pid for proc in cluster.workers)]:
                    reset_peak(pid)
                seconds, batch = timed_bait(ctx, pool, args.size, params)
                row_peaks("dask, store cold (writes it)")
                baseline = local["item_ids"] if local is not None else None
                rows.append(Row("dask, store cold (writes it)", args.n, seconds, note=stage_note(batch, baseline)))
                if baseline is None:
                    baseline = batch["item_ids"]
                for count in counts:
                    while len(cluster.workers) > count:
                        peaks[f"dask worker w{len(cluster.workers) - 1} (then stopped)"] = peak_rss_mb(
                            cluster.workers[-1].pid
                        )
                        cluster.stop_worker()
                    for pid in [*server_pids, *(proc.pid for proc in cluster.workers)]:
                        reset_peak(pid)
                    seconds, batch = timed_bait(ctx, pool, args.size, params)
                    label = f"dask, {count} worker{'s' if count > 1 else ''}, store warm"
                    row_peaks(label)
                    rows.append(Row(label, args.n, seconds, note=stage_note(batch, baseline)))
                    passes[count] = float(((batch["diagnostics"].get("selection") or {}).get("cluster") or {})
                                          .get("timings", {}).get("passes", 0.0))  # fmt: skip
        finally:
            cluster.close()
            os.environ.pop("BAIT_DASK_SCHEDULER", None)
        print(f"  disk used under {tmp}: {_disk_mb(folder):,.0f} MB (database elsewhere in /tmp)", file=sys.stderr)
    print_table(rows)
    print()
    print("peak resident memory (VmHWM, MB; the first api process, which ran the local row, is not shown):")
    for name, mb in peaks.items():
        print(f"  {name:32} {mb:,.0f}" if mb is not None else f"  {name:32} (exited)")
    for label, got in row_peak.items():
        print(f"  during '{label}' (each peak reset before the row):")
        for name, mb in got:
            print(f"    {name:30} {mb:,.0f}" if mb is not None else f"    {name:30} (exited)")
    if 1 in passes and len(passes) > 1:
        for count, seconds in sorted(passes.items()):
            if count > 1 and seconds > 0:
                print(f"pool-wide passes: {passes[1]:.2f} s with 1 worker, {seconds:.2f} s with {count}: "
                      f"{passes[1] / seconds:.2f}x")  # fmt: skip
    same = all("DIFFERENT" not in r.note for r in rows)
    against = "the first cluster row" if args.no_local else "the single-process batch"
    print(f"\nsame picks as {against} on every cluster row: {'yes' if same else 'NO'}")
    return 0 if same else 1


def _disk_mb(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 2**20


def _children_of(pid: int) -> list[Any]:
    import psutil

    return list(psutil.Process(pid).children(recursive=True))


if __name__ == "__main__":
    raise SystemExit(main())

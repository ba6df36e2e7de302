"""The service and embedding benchmarks' smoke sizes run end to end and print finite figures.

``bench/service_throughput.py --smoke`` (which includes ``bench/batch_latency.py``'s rows) runs the
API in a uvicorn subprocess on a scratch database: PostgreSQL when the suite runs against it
(``BAIT_TEST_DATABASE_URL``), else a temporary SQLite file. ``bench/load_mixed.py --smoke`` runs
the mixed load on PostgreSQL + Redis + one RQ worker (the PostgreSQL + Redis pass only).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(args: list[str], timeout: int = 600) -> str:
    proc = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        cwd=ROOT,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout


def _table(stdout: str) -> dict[str, list[str]]:
    """``measurement -> cells`` of the Markdown-ish rows the scripts print."""
    rows: dict[str, list[str]] = {}
    for line in stdout.splitlines():
        if line.startswith("|") and "---" not in line:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            rows[cells[0]] = cells[1:]
    return rows


def test_service_throughput_smoke_uploads_labels_and_runs_batches() -> None:
    args = [str(ROOT / "bench" / "service_throughput.py"), "--smoke"]
    url = os.environ.get("BAIT_TEST_DATABASE_URL")
    if url:
        args += ["--database-url", url]
    out = _run(args)
    assert ("PostgreSQL" if url else "SQLite") in out
    rows = _table(out)
    posts = {k: v for k, v in rows.items() if k.endswith("POST -> succeeded")}
    assert any(k.startswith("bait B=100") for k in posts), out
    assert any(k.startswith("random B=100") for k in posts), out
    uploads = [v for k, v in rows.items() if "upload" in k.lower()]
    assert uploads, out
    for name, cells in [*posts.items(), *((f"upload {i}", c) for i, c in enumerate(uploads))]:
        n = int(cells[0].replace(",", ""))
        seconds = float(cells[1])
        assert n == 2_000 and math.isfinite(seconds) and seconds > 0, (name, cells)


def test_embedding_throughput_smoke_reports_every_encoder() -> None:
    out = _run([str(ROOT / "bench" / "embedding_throughput.py"), "--n", "16", "--batch", "8"])
    rows = [line for line in out.splitlines() if line.startswith("| ") and "encoder" not in line]
    assert len(rows) == 4, out
    names = " ".join(rows)
    assert "identity" in names and "torchscript CNN" in names and "text-minilm" in names
    for line in rows:
        rate = float(line.strip().strip("|").split("|")[3].replace(",", ""))
        assert math.isfinite(rate) and rate > 0, line


@pytest.mark.skipif(
    not (os.environ.get("BAIT_TEST_DATABASE_URL") and os.environ.get("BAIT_TEST_REDIS_URL")),
    reason="bench/load_mixed.py measures the production stack: needs PostgreSQL and Redis "
    "(BAIT_TEST_DATABASE_URL, BAIT_TEST_REDIS_URL)",
)
def test_load_mixed_smoke_runs_both_phases_without_errors() -> None:
    out = _run(
        [
            str(ROOT / "bench" / "load_mixed.py"),
            "--smoke",
            "--database-url",
            os.environ["BAIT_TEST_DATABASE_URL"],
            "--redis-url",
            os.environ["BAIT_TEST_REDIS_URL"],
        ]
    )
    summary = out.split("p50 / p99 ms by request")[0]  # the first table (the second is per request kind)
    rows = _table(summary)
    for phase in ("baseline (no selection)", "with a bait selection running"):
        requests, rate, p50, p99, _, errors = rows[phase]
        assert int(requests.replace(",", "")) == 200, (phase, out)
        assert errors == "0", (phase, out)  # no request fails, with or without a selection running
        assert all(math.isfinite(float(v)) and float(v) > 0 for v in (rate, p50, p99)), (phase, out)
        assert float(p50) <= float(p99)
    assert "load avg" in out and "batch succeeded" in out, out


def test_dashboard_speed_smoke_times_every_page() -> None:
    args = [str(ROOT / "bench" / "dashboard_speed.py"), "--smoke"]
    url = os.environ.get("BAIT_TEST_DATABASE_URL")
    if url:
        args += ["--database-url", url]
    out = _run(args)
    assert ("PostgreSQL" if url else "SQLite") in out
    rows = _table(out)
    for name in ("baseline: pools list page /ui", "pool page (HTML)", "batch page (100 items)"):
        median_ms, worst_ms, size = rows[name]
        assert 0 < float(median_ms) <= float(worst_ms) and int(size.replace(",", "")) > 0, (name, rows[name])
    assert int(rows["map.json (5,000 points)"][2].replace(",", "")) > 5_000 * 10  # every point was served
    assert "pool page:" in out


def test_device_agreement_smoke_compares_with_the_cpu_baseline() -> None:
    """The GPU bench's smoke row: CPU float64 is the baseline; without a GPU the CUDA variants are
    reported as skipped, with a GPU they must pick what the CPU picked (float64)."""
    out = _run(["bench/device_agreement.py", "--smoke"], timeout=300)
    lines = [ln for ln in out.splitlines() if ln.startswith("smoke-device")]
    cells = [[c.strip() for c in ln.split("|")] for ln in lines]
    assert cells[0][1] == "cpu float64" and cells[0][4] == "baseline"
    assert math.isfinite(float(cells[0][3])) and float(cells[0][3]) > 0
    gpu = [c for c in cells if c[1].startswith("cuda")]
    assert len(gpu) == 2
    for c in gpu:
        if "skipped" in c[2]:
            assert "no CUDA device" in c[2]
        elif c[1].startswith("cuda float64"):
            assert c[4] == "yes", c


def test_upload_scale_smoke_uploads_in_blocks_and_times_the_reads() -> None:
    """bench/upload_scale.py at its smoke size: uploads through real uvicorn processes (the baseline being the
    code of HEAD, extracted with git archive) with several blocks each, the peak RSS of the api, and the reads
    on the pool (counts from pool_item_counts, the GROUP BY of before, item pages)."""
    args = [str(ROOT / "bench" / "upload_scale.py"), "--smoke", "--baseline-ref", "HEAD"]
    url = os.environ.get("BAIT_TEST_DATABASE_URL")
    if url:
        args += ["--admin-url", url]
    out = _run(args)
    assert ("PostgreSQL" if url else "SQLite") in out
    uploads = [line for line in out.splitlines() if line.startswith("| @HEAD") or line.startswith("| this tree")]
    assert len(uploads) == 3, out
    for line in uploads:
        _, rows, dim, seconds, rate, peak_mb, _load = (c.strip() for c in line.strip().strip("|").split("|"))
        assert int(rows.replace(",", "")) in (1000, 3000) and dim == "16", line
        assert all(math.isfinite(float(v.replace(",", ""))) and float(v.replace(",", "")) > 0 for v in (seconds, rate))
        assert 50 < float(peak_mb) < 4000, line
    table = _table(out)
    for name in ("GET pool (counts)", "GET items, last page (cursor)", "GET items ?status=unlabeled, first page"):
        median_ms, worst_ms = table[name]
        assert 0 < float(median_ms) <= float(worst_ms), (name, table[name])


def test_pool_cache_smoke_serves_warm_batches_without_reading_the_pool() -> None:
    """bench/pool_cache.py at its smoke size: every row ran a real batch job; warm rows read nothing of the pool,
    the small changes were refreshed from the changed rows only, and the baseline read every row."""
    args = [str(ROOT / "bench" / "pool_cache.py"), "--smoke", "--strategies", "random,margin"]
    url = os.environ.get("BAIT_TEST_DATABASE_URL")
    if url:
        args += ["--database-url", url]
    out = _run(args)
    assert ("PostgreSQL" if url else "SQLite") in out
    rows = _table(out)
    for name, cells in rows.items():
        if name == "batch":
            continue
        seconds, load, peak = float(cells[0]), float(cells[1]), float(cells[4])
        # Printed to 2 decimals: a cache hit's load (nothing read) can show as 0.00 on a fast machine.
        assert math.isfinite(seconds) and 0 <= load <= seconds and peak > 0, (name, cells)
    assert rows["random before (whole pool read per batch)"][2:4] == ["uncached", "3,000"]
    assert rows["random cold (empty cache)"][2] == "ids" and rows["margin cold (empty cache)"][2] == "cold"
    for strategy in ("random", "margin"):
        assert rows[f"{strategy} warm (pool unchanged)"][2:4] == ["hit", "0"]
    assert rows["random warm after +1,000 rows"][2:4] == ["append", "1,000"]
    assert rows["random warm after 10 updated"][2:4] == ["patch", "10"]
    assert rows["random warm after 10 moved out"][2:4] == ["merge", "10"]
    assert rows["load fill again (pool unchanged, no batch)"][2:4] == ["hit", "0"]


def test_service_many_classes_smoke_times_random_and_bait_with_their_plans() -> None:
    args = [str(ROOT / "bench" / "service_many_classes.py"), "--smoke"]
    url = os.environ.get("BAIT_TEST_DATABASE_URL")
    if url:
        args += ["--database-url", url]
    out = _run(args)
    assert ("PostgreSQL" if url else "SQLite") in out
    rows = _table(out)
    assert {"random (baseline)", "bait, default plan", "bait, approx=topc"} <= set(rows), out
    for name in ("random (baseline)", "bait, default plan", "bait, approx=topc"):
        seconds = float(rows[name][0])
        assert math.isfinite(seconds) and seconds > 0, (name, rows[name])
    # The plan the service ran is the one its diagnostics name: exact by default, top-c when asked.
    assert rows["bait, default plan"][9].startswith("exact,") and "k=6" in rows["bait, default plan"][9], out
    assert rows["bait, approx=topc"][9].startswith("topc, classes="), out
    assert rows["random (baseline)"][8] == "-"


def test_distributed_scale_smoke_runs_bait_on_a_real_cluster_with_the_single_process_picks() -> None:
    # a real `dask scheduler` and two `dask worker` processes; the script exits 1 if any cluster row's picks
    # differ from the single-process batch's
    out = _run([str(ROOT / "bench" / "distributed_scale.py"), "--smoke"])
    rows = _table(out)
    rows.pop("measurement")  # the header
    assert set(rows) == {
        "local (single process)",
        "dask, store cold (writes it)",
        "dask, 2 workers, store warm",
        "dask, 1 worker, store warm",
    }, out
    assert "engine local" in rows["local (single process)"][-1]
    for name, cells in rows.items():
        seconds = float(cells[1])
        assert math.isfinite(seconds) and seconds > 0, (name, cells)
        if name.startswith("dask"):
            assert "engine dask; same picks" in cells[-1], (name, cells)
    assert "1 worker(s)" in rows["dask, 1 worker, store warm"][-1]
    assert "same picks as the single-process batch on every cluster row: yes" in out


def test_auto_cost_smoke_times_auto_against_the_arm_it_plays(tmp_path: Path) -> None:
    """bench/auto_cost.py at its smoke size: every case's history makes auto play the arm named (the script raises
    otherwise), and each row has auto's time (its default: no outlier check), the fixed strategy's and the overheads,
    auto's time with its pool outlier check and the fixed strategy's with the service's picks check; two planted
    corrupt rows are left out by the checked auto."""
    argv = [str(ROOT / "bench" / "auto_cost.py"), "--smoke", "--corrupt", "2", "--json", str(tmp_path / "auto.json")]
    out = _run(argv, timeout=300)
    rows = _table(out)
    assert rows.pop("case")[:3] == ["arm", "E", "excluded"], out  # the header
    # the history carries validation scores: no uniform picks by default, the share asked for otherwise
    expected = {"bait round": ("bait", 0), "margin round": ("margin", 0), "random round": ("random", 0)}
    expected["margin, explore 0.1"] = ("margin", 1)
    expected["margin, explore 0.5"] = ("margin", 5)
    assert set(rows) == set(expected), out
    for name, (arm, n_explore) in expected.items():
        cells = rows[name]
        got_arm, got_e, excluded, auto_s, fixed_s, vs_fixed, arm_s, vs_arm = cells[:8]
        nocheck_s, checked_s, vs_checked, calls, load = cells[8:]
        assert (got_arm, int(got_e), int(excluded)) == (arm, n_explore, 2), (name, rows[name])
        seconds = [float(v) for cell in (auto_s, fixed_s, nocheck_s, checked_s) for v in cell.split(" / ")]
        assert all(math.isfinite(s) and s > 0 for s in seconds), (name, rows[name])
        assert all(math.isfinite(float(v)) for cell in (vs_fixed, vs_checked) for v in cell.split(", ")), name
        if n_explore:  # auto against the arm at the B - E slots it fills
            assert float(arm_s.split(" / ")[0]) > 0 and len(vs_arm.split(", ")) == 2, (name, rows[name])
        else:
            assert arm_s == vs_arm == "-", (name, rows[name])
        assert int(calls) >= 2 and float(load) >= 0
    assert "auto adds at most 10 % to the fixed strategy's time (min over repeats) on every case:" in out
    assert "against the fixed strategy with the service's picks check:" in out
    saved = json.loads((tmp_path / "auto.json").read_text())
    assert [r["case"] for r in saved["results"]] == list(expected) and saved["args"]["n"] == 3_000

"""The service and embedding benchmarks' smoke sizes run end to end and print finite figures.

``bench/service_throughput.py --smoke`` (which includes ``bench/batch_latency.py``'s rows) runs the
API in a uvicorn subprocess on a scratch database: PostgreSQL when the suite runs against it
(``BAIT_TEST_DATABASE_URL``), else a temporary SQLite file.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

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

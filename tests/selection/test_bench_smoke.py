"""The speed benchmark's smoke mode runs end to end and prints finite numbers."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_selection_speed_smoke_prints_a_table_with_finite_numbers(tmp_path: Path) -> None:
    out_json = tmp_path / "rows.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "selection_speed.py"),
            "--smoke",
            "--naive-limit",
            "0",
            "--json",
            str(out_json),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "torch threads per row: 1" in proc.stdout
    rows = json.loads(out_json.read_text())
    names = {r["name"] for r in rows}
    assert {"smoke-naive", "smoke-f32", "smoke-badge", "smoke-regression", "smoke-approx"} <= names
    for r in rows:
        assert r["name"] in proc.stdout
        for key in ("setup_s", "step_s", "total_s", "peak_gb"):
            assert math.isfinite(r[key]) and r[key] >= 0, (r["name"], key, r[key])
        assert 0 < r["peak_gb"] < 16
    naive = next(r for r in rows if r["name"] == "smoke-naive")
    # The naive ran in full (20 forward steps, then backward to B=10) and agrees on every pick.
    assert naive["picks_match"] == "fwd 20/20, final 10/10"
    assert math.isfinite(naive["speedup"]) and naive["speedup"] > 0
    approx = next(r for r in rows if r["name"] == "smoke-approx")
    assert abs(approx["gap"]) < 0.05


def test_selection_speed_baseline_ref_runs_both_codes(tmp_path: Path) -> None:
    # The working tree's selection/ against HEAD's, alternating, in one run: both rows, same picks' objective.
    out_json = tmp_path / "rows.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "selection_speed.py"),
            "--rows",
            "smoke-select",
            "--baseline-ref",
            "HEAD",
            "--json",
            str(out_json),
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["name"]: r for r in json.loads(out_json.read_text())}
    assert list(rows) == ["smoke-select @HEAD", "smoke-select"]
    for r in rows.values():
        assert math.isfinite(r["total_s"]) and r["total_s"] > 0 and r["load"] >= 0
        assert "plain select() call" in r["notes"]
    assert rows["smoke-select"]["objective"] > 0 and rows["smoke-select @HEAD"]["objective"] > 0


def test_float32_agreement_smoke_reports_every_configuration() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "float32_agreement.py"), "--problems", "2", "--n", "150", "--d", "6"],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [
        line
        for line in proc.stdout.splitlines()
        if line.startswith("| classification") or line.startswith("| regression")
    ]
    assert len(rows) == 5, proc.stdout
    for line in rows:
        cells = [c.strip() for c in line.strip("|").split("|")]
        same, total = (int(v) for v in cells[3].split("/"))
        assert total == 2 and 0 <= same <= 2
        gaps = [float(c.rstrip("%")) for c in cells[4:7]]
        assert all(math.isfinite(g) and abs(g) < 50 for g in gaps), line


def test_selection_scale_smoke_reports_plans_and_gaps(tmp_path: Path) -> None:
    out_json = tmp_path / "scale.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "selection_scale.py"), "--smoke", "--json", str(out_json)],
        capture_output=True,
        text=True,
        # the committed rate table, not this machine's measured rates: the plans (exact or not) must not
        # depend on how fast or busy the machine running the suite is
        env={**os.environ, "OMP_NUM_THREADS": "1", "BAIT_RATES": "table"},
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["name"]: r for r in json.loads(out_json.read_text())}
    assert set(rows) == {
        "smoke-k-gap",
        "smoke-prefilter",
        "smoke-prefilter-big",
        "smoke-auto",
        "smoke-step",
        "smoke-flat",
    }
    for row in rows.values():
        for run in row["runs"]:
            assert math.isfinite(run["seconds"]) and run["seconds"] >= 0
            assert len(run["load"]) == 2
            assert run["plan"]["kind"] in ("exact", "pca", "topc", "pca+topc", "sampled", "pca+sampled")
            assert run["variant"] in proc.stdout
    gaps = {r["variant"]: r["gap"] for r in rows["smoke-k-gap"]["runs"]}
    assert gaps["exact"] == 0.0 and abs(gaps["topc"]) < 0.05 and abs(gaps["pca+topc"]) < 0.1
    pre = rows["smoke-prefilter"]["runs"][1]
    assert pre["plan"]["prefilter"]["kept_top"] == 600 and abs(pre["gap"]) < 0.05
    auto = rows["smoke-auto"]["runs"][0]["plan"]
    assert auto["kind"] != "exact" and auto["estimated_seconds"] <= 0.2
    flat = {r["variant"]: r for r in rows["smoke-flat"]["runs"]}
    assert flat["sampled"]["plan"]["samples"] >= 1 and abs(flat["sampled"]["gap"]) < 0.2
    one, two = rows["smoke-step"]["runs"]
    assert one["indices"] == two["indices"]  # the same picks on 1 and 2 worker threads
    assert one["step_ms"] > 0 and two["step_ms"] > 0
    # The big-pool row: the plan on the whole (block-generated) pool, then exact vs that plan on a subsample,
    # both scored by one explicit float64 F; the exact run's own objective agrees with it.
    whole, exact_sub, pre_sub = rows["smoke-prefilter-big"]["runs"]
    assert whole["plan"]["prefilter"]["kept_top"] == 1500 and 0 < whole["peak_gb"] < 8
    assert exact_sub["gap"] == 0.0 and exact_sub["plan"]["kind"] == "exact" and "prefilter" not in exact_sub["plan"]
    # The engine runs this row in float32 (its pool GEMMs through OpenBLAS since the step rewrite): agreement
    # to float32 accumulation error, 1.2e-6 relative measured, not to float64's.
    assert math.isclose(exact_sub["objective"], exact_sub["engine_objective"], rel_tol=1e-5)
    assert pre_sub["plan"]["prefilter"]["kept_random"] == 500 and abs(pre_sub["gap"]) < 0.1

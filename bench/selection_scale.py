"""BAIT at scale: the auto plan for many classes, pre-filtering for big pools, and their gaps to exact BAIT.

    python bench/selection_scale.py --rows k100-approx        # n = 20,000, d = 512, k = 100, B = 100
    python bench/selection_scale.py --rows k100-gap,prefilter # objective gaps where exact BAIT runs
    python bench/selection_scale.py --rows k100-default       # the plain select() a user gets at k = 100
    python bench/selection_scale.py --rows prefilter-1m       # 10^6 x 768, k = 10: auto plan + 10^5 gap
    python bench/selection_scale.py --smoke                   # tiny sizes, seconds

``prefilter-1m`` builds a 10^6 x 768 float32 pool in blocks (3 GB), times the default plan end to end
(the cost model pre-filters above its named pool size) and reports the process's peak memory; then, on
a 10^5-row subsample of the same pool, it runs exact BAIT and the default (pre-filtered) plan and
compares the two sets by the exact float64 ``tr(M^{-1} F)`` over the subsample (one explicit ``F``).

Each row prints its wall time, the plan the library chose or was told (``diagnostics["approximation"]``)
and, for ``gap`` rows, the exact float64 objective ``tr(M^{-1} F)`` of every variant's set relative to
exact BAIT's on the same data in the same run (negative: better than greedy exact). The 1-minute load
average before and after each run is printed with it: the benchmark machine is shared, so times are
only comparable within a row.

Data: embeddings with a decaying spectrum (``0.97^j``), softmax of a random linear model with logit
scale ``temp`` (``temp = 60`` at ``k = 100``: mean top-1 probability 0.84, 0.1 % of the mass outside
the top 8 classes, as a trained classifier; at ``temp = 3`` the softmax is nearly flat and top-c
truncation does not apply, the auto plan then keeps every class).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch


@dataclass
class Row:
    """One row: ``variants`` run on the same data; with ``gap``, each is compared with exact BAIT."""

    name: str
    n: int
    d: int
    k: int
    batch: int
    temp: float = 60.0
    n_labeled: int = 100
    dtype: str = "float32"
    variants: dict[str, dict[str, Any]] = field(default_factory=dict)
    gap: bool = False
    smoke: bool = False
    #: ``"big"``: the pool is generated in blocks, the default plan runs on all of it, and the gap is
    #: measured on the first ``sub_n`` rows (exact BAIT vs the default plan there).
    kind: str = "standard"
    sub_n: int = 0
    #: When set, the logits ``x @ w`` are rescaled to this standard deviation (``temp`` is then unused):
    #: ``2.0`` at ``k = 100`` is the issue's uncertain head (mean top-1 probability ~0.26).
    logit_std: float | None = None


ROWS: list[Row] = [
    Row(
        "k100-approx",
        20_000,
        512,
        100,
        100,
        variants={"auto, 120 s budget": {"time_budget_s": 120.0}, "auto, 60 s budget": {"time_budget_s": 60.0}},
    ),
    # What a user gets without parameters (plain select(); the service passes the same default budget).
    Row("k100-default", 20_000, 512, 100, 100, variants={"default plan": {}}),
    Row("prefilter-1m", 1_000_000, 768, 10, 100, temp=3.0, variants={"default plan": {}}, kind="big", sub_n=100_000),
    Row(
        "k100-gap",
        2_000,
        64,
        100,
        20,
        variants={
            "topc (auto c)": {"approx": "topc"},
            "pca+topc d/2": {"approx": "pca+topc", "approx_dim": 32},
            "pca+topc d/4": {"approx": "pca+topc", "approx_dim": 16},
        },
        gap=True,
    ),
    Row(
        "prefilter",
        100_000,
        128,
        10,
        100,
        temp=3.0,
        variants={
            "top 7500 + random 2500": {"prefilter": {"top": 7500, "random": 2500}},
            "top 15000 + random 5000": {"prefilter": {"top": 15000, "random": 5000}},
        },
        gap=True,
    ),
    # The exact greedy step (the compiled kernel) on 1 and 2 worker threads (BAIT_THREADS), alternating:
    # the same picks (each chunk is computed as it would be serially), and what the second thread buys.
    # B = 20 (40 forward steps) keeps each run short, the per-step time is the figure. (Until issue 25
    # this row compared the previous torch.bmm update, BAIT_STEP=legacy, which the library no longer has.)
    Row(
        "n100k-step",
        100_000,
        128,
        10,
        20,
        temp=3.0,
        variants={
            "1 thread": {"approx": "exact", "_env": {"BAIT_THREADS": "1"}},
            "2 threads": {"approx": "exact", "_env": {"BAIT_THREADS": "2"}},
            "1 thread again": {"approx": "exact", "_env": {"BAIT_THREADS": "1"}},
            "2 threads again": {"approx": "exact", "_env": {"BAIT_THREADS": "2"}},
        },
    ),
    # Issue 29: an uncertain 100-class head (softmax of logits with std 2: mean top-1 ~0.26), the plain
    # default call, and the gaps of what its plan does against exact BAIT where exact runs.
    Row("k100-flat", 20_000, 512, 100, 100, logit_std=2.0, variants={"default plan": {}}),
    Row(
        "k100-flat-gap",
        2_000,
        64,
        100,
        20,
        logit_std=2.0,
        variants={
            "default plan, 20 s budget": {"time_budget_s": 20.0},
            "default plan, 60 s budget (the default)": {},
            "sampled 12 + 4 (rank 16)": {"approx": "sampled", "approx_classes": 12, "approx_samples": 4},
            "sampled 24 + 8 (rank 32)": {"approx": "sampled", "approx_classes": 24, "approx_samples": 8},
            "topc 16 (rest merged)": {"approx": "topc", "approx_classes": 16},
        },
        gap=True,
    ),
    # --smoke
    Row(
        "smoke-k-gap",
        400,
        8,
        20,
        5,
        n_labeled=10,
        dtype="float64",
        variants={"topc": {"approx": "topc"}, "pca+topc": {"approx": "pca+topc", "approx_dim": 4}},
        gap=True,
        smoke=True,
    ),
    Row(
        "smoke-prefilter",
        3_000,
        8,
        5,
        10,
        temp=3.0,
        n_labeled=20,
        variants={"prefilter": {"prefilter": {"top": 600, "random": 200}}},
        gap=True,
        smoke=True,
    ),
    Row(
        "smoke-prefilter-big",
        30_000,
        8,
        4,
        5,
        temp=3.0,
        n_labeled=20,
        variants={"prefilter": {"prefilter": {"top": 1500, "random": 500}}},
        kind="big",
        sub_n=6_000,
        smoke=True,
    ),
    Row("smoke-auto", 2_000, 16, 30, 5, n_labeled=10, variants={"auto 0.2 s": {"time_budget_s": 0.2}}, smoke=True),
    Row(
        "smoke-flat",
        600,
        8,
        20,
        5,
        n_labeled=10,
        logit_std=1.0,
        dtype="float64",
        variants={"auto 0.3 s": {"time_budget_s": 0.3}, "sampled": {"approx": "sampled"}},
        gap=True,
        smoke=True,
    ),
    Row(
        "smoke-step",
        3_000,
        16,
        10,
        5,
        temp=3.0,
        n_labeled=10,
        dtype="float64",
        variants={
            "1 thread": {"approx": "exact", "_env": {"BAIT_THREADS": "1"}},
            "2 threads": {"approx": "exact", "_env": {"BAIT_THREADS": "2"}},
        },
        smoke=True,
    ),
]


def make_data(row: Row, seed: int) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    gen = torch.Generator().manual_seed(seed)
    dt = torch.float64 if row.dtype == "float64" else torch.float32
    scale = (0.97 ** torch.arange(row.d, dtype=torch.float64)).to(dt)
    x = torch.randn(row.n, row.d, generator=gen, dtype=dt) * scale
    w = torch.randn(row.d, row.k, generator=gen, dtype=dt) * (row.temp / math.sqrt(row.d))
    logits = x @ w
    if row.logit_std is not None:
        logits = logits * (row.logit_std / float(logits.std()))
    probs = torch.softmax(logits, dim=1)
    labeled = np.sort(np.random.default_rng(seed).choice(row.n, size=row.n_labeled, replace=False))
    return x, probs, labeled


def make_big(row: Row, seed: int, block: int = 65_536) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """:func:`make_data`'s distribution, generated ``block`` rows at a time (no n x d temporary)."""
    gen = torch.Generator().manual_seed(seed)
    scale = (0.97 ** torch.arange(row.d, dtype=torch.float64)).to(torch.float32)
    w = torch.randn(row.d, row.k, generator=gen) * (row.temp / math.sqrt(row.d))
    x = torch.empty(row.n, row.d, dtype=torch.float32)
    probs = torch.empty(row.n, row.k, dtype=torch.float32)
    factor = 1.0
    for lo in range(0, row.n, block):
        hi = min(row.n, lo + block)
        torch.randn(hi - lo, row.d, generator=gen, out=x[lo:hi])
        x[lo:hi] *= scale
        logits = x[lo:hi] @ w
        if row.logit_std is not None:
            if lo == 0:  # the first block's logit scale sets the factor for all (i.i.d. rows)
                factor = row.logit_std / float(logits.std())
            logits *= factor
        probs[lo:hi] = torch.softmax(logits, dim=1)
    labeled = np.sort(np.random.default_rng(seed).choice(row.n, size=row.n_labeled, replace=False))
    return x, probs, labeled


def peak_gb() -> float:
    """This process's peak resident memory so far (GB; ru_maxrss is in KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6


def exact_objectives(
    x: torch.Tensor, probs: torch.Tensor, design: np.ndarray, sets: list[np.ndarray], *, batch: int
) -> list[float]:
    """Exact float64 ``tr(M^{-1} F)`` of each set over all rows of ``x``: one explicit ``F`` for all sets.

    Same weights as :func:`selection.fisher.exact_objective` under the default (``reference``) convention.
    """
    from selection.bait import DEFAULT_LAM, design_weights
    from selection.fisher import kron_sum

    f64 = torch.float64
    fmat = kron_sum(x, probs, None, out_dtype=f64, chunk_size=4096)
    fmat /= x.shape[0]
    w_design, w_picked = design_weights("reference", len(design), batch)
    d_idx = torch.as_tensor(design, dtype=torch.long)
    m_design = kron_sum(x[d_idx], probs[d_idx], None, out_dtype=f64, chunk_size=4096) * w_design
    out = []
    for rows in sets:
        idx = torch.as_tensor(rows, dtype=torch.long)
        mmat = m_design + w_picked * kron_sum(x[idx], probs[idx], None, out_dtype=f64, chunk_size=4096)
        mmat.diagonal().add_(DEFAULT_LAM)
        chol = torch.linalg.cholesky(mmat)
        y = torch.linalg.solve_triangular(chol, fmat, upper=False)
        z = torch.linalg.solve_triangular(chol, y.T, upper=False)
        out.append(float(z.diagonal().sum()))
        del mmat, chol, y, z
    return out


def run_big(row: Row, seed: int) -> dict[str, Any]:
    """``kind="big"`` rows: the default plan on the whole pool, then exact vs it on ``sub_n`` rows."""
    import selection

    out: dict[str, Any] = {"name": row.name, "n": row.n, "d": row.d, "k": row.k, "batch": row.batch, "runs": []}
    params = next(iter(row.variants.values()))
    label = next(iter(row.variants))
    t0 = time.perf_counter()
    x, probs, labeled = make_big(row, seed)
    gen_s = time.perf_counter() - t0
    print(f"  {row.name}: generated {row.n:,} x {row.d} float32 in {gen_s:.1f} s, peak {peak_gb():.2f} GB", flush=True)
    kw: dict[str, Any] = {"embeddings": x, "probs": probs, "labeled": labeled, "batch_size": row.batch}
    before = load1()
    t0, c0 = time.perf_counter(), cpu_seconds()
    res = selection.select("bait", **kw, **params)
    run: dict[str, Any] = {
        "variant": f"{label}, all {row.n:,} rows",
        "seconds": time.perf_counter() - t0,
        "cpu_s": cpu_seconds() - c0,
        "load": [before, load1()],
        "objective": res.objective,
        "plan": res.diagnostics["approximation"],
        "setup_s": res.diagnostics["timings"].get("setup"),
        "peak_gb": peak_gb(),
        "timings": res.diagnostics["timings"],
    }
    out["runs"].append(run)
    print(
        f"  {row.name}: {run['variant']}: {run['seconds']:.1f} s (CPU {run['cpu_s']:.1f} s, load "
        f"{before:.1f}/{run['load'][1]:.1f}), peak {run['peak_gb']:.2f} GB, {fmt_plan(run['plan'])}",
        flush=True,
    )
    # The subsample: the first sub_n rows (the pool is i.i.d.), its own labeled rows.
    xs, ps = x[: row.sub_n].clone(), probs[: row.sub_n].clone()
    del x, probs, kw
    lab = np.sort(np.random.default_rng(seed + 1).choice(row.sub_n, size=row.n_labeled, replace=False))
    kw = {"embeddings": xs, "probs": ps, "labeled": lab, "batch_size": row.batch}
    sets = []
    for variant, extra in (("exact", {"approx": "exact", "prefilter": "none"}), (label, params)):
        before = load1()
        t0, c0 = time.perf_counter(), cpu_seconds()
        r = selection.select("bait", **kw, **extra)
        sets.append(r.indices)
        out["runs"].append(
            {
                "variant": f"{variant}, {row.sub_n:,}-row subsample",
                "seconds": time.perf_counter() - t0,
                "cpu_s": cpu_seconds() - c0,
                "load": [before, load1()],
                "objective": r.objective,
                "plan": r.diagnostics["approximation"],
                "setup_s": r.diagnostics["timings"].get("setup"),
                "peak_gb": peak_gb(),
            }
        )
        print(f"  {row.name}: {out['runs'][-1]['variant']}: {out['runs'][-1]['seconds']:.1f} s", flush=True)
    before = load1()
    t0 = time.perf_counter()
    objs = exact_objectives(xs, ps, lab, sets, batch=row.batch)
    print(
        f"  {row.name}: exact float64 objectives over the subsample in {time.perf_counter() - t0:.1f} s "
        f"(load {before:.1f}/{load1():.1f}): exact {objs[0]:.8g}, {label} {objs[1]:.8g}",
        flush=True,
    )
    for run_, obj in zip(out["runs"][1:], objs, strict=True):
        run_["engine_objective"] = run_["objective"]  # the library's own value (exact run: the same F)
        run_["objective"] = obj
        run_["gap"] = obj / objs[0] - 1.0
    return out


#: Issue 29's grid over n, d, k, B and softmax temperature (logit std): every cell the default call with a
#: small time budget; the measured time must stay within 1.5x the budget, the estimate within 2x of it.
#: (name, n, d, k, B, logit std)
GRID: list[tuple[str, int, int, int, int, float]] = [
    ("g01", 10_000, 64, 2, 10, 1.0),
    ("g02", 10_000, 768, 10, 100, 2.0),
    ("g03", 10_000, 128, 200, 50, 2.0),
    ("g04", 10_000, 256, 26, 20, 4.0),
    ("g05", 20_000, 512, 100, 100, 2.0),
    ("g06", 20_000, 512, 100, 100, 8.0),
    ("g07", 20_000, 64, 200, 500, 1.0),
    ("g08", 50_000, 256, 50, 200, 3.0),
    ("g09", 50_000, 768, 100, 10, 0.5),
    ("g10", 100_000, 128, 10, 100, 3.0),
    ("g11", 100_000, 64, 100, 500, 2.0),
    ("g12", 100_000, 768, 2, 100, 1.0),
    ("g13", 300_000, 384, 20, 100, 2.0),
    ("g14", 1_000_000, 64, 10, 100, 2.0),
    ("g15", 1_000_000, 64, 100, 50, 2.0),
    ("g16", 1_000_000, 64, 2, 500, 4.0),
]


def run_grid(budget: float, seed: int, cells: list[str] | None) -> list[dict[str, Any]]:
    """The default plan on each :data:`GRID` cell under ``time_budget_s=budget``; one table row each."""
    import gc

    import selection

    print(
        "| cell | n | d | k | B | logit std | mean top-1 | plan | est s (call) | measured s | measured / budget | "
        "est / measured | guard | estimated gap | load 1m before/after |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    out = []
    for name, n, d, k, b, std in GRID:
        if cells and name not in cells:
            continue
        row = Row(name, n, d, k, b, logit_std=std)
        x, probs, labeled = make_big(row, seed) if n > 200_000 else make_data(row, seed)
        top1 = float(probs.max(1).values.mean())
        before = load1()
        t0 = time.perf_counter()
        res = selection.select("bait", embeddings=x, probs=probs, labeled=labeled, batch_size=b, time_budget_s=budget)
        secs = time.perf_counter() - t0
        diag = res.diagnostics
        plan = diag["approximation"]
        guard = diag.get("deadline", {})
        cell = {
            "cell": name,
            "n": n,
            "d": d,
            "k": k,
            "batch": b,
            "logit_std": std,
            "mean_top1": top1,
            "plan": plan,
            "estimated_s": plan["estimated_seconds"],
            # the whole call: time spent before the run (calibration, planning) plus the run's estimate
            "estimated_call_s": plan.get("estimated_call_seconds", plan["estimated_seconds"]),
            "seconds": secs,
            "timings": diag["timings"],
            "guard": guard,
            "load": [before, load1()],
            "objective": res.objective,
            "objective_kind": diag.get("objective_kind", "exact"),
        }
        out.append(cell)
        guard_s = ", ".join(f"{key}={val}" for key, val in guard.items()) or "-"
        print(
            f"| {name} | {n:,} | {d} | {k} | {b} | {std:g} | {top1:.2f} | {fmt_plan(plan)} | "
            f"{cell['estimated_call_s']:.1f} | {secs:.1f} | {secs / budget:.2f} | "
            f"{cell['estimated_call_s'] / secs:.2f} | {guard_s} | {plan.get('estimated_gap', 0.0):.3g} | "
            f"{before:.1f}/{cell['load'][1]:.1f} |",
            flush=True,
        )
        del x, probs, res
        gc.collect()
    return out


def load1() -> float:
    return os.getloadavg()[0]


def cpu_seconds() -> float:
    """User + system CPU seconds of this process so far (all threads): less load-sensitive than wall time."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def run_row(row: Row, seed: int) -> dict[str, Any]:
    import selection

    x, probs, labeled = make_data(row, seed)
    kw: dict[str, Any] = {"embeddings": x, "probs": probs, "labeled": labeled, "dtype": row.dtype}
    out: dict[str, Any] = {"name": row.name, "n": row.n, "d": row.d, "k": row.k, "batch": row.batch, "runs": []}
    exact_obj: float | None = None
    if row.gap:
        before = load1()
        t0, c0 = time.perf_counter(), cpu_seconds()
        ex = selection.select("bait", batch_size=row.batch, approx="exact", **kw)
        exact_obj = ex.objective
        out["runs"].append(
            {
                "variant": "exact",
                "seconds": time.perf_counter() - t0,
                "cpu_s": cpu_seconds() - c0,
                "setup_s": ex.diagnostics["timings"].get("setup"),
                "load": [before, load1()],
                "objective": exact_obj,
                "gap": 0.0,
                "plan": ex.diagnostics["approximation"],
                "indices": ex.indices.tolist(),
            }
        )
    for label, all_params in row.variants.items():
        params = {k: v for k, v in all_params.items() if k != "_env"}
        env = all_params.get("_env", {})  # environment set for this run only (BAIT_THREADS)
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            before = load1()
            t0, c0 = time.perf_counter(), cpu_seconds()
            res = selection.select("bait", batch_size=row.batch, **kw, **params)
            secs = time.perf_counter() - t0
            cpu = cpu_seconds() - c0
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        diag = res.diagnostics
        run: dict[str, Any] = {
            "variant": label,
            "seconds": secs,
            "cpu_s": cpu,
            "load": [before, load1()],
            "objective": res.objective,
            "objective_kind": diag.get("objective_kind", "exact"),
            "plan": diag["approximation"],
            "setup_s": diag["timings"].get("setup"),
            "forward_s": diag["timings"].get("forward"),
            "step_ms": 1e3 * diag["timings"].get("forward", math.nan) / max(1, diag["steps"]["forward"]),
            "indices": res.indices.tolist(),
        }
        if exact_obj is not None and res.objective is not None:
            run["gap"] = res.objective / exact_obj - 1.0
        out["runs"].append(run)
    if row.gap and row.logit_std is not None:
        rescore(row, out, x, probs, labeled)
    return out


def rescore(row: Row, out: dict[str, Any], x: torch.Tensor, probs: torch.Tensor, labeled: np.ndarray) -> None:
    """Gaps from one explicit float64 ``tr(M^{-1} F)`` for every run's set (the exact run's included).

    A run's own ``objective`` is the exact one only when its ``objective_kind`` says so (an approximate
    plan reports its projected/approximate value when the exact one does not fit its budget, and none
    when the guard cut it), so gap rows of the flat-head rows compare sets, not reported values.
    """
    have = [run for run in out["runs"] if "indices" in run]
    objs = exact_objectives(
        x.to(torch.float64), probs.to(torch.float64), labeled, [np.asarray(r["indices"]) for r in have], batch=row.batch
    )
    for run, obj in zip(have, objs, strict=True):
        run["reported_objective"] = run["objective"]
        run["objective"] = obj
    # The exact run (first): its set is recomputed when stored, else its own (exact) objective stands.
    ref = out["runs"][0]["objective"]
    for run in out["runs"]:
        run["gap"] = run["objective"] / ref - 1.0


def fmt_plan(plan: dict[str, Any]) -> str:
    parts = [plan["kind"]]
    for key in ("pca_dim", "classes", "samples", "oversample"):
        if key in plan:
            parts.append(f"{key}={plan[key]}")
    if "prefilter" in plan:
        pf = plan["prefilter"]
        parts.append(f"prefilter top {pf['top']} + random {pf['random']} ({pf['score']})")
    parts.append(f"est {plan['estimated_seconds']:.3g} s")
    return ", ".join(parts)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="", help="comma-separated row names (default: every non-smoke row)")
    ap.add_argument("--smoke", action="store_true", help="tiny rows only")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default="", help="write the results here")
    ap.add_argument("--grid", action="store_true", help="issue 29's grid of cells (default call, --budget)")
    ap.add_argument("--budget", type=float, default=25.0, help="time_budget_s of the grid cells")
    ap.add_argument("--cells", default="", help="comma-separated grid cells (default: all)")
    ap.add_argument(
        "--rescore", default="", help="a --json file of gap rows: recompute every set's exact objective and gap"
    )
    args = ap.parse_args(argv)
    if args.rescore:
        with open(args.rescore) as fh:
            saved = json.load(fh)
        print(f"uptime: {uptime()}")
        print("| row | variant | exact objective of the set | gap vs exact | reported objective | plan |")
        print("|---|---|---|---|---|---|")
        for res in saved:
            row = next(r for r in ROWS if r.name == res["name"])
            x, probs, labeled = make_data(row, args.seed)
            rescore(row, res, x, probs, labeled)
            for run in res["runs"]:
                rep_obj = run.get("reported_objective")
                print(
                    f"| {row.name} | {run['variant']} | {run['objective']:.6g} | {100 * run['gap']:+.2f}% | "
                    f"{'' if rep_obj is None else f'{rep_obj:.6g}'} | {fmt_plan(run['plan'])} |",
                    flush=True,
                )
        return 0
    if args.grid:
        print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, cpus {os.cpu_count()}")
        print(f"uptime: {uptime()}")
        print(f"grid: default call, time_budget_s={args.budget:g} (promise: measured <= {1.5 * args.budget:g} s)")
        cells = [c.strip() for c in args.cells.split(",") if c.strip()] or None
        results = run_grid(args.budget, args.seed, cells)
        print(f"uptime: {uptime()}")
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(results, fh, indent=1, default=str)
        return 0
    if args.rows:
        wanted = [r.strip() for r in args.rows.split(",") if r.strip()]
        unknown = set(wanted) - {r.name for r in ROWS}
        if unknown:
            ap.error(f"unknown rows {sorted(unknown)}; valid: {', '.join(r.name for r in ROWS)}")
        rows = [r for r in ROWS if r.name in wanted]
    else:
        rows = [r for r in ROWS if r.smoke == args.smoke]
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, cpus {os.cpu_count()}")
    print(f"uptime: {uptime()}")
    print(
        "| row | variant | seconds | CPU s | setup s | ms/step | load 1m before/after | objective | gap vs exact "
        "| plan |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    results = []
    for row in rows:
        res = run_big(row, args.seed) if row.kind == "big" else run_row(row, args.seed)
        results.append(res)
        for run in res["runs"]:
            gap = run.get("gap")
            gap_s = "" if gap is None else f"{100 * gap:+.2f}%"
            obj = run["objective"]
            peak = f", peak {run['peak_gb']:.2f} GB" if "peak_gb" in run else ""
            print(
                f"| {row.name} (n={row.n}, d={row.d}, k={row.k}, B={row.batch}) | {run['variant']} | "
                f"{run['seconds']:.1f} | {run['cpu_s']:.1f} | {run.get('setup_s') or 0:.1f} | "
                f"{run.get('step_ms', math.nan):.0f} | "
                f"{run['load'][0]:.1f}/{run['load'][1]:.1f} | "
                f"{'' if obj is None else f'{obj:.6g}'} | {gap_s} | {fmt_plan(run['plan'])}{peak} |",
                flush=True,
            )
    print(f"uptime: {uptime()}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1, default=str)
    return 0


def uptime() -> str:
    """The ``uptime`` line (load averages): the machine is shared, figures are read with it."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average " + " ".join(f"{v:.2f}" for v in os.getloadavg())


if __name__ == "__main__":
    sys.exit(main())

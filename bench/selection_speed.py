"""Selection speed benchmark: structured BAIT against a direct Woodbury implementation.

Prints the machine, torch threads and device, then one table row per benchmark row:

    python bench/selection_speed.py                 # every default row (slow: tens of minutes)
    python bench/selection_speed.py --smoke         # tiny sizes, seconds
    python bench/selection_speed.py --rows n10k,n100k --naive-limit 3
    python bench/selection_speed.py --device cuda --rows n100k
    python bench/selection_speed.py --rows n100k,n100k-select --baseline-ref main --repeat 2

With ``--baseline-ref REF`` every row also runs with ``selection/`` as it is at the git ref ``REF``
(extracted with ``git archive`` into a temporary folder that goes first on ``PYTHONPATH``), in the
same run and alternating with the working tree (baseline first), so both see the same machine; the
baseline rows are named ``row @REF``. ``--repeat N`` runs every (row, code) pair ``N`` times.
The ``load`` column is the 1-minute load average when the row finished.

Every row runs in a fresh subprocess, so its peak memory (``VmHWM`` of /proc/self/status: the whole
process, Python, torch and the generated data included) is its own. Rows flagged ``naive`` also run
:func:`naive_bait`, a direct implementation of the paper's Woodbury score per candidate with
explicit ``kd x k`` factors and no structure (as in the authors' code), on the same data in the same
run. With ``--naive-limit N`` only its first ``N`` greedy steps are timed and its total is
extrapolated (setup + per-step time x steps; stated in the ``note`` column); its picks are compared
with the structured picks on those steps. With ``--naive-limit 0`` it runs in full, forward and
backward, and both its forward picks and its final batch are compared (``fwd a/2B, final b/B``).

Adding a row: append a :class:`Row` to :data:`ROWS` (any strategy of ``selection.STRATEGIES``; the
row is run through :func:`selection.select`).
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import platform
import resource
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import torch


@dataclass
class Row:
    """One benchmark row.

    Attributes:
        name: key used by ``--rows``.
        strategy: strategy name for :func:`selection.select`.
        n, d: pool size and embedding dimension.
        k: classes (``0`` = regression).
        batch: batch size ``B``.
        dtype: ``"float32"`` or ``"float64"``.
        params: strategy parameters.
        n_labeled: labeled rows (random, seeded).
        naive: also run the direct Woodbury implementation and compare.
        exact_gap: also run exact BAIT (``approx=None``) and report the objective gap.
        run_batch: run with this ``B`` instead and extrapolate the time to ``batch`` (rows too slow
            to run in full on a shared CPU); stated in the output.
        smoke: part of ``--smoke``.
        default: part of the default set.
        plain_call: call :func:`selection.select` as a user would: numpy float32 arrays, no
            ``dtype`` (the input's dtype is kept), default parameters.
    """

    name: str
    strategy: str
    n: int
    d: int
    k: int
    batch: int
    dtype: str = "float32"
    params: dict[str, Any] = field(default_factory=dict)
    n_labeled: int = 100
    naive: bool = False
    exact_gap: bool = False
    run_batch: int | None = None
    smoke: bool = False
    default: bool = True
    plain_call: bool = False


#: The strategies compared with BAIT at n = 100,000 (rows ``n100k-<strategy>``).
BASELINES = (
    "bait_nofisher",
    "logdet_fisher",
    "logdet_rank1",
    "badge",
    "coreset",
    "confidence",
    "margin",
    "entropy",
    "random",
)

ROWS: list[Row] = [
    Row("n10k", "bait", 10_000, 128, 10, 100, dtype="float64", naive=True),
    Row("n100k", "bait", 100_000, 128, 10, 100),
    # The same problem through a plain select() call with 200 labeled rows (numpy float32 input).
    Row("n100k-select", "bait", 100_000, 128, 10, 100, n_labeled=200, plain_call=True),
    Row("n100k-d768", "bait", 100_000, 768, 10, 100),
    Row("k100-gap", "bait", 2_000, 64, 100, 20, params={"approx": "pca", "approx_dim": 8}, exact_gap=True),
    Row("k100-gap-d16", "bait", 2_000, 64, 100, 20, params={"approx": "pca", "approx_dim": 16}, exact_gap=True),
    Row("k100-approx", "bait", 20_000, 512, 100, 100, params={"approx": "pca", "approx_dim": 64}, run_batch=3),
    Row("regression-1m", "bait", 1_000_000, 128, 0, 100),
    Row("k10-gap", "bait", 10_000, 128, 10, 100, params={"approx": "pca", "approx_dim": 32}, exact_gap=True),
    # The other strategies on the n100k problem (``--rows baselines`` runs them all).
    *(Row(f"n100k-{s}", s, 100_000, 128, 10, 100) for s in BASELINES),
    # --smoke
    Row("smoke-naive", "bait", 800, 12, 5, 10, dtype="float64", naive=True, n_labeled=20, smoke=True, default=False),
    Row("smoke-f32", "bait", 3_000, 16, 10, 10, n_labeled=20, smoke=True, default=False),
    Row("smoke-select", "bait", 3_000, 16, 10, 10, n_labeled=40, plain_call=True, smoke=True, default=False),
    Row("smoke-badge", "badge", 3_000, 16, 10, 10, n_labeled=20, smoke=True, default=False),
    Row("smoke-regression", "bait", 20_000, 16, 0, 10, smoke=True, default=False),
    Row(
        "smoke-approx",
        "bait",
        500,
        16,
        8,
        5,
        params={"approx": "pca", "approx_dim": 8},
        exact_gap=True,
        n_labeled=10,
        smoke=True,
        default=False,
    ),
    Row(
        "smoke-extrapolated",
        "bait",
        600,
        8,
        20,
        10,
        run_batch=2,
        n_labeled=10,
        smoke=True,
        default=False,
    ),
]

#: Names that ``--rows`` expands to several rows.
GROUPS = {"baselines": [f"n100k-{s}" for s in BASELINES]}


# --------------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------------


def make_data(row: Row, seed: int, device: str) -> tuple[torch.Tensor, torch.Tensor | None, np.ndarray]:
    """Synthetic pool: embeddings with a decaying spectrum, softmax of a random linear model."""
    gen = torch.Generator().manual_seed(seed)
    dt = torch.float64 if row.dtype == "float64" else torch.float32
    scale = (0.97 ** torch.arange(row.d, dtype=torch.float64)).to(dt)
    x = torch.randn(row.n, row.d, generator=gen, dtype=dt) * scale
    probs = None
    if row.k > 0:
        w = torch.randn(row.d, row.k, generator=gen, dtype=dt) * (3.0 / math.sqrt(row.d))
        probs = torch.softmax(x @ w, dim=1)
    labeled = np.sort(np.random.default_rng(seed).choice(row.n, size=row.n_labeled, replace=False))
    return x.to(device), None if probs is None else probs.to(device), labeled


# --------------------------------------------------------------------------------------------------
# The direct (unstructured) implementation
# --------------------------------------------------------------------------------------------------


def naive_bait(
    x: torch.Tensor,
    probs: torch.Tensor | None,
    labeled: np.ndarray,
    batch: int,
    *,
    lam: float,
    steps: int,
    chunk: int = 256,
    backward_to: int | None = None,
) -> dict[str, Any]:
    """Direct Woodbury BAIT in the full ``kd`` space, ``reference`` convention, float64: ``steps``
    forward steps, then (with ``backward_to``) backward pruning down to that many picks.

    Per step: ``P = M^{-1}`` (explicit inverse), ``Q = P F P``, and for every candidate the explicit
    ``kd x k`` factor ``V_x``, ``g = V^T P V``, ``h = V^T Q V``, score ``tr(h (I+g)^{-1})``:
    ``4 n k (kd)^2`` flops per step, the cost of the authors' implementation without its
    left-to-right ``xt @ P @ F @ P @ xt^T`` ordering.

    Returns:
        ``{"setup": s, "step_times": [s...], "picks": [row...]}``.
    """
    f64 = torch.float64
    n, d = x.shape
    dev = x.device

    def factors(rows: torch.Tensor) -> torch.Tensor:  # m x D x k
        xr = x[rows].to(f64)
        if probs is None:
            return xr[:, :, None]
        p = probs[rows].to(f64)
        k = p.shape[1]
        coef = (torch.eye(k, dtype=f64, device=dev)[None] - p[:, None, :]) * p.sqrt()[:, :, None]  # m x c x k
        # V[:, c*d + j, col] = coef[:, col, c] x_j
        return (coef.transpose(1, 2)[:, :, None, :] * xr[:, None, :, None]).reshape(len(rows), -1, k)

    t0 = time.perf_counter()
    all_rows = torch.arange(n, device=dev)
    big_d = d * (1 if probs is None else probs.shape[1])
    fmat = torch.zeros(big_d, big_d, dtype=f64, device=dev)
    for lo in range(0, n, chunk):
        v = factors(all_rows[lo : lo + chunk])
        fmat += torch.einsum("mak,mbk->ab", v, v)
    fmat /= n
    design = torch.as_tensor(labeled, device=dev)
    w_l, w_s = 1.0 / (len(labeled) + batch), batch / (len(labeled) + batch)
    v_l = factors(design)
    mmat = lam * torch.eye(big_d, dtype=f64, device=dev) + w_l * torch.einsum("mak,mbk->ab", v_l, v_l)
    mask = torch.ones(n, dtype=torch.bool, device=dev)
    mask[design] = False
    cands = all_rows[mask]
    setup = time.perf_counter() - t0
    picks: list[int] = []
    step_times: list[float] = []
    chosen = torch.zeros(len(cands), dtype=torch.bool, device=dev)
    for _ in range(steps):
        ts = time.perf_counter()
        p = torch.linalg.inv(mmat)
        q = p @ fmat @ p
        scores = torch.empty(len(cands), dtype=f64, device=dev)
        for lo in range(0, len(cands), chunk):
            v = factors(cands[lo : lo + chunk]) * math.sqrt(w_s)
            pv = torch.einsum("ab,mbk->mak", p, v)
            qv = torch.einsum("ab,mbk->mak", q, v)
            g = v.transpose(1, 2) @ pv
            h = v.transpose(1, 2) @ qv
            eye = torch.eye(g.shape[1], dtype=f64, device=dev)
            scores[lo : lo + chunk] = torch.linalg.solve(eye + g, h).diagonal(dim1=1, dim2=2).sum(-1)
        scores[chosen] = float("-inf")
        j = int(torch.argmax(scores))
        chosen[j] = True
        picks.append(int(cands[j]))
        v = factors(cands[j : j + 1])[0]
        mmat += w_s * (v @ v.T)
        step_times.append(time.perf_counter() - ts)
    out: dict[str, Any] = {"setup": setup, "step_times": step_times, "picks": picks}
    if backward_to is not None:
        # Backward pruning, as directly: remove the pick whose removal raises tr(M^-1 F) least,
        # tr(U^T Q U (I - U^T P U)^-1) with P and Q recomputed from M at every step.
        tb = time.perf_counter()
        alive = sorted(picks)
        while len(alive) > backward_to:
            p = torch.linalg.inv(mmat)
            q = p @ fmat @ p
            v = factors(torch.tensor(alive, device=dev)) * math.sqrt(w_s)
            g = v.transpose(1, 2) @ torch.einsum("ab,mbk->mak", p, v)
            h = v.transpose(1, 2) @ torch.einsum("ab,mbk->mak", q, v)
            eye = torch.eye(g.shape[1], dtype=f64, device=dev)
            scores = torch.linalg.solve(eye - g, h).diagonal(dim1=1, dim2=2).sum(-1)
            j = int(torch.argmin(scores))
            gone = alive.pop(j)
            v = factors(torch.tensor([gone], device=dev))[0]
            mmat -= w_s * (v @ v.T)
        out["backward_s"] = time.perf_counter() - tb
        out["kept"] = [r for r in picks if r in set(alive)]
    return out


# --------------------------------------------------------------------------------------------------
# One row, in its own process
# --------------------------------------------------------------------------------------------------


def peak_rss_gb() -> float:
    """Peak resident set of this process (VmHWM; ru_maxrss as a fallback)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024 / 1e9
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9


def run_row(row: Row, *, device: str, seed: int, naive_limit: int) -> dict[str, Any]:
    import selection

    x, probs, labeled = make_data(row, seed, device)
    batch = row.run_batch or row.batch
    task = "classification" if row.k > 0 else "regression"
    kwargs: dict[str, Any] = {"embeddings": x, "probs": probs, "labeled": labeled, "task": task}
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    if row.plain_call:
        kwargs["embeddings"] = x.cpu().numpy()
        kwargs["probs"] = None if probs is None else probs.cpu().numpy()
        # numpy in, and the device a user would name (the rows of numpy input stay on the CPU otherwise)
        on: dict[str, Any] = {} if device == "cpu" else {"device": device}
        res = selection.select(row.strategy, batch_size=batch, **on, **kwargs, **row.params)
    else:
        res = selection.select(row.strategy, batch_size=batch, dtype=row.dtype, **kwargs, **row.params)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    total = time.perf_counter() - t0
    diag = res.diagnostics
    timings = diag.get("timings", {})
    steps = diag.get("steps", {})
    n_fwd = int(steps.get("forward", 0)) or batch
    n_bwd = int(steps.get("backward", 0))
    out: dict[str, Any] = {
        **{k: v for k, v in asdict(row).items() if k in ("name", "strategy", "n", "d", "k", "batch", "dtype")},
        "device": diag.get("device", device),
        "threads": torch.get_num_threads(),
        "worker_threads": diag.get("threads"),
        "setup_s": timings.get("setup", timings.get("validate", float("nan"))),
        "step_s": timings.get("forward", timings.get("strategy", float("nan"))) / max(n_fwd, 1),
        "total_s": total,
        "objective": res.objective,
        "notes": [],
    }
    if row.plain_call:
        out["notes"].append(f"plain select() call, numpy input, {row.n_labeled} labeled")
    if "forward" not in timings:
        out["notes"].append("no greedy passes: setup = input checks, s/step = strategy time / B")
    if row.params:
        out["notes"].append(",".join(f"{k}={v}" for k, v in row.params.items()))
    if row.run_batch is not None:
        # Extrapolate to the target batch: forward and backward steps scale with the step count.
        target_fwd = 2 * row.batch
        bwd_step = timings.get("backward", 0.0) / max(n_bwd, 1)
        est = timings.get("setup", 0.0) + out["step_s"] * target_fwd + bwd_step * row.batch
        out["total_s"] = est
        out["notes"].append(f"total extrapolated from a B={batch} run ({total:.1f} s)")
    if row.exact_gap:
        exact_params = {k: v for k, v in row.params.items() if k not in ("approx", "approx_dim")}
        exact = selection.select(row.strategy, batch_size=batch, dtype=row.dtype, **kwargs, **exact_params)
        approx_exact = diag.get("exact_objective", res.objective)
        if approx_exact is None or exact.objective is None:
            raise RuntimeError(f"row {row.name}: {row.strategy} reports no objective to compare")
        gap = float(approx_exact) / exact.objective - 1.0
        out["notes"].append(
            f"approx gap {100 * gap:+.2f}% (exact obj {exact.objective:.6g}, exact run "
            f"{exact.diagnostics['timings']['total']:.1f} s)"
        )
        out["gap"] = gap
    if device.startswith("cuda"):
        out["peak_gb"] = torch.cuda.max_memory_allocated() / 1e9
        out["notes"].append("peak = CUDA max_memory_allocated")
    else:
        out["peak_gb"] = peak_rss_gb()
    if row.naive:
        lam = float(row.params.get("lam", selection.STRATEGIES[row.strategy].params["lam"]))
        n_fwd_target = 2 * row.batch
        limit = n_fwd_target if naive_limit <= 0 else min(naive_limit, n_fwd_target)
        full = limit == n_fwd_target
        nv = naive_bait(x, probs, labeled, batch, lam=lam, steps=limit, backward_to=batch if full else None)
        step = float(np.mean(nv["step_times"]))
        n_cand = row.n - row.n_labeled
        fast_fwd = diag.get("forward_indices", [])[:limit]
        fwd_match = sum(a == b for a, b in zip(fast_fwd, nv["picks"], strict=False))
        if full:
            naive_total = nv["setup"] + float(np.sum(nv["step_times"])) + nv["backward_s"]
            kept_match = sum(a == b for a, b in zip(res.indices.tolist(), nv["kept"], strict=False))
            out["picks_match"] = f"fwd {fwd_match}/{limit}, final {kept_match}/{batch}"
            out["notes"].append(
                f"naive ran in full: setup {nv['setup']:.1f} s, {limit} forward steps "
                f"{float(np.sum(nv['step_times'])):.0f} s, backward {nv['backward_s']:.1f} s"
            )
        else:
            # Backward steps score only the 2B picks: same per-candidate work, scaled by 2B / n_C.
            naive_total = nv["setup"] + step * n_fwd_target + step * (2 * row.batch / n_cand) * row.batch
            out["picks_match"] = f"{fwd_match}/{limit}"
            out["notes"].append(
                f"naive timed on {limit}/{n_fwd_target} forward steps and extrapolated "
                f"(setup {nv['setup']:.1f} s + {step:.2f} s/step)"
            )
        out["naive_s"] = naive_total
        out["naive_step_s"] = step
        out["speedup"] = naive_total / out["total_s"]
    out["notes"] = "; ".join(out["notes"])
    out["load"] = os.getloadavg()[0]
    return out


# --------------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------------


def machine_lines(device: str, threads: int) -> list[str]:
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    lines = [
        f"machine: {platform.node()} | {platform.system()} {platform.release()} | {cpu} | "
        f"{os.cpu_count()} logical CPUs | load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}",
        f"python {platform.python_version()} | torch {torch.__version__} | "
        f"torch threads per row: {threads} (OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}); "
        f"BAIT worker threads: BAIT_THREADS={os.environ.get('BAIT_THREADS', 'unset')} "
        "(default max(torch threads, min(2, CPUs)); per row in the 'thr' column)",
        f"device: {device}"
        + (f" ({torch.cuda.get_device_name(0)})" if device.startswith("cuda") and torch.cuda.is_available() else ""),
    ]
    return lines


COLUMNS = [
    ("name", "row", "{}"),
    ("strategy", "strategy", "{}"),
    ("n", "n", "{:,}"),
    ("d", "d", "{}"),
    ("k", "k", "{}"),
    ("batch", "B", "{}"),
    ("dtype", "dtype", "{}"),
    ("worker_threads", "thr", "{}"),
    ("setup_s", "setup s", "{:.2f}"),
    ("step_s", "s/greedy step", "{:.4f}"),
    ("total_s", "total s", "{:.1f}"),
    ("peak_gb", "peak GB", "{:.2f}"),
    ("load", "load", "{:.1f}"),
    ("naive_s", "naive s", "{:.3g}"),
    ("speedup", "speed-up", "{:.3g}x"),
    ("picks_match", "picks = naive", "{}"),
    ("notes", "note", "{}"),
]


def format_table(results: list[dict[str, Any]]) -> str:
    head = [c[1] for c in COLUMNS]
    body = []
    for res in results:
        cells = []
        for key, _, fmt in COLUMNS:
            val = res.get(key)
            cells.append("-" if val is None or val == "" else fmt.format(val))
        body.append(cells)
    widths = [max(len(h), *(len(r[i]) for r in body)) if body else len(h) for i, h in enumerate(head)]
    lines = [
        " | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)),
        "-+-".join("-" * w for w in widths),
    ]
    lines += [" | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in body]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny rows, seconds")
    ap.add_argument(
        "--rows", default=None, help="comma-separated row names (see --list); 'baselines' = every n100k-<strategy> row"
    )
    ap.add_argument("--list", action="store_true", help="list the rows and exit")
    ap.add_argument("--device", default="cpu", help="cpu or cuda[:i]")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per row (default 1: see notes)")
    ap.add_argument(
        "--naive-limit",
        type=int,
        default=3,
        help="time the naive method on this many forward steps and extrapolate (0 = run it in full)",
    )
    ap.add_argument(
        "--full", action="store_true", help="run rows that normally run a smaller B and extrapolate at their full B"
    )
    ap.add_argument(
        "--baseline-ref",
        default=None,
        help="also run every row with selection/ from this git ref (same run, alternating; rows 'name @REF')",
    )
    ap.add_argument("--repeat", type=int, default=1, help="run every (row, code) pair this many times")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="also write the results to this JSON file")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.worker is not None:
        torch.set_num_threads(args.threads)
        row = Row(**json.loads(args.worker))
        with torch.no_grad():
            res = run_row(row, device=args.device, seed=args.seed, naive_limit=args.naive_limit)
        print("RESULT " + json.dumps(res))
        return 0

    if args.list:
        for r in ROWS:
            print(f"{r.name:20s} {r.strategy:10s} n={r.n:<9,} d={r.d:<4} k={r.k:<4} B={r.batch:<4} {r.dtype}")
        return 0
    if args.rows:
        wanted = [w for name in args.rows.split(",") for w in GROUPS.get(name, [name])]
        unknown = set(wanted) - {r.name for r in ROWS}
        if unknown:
            ap.error(f"unknown rows {sorted(unknown)}; see --list")
        rows = [r for r in ROWS if r.name in wanted]
    else:
        rows = [r for r in ROWS if (r.smoke if args.smoke else r.default)]
    if args.full:
        rows = [replace(r, run_batch=None) for r in rows]

    for line in machine_lines(args.device, args.threads):
        print(line)
    print("timings are wall-clock on a possibly shared machine: expect noise\n", flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    codes: list[tuple[str, dict[str, str]]] = [("", env)]
    base_dir = None
    if args.baseline_ref:
        base_dir = baseline_tree(args.baseline_ref)
        path = os.pathsep.join(p for p in (base_dir, env.get("PYTHONPATH", "")) if p)
        codes.insert(0, (f" @{args.baseline_ref}", {**env, "PYTHONPATH": path}))
    try:
        results = run_rows(rows, codes, args)
    finally:
        if base_dir is not None:
            shutil.rmtree(base_dir, ignore_errors=True)
    print()
    print(format_table(results))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=2)
    return 0 if all(r.get("notes") != "FAILED" for r in results) else 1


def baseline_tree(ref: str) -> str:
    """A temporary folder holding ``selection/`` as it is at the git ref ``ref``."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run(["git", "-C", root, "archive", ref, "selection"], capture_output=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"--baseline-ref {ref!r}: git archive failed: {proc.stderr.decode(errors='replace')}")
    out = tempfile.mkdtemp(prefix="bait-baseline-")
    with tarfile.open(fileobj=io.BytesIO(proc.stdout)) as tar:
        tar.extractall(out, filter="data")
    return out


def run_rows(
    rows: list[Row], codes: list[tuple[str, dict[str, str]]], args: argparse.Namespace
) -> list[dict[str, Any]]:
    """Every row with every code (baseline first), ``--repeat`` times, each in its own subprocess."""
    results: list[dict[str, Any]] = []
    for row, _rep, (suffix, env) in ((r, i, c) for r in rows for i in range(args.repeat) for c in codes):
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--worker",
            json.dumps(asdict(row)),
            "--device",
            args.device,
            "--threads",
            str(args.threads),
            "--naive-limit",
            str(args.naive_limit),
            "--seed",
            str(args.seed),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
        name = row.name + suffix
        if proc.returncode != 0 or not lines:
            print(f"row {name} failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}", file=sys.stderr)
            results.append({"name": name, "strategy": row.strategy, "notes": "FAILED"})
            continue
        res = json.loads(lines[-1][len("RESULT ") :])
        res["name"] = name
        results.append(res)
        print(f"done {name}: {res['total_s']:.1f} s (load {res['load']:.1f})", flush=True)
    return results


if __name__ == "__main__":
    sys.exit(main())

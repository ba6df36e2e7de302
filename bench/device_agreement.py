"""Exact BAIT on a GPU against the CPU: time, and whether the picks are the same.

For each row, one problem (embeddings with a decaying spectrum, softmax probabilities of a random
linear model, ``n_labeled`` labeled rows) is solved with ``selection.select("bait", approx="exact")``

- on the CPU in float64 (the baseline of the same run: every CPU thread),
- on the GPU in float64 (picks must equal the CPU's, in order),
- on the GPU in float32 (compared by the exact float64 objective ``tr(M^-1 F)`` of its set),

and prints one table row per (problem, variant): wall seconds, the objective, picks equal to the
CPU float64 picks, and the objective gap to it.

    python bench/device_agreement.py --rows gpu-n100k-d768      # the issue's GPU row (needs CUDA)
    python bench/device_agreement.py --smoke                    # tiny; CPU only where no GPU
    python bench/device_agreement.py --rows gpu-n100k-d768 --skip-cpu   # GPU variants only
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import selection.bait.engine as bait_engine
from selection import select
from selection.bait import DEFAULT_LAM, design_weights
from selection.fisher import exact_objective


@dataclass(frozen=True)
class Row:
    name: str
    n: int
    d: int
    k: int
    batch: int
    n_labeled: int = 200
    smoke: bool = False


ROWS = [
    Row("gpu-n100k-d768", 100_000, 768, 10, 100),
    Row("gpu-n100k-d128", 100_000, 128, 10, 100),
    Row("gpu-n10k-d128", 10_000, 128, 10, 100),
    Row("smoke-device", 600, 12, 5, 8, n_labeled=20, smoke=True),
]


def problem(row: Row, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((row.n, row.d)) * (0.97 ** np.arange(row.d))).astype(np.float64)
    logits = x @ rng.standard_normal((row.d, row.k)) * (3.0 / np.sqrt(row.d))
    e = np.exp(logits - logits.max(1, keepdims=True))
    probs = e / e.sum(1, keepdims=True)
    labeled = rng.choice(row.n, size=row.n_labeled, replace=False)
    return x, probs, labeled


def set_objective(x: np.ndarray, probs: np.ndarray, labeled: np.ndarray, picks: np.ndarray, lam: float) -> float:
    """Exact float64 ``tr(M^-1 F)`` of a chosen set, from explicit matrices (on the GPU where present)."""
    dev = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    w_l, w_s = design_weights("reference", len(labeled), len(picks))
    return exact_objective(
        torch.from_numpy(x).to(dev),
        torch.from_numpy(probs).to(dev),
        torch.from_numpy(np.asarray(labeled, dtype=np.int64)).to(dev),
        torch.from_numpy(np.asarray(picks, dtype=np.int64)).to(dev),
        lam=lam,
        w_design=w_l,
        w_picked=w_s,
    )


def run_variant(
    x: np.ndarray, probs: np.ndarray, labeled: np.ndarray, batch: int, device: str, dtype: str
) -> tuple[np.ndarray, float]:
    xs: np.ndarray | torch.Tensor = x if dtype == "float64" else x.astype(np.float32)
    ps: np.ndarray | torch.Tensor = probs if dtype == "float64" else probs.astype(np.float32)
    if device.startswith("cuda"):
        xs = torch.as_tensor(xs).to(device)  # the data already on the GPU, as a GPU worker holds it
        ps = torch.as_tensor(ps).to(device)
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    res = select(
        "bait",
        embeddings=xs,
        probs=ps,
        labeled=labeled,
        batch_size=batch,
        device=device,
        dtype=dtype,
        approx="exact",
        seed=0,
    )
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return np.asarray(res.indices), time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", default="gpu-n100k-d768")
    ap.add_argument("--smoke", action="store_true")
    ap.add_argument("--skip-cpu", action="store_true", help="GPU variants only (no baseline: picks not compared)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--cuda-chunk-mb",
        default=None,
        help="comma-separated per-chunk state sizes (MiB) of the GPU greedy step to compare (default: the library's)",
    )
    args = ap.parse_args()

    rows = [r for r in ROWS if r.smoke] if args.smoke else [r for r in ROWS if r.name in args.rows.split(",")]
    if not rows:
        sys.exit(f"no rows matched; choose from {[r.name for r in ROWS]}")
    has_cuda = torch.cuda.is_available()
    default_chunk = bait_engine._STEP_CHUNK_BYTES_CUDA
    gpu = torch.cuda.get_device_name(0) if has_cuda else "none"
    print(f"machine: {platform.node()} | {os.cpu_count()} CPUs | load {os.getloadavg()[0]:.2f} | GPU: {gpu}")
    print(f"torch {torch.__version__} | CPU threads {torch.get_num_threads()}")
    if not has_cuda:
        print("no CUDA device: GPU variants are skipped (reported below)")
    header = f"{'row':16} | {'variant':22} | {'wall s':>8} | {'objective':>14} | picks = cpu f64 | gap vs cpu f64"
    print(header)
    print("-" * len(header))
    for row in rows:
        x, probs, labeled = problem(row, args.seed)
        variants: list[tuple[str, str, int | None]] = [] if args.skip_cpu else [("cpu", "float64", None)]
        chunks: list[int | None] = [int(c) for c in args.cuda_chunk_mb.split(",")] if args.cuda_chunk_mb else [None]
        variants += [("cuda", dt, mb) for dt in ("float64", "float32") for mb in chunks]
        base_picks: np.ndarray | None = None
        base_obj: float | None = None
        for device, dtype, mb in variants:
            label = f"{device} {dtype}" + (f" {mb} MiB" if mb is not None else "")
            if mb is not None:
                bait_engine._STEP_CHUNK_BYTES_CUDA = mb * 2**20
            else:
                bait_engine._STEP_CHUNK_BYTES_CUDA = default_chunk
            if device == "cuda" and not has_cuda:
                print(f"{row.name:16} | {label:22} | {'skipped: no CUDA device':>8}")
                continue
            picks, wall = run_variant(x, probs, labeled, row.batch, device, dtype)
            obj = set_objective(x, probs, labeled, picks, lam=DEFAULT_LAM)
            if base_picks is None and device == "cpu":
                base_picks, base_obj = picks, obj
                same, gap = "baseline", "-"
            elif base_picks is None or base_obj is None:
                same, gap = "not compared", "-"
            else:
                shared = len(set(picks.tolist()) & set(base_picks.tolist()))
                if np.array_equal(picks, base_picks):
                    same = "yes"
                elif shared == row.batch:
                    same = "same set, order"
                else:
                    same = f"no ({shared}/{row.batch} shared)"
                gap = f"{100 * (obj - base_obj) / base_obj:+.3f} %"
            print(f"{row.name:16} | {label:22} | {wall:8.2f} | {obj:14.6f} | {same:15} | {gap}", flush=True)


if __name__ == "__main__":
    main()

"""How often float32 BAIT picks what float64 BAIT picks, and the objective gap when it does not.

Runs ``selection.select("bait", ...)`` on random problems in both dtypes and compares the selections
and the exact (float64) objective ``tr(M^-1 F)`` of each chosen set. Prints a table per
configuration (task, classes, lam); the float64 run is the baseline of the same run.

    python bench/float32_agreement.py                # 24 problems per configuration
    python bench/float32_agreement.py --problems 4   # quick
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from selection import select
from selection.bait import design_weights
from selection.fisher import exact_objective


@dataclass(frozen=True)
class Config:
    task: str
    k: int
    lam: float


CONFIGS = [
    Config("classification", 10, 0.01),
    Config("classification", 10, 1.0),
    Config("classification", 2, 0.01),
    Config("regression", 0, 0.01),
    Config("regression", 0, 1.0),
]


def problem(seed: int, n: int, d: int, k: int) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
    """Embeddings with a decaying spectrum, softmax probabilities of a random linear model, 20 labeled rows."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)) * (0.9 ** np.arange(d))
    probs = None
    if k > 0:
        logits = x @ rng.standard_normal((d, k)) * (3.0 / np.sqrt(d))
        e = np.exp(logits - logits.max(1, keepdims=True))
        probs = e / e.sum(1, keepdims=True)
    labeled = rng.choice(n, size=20, replace=False)
    return x, probs, labeled


def set_objective(x: np.ndarray, probs: np.ndarray | None, labeled: np.ndarray, picks: np.ndarray, lam: float) -> float:
    """Exact float64 ``tr(M^-1 F)`` of a chosen set (``reference`` weights), from explicit matrices."""
    w_l, w_s = design_weights("reference", len(labeled), len(picks))
    return exact_objective(
        torch.from_numpy(x),
        None if probs is None else torch.from_numpy(probs),
        torch.from_numpy(np.asarray(labeled, dtype=np.int64)),
        torch.from_numpy(np.asarray(picks, dtype=np.int64)),
        lam=lam,
        w_design=w_l,
        w_picked=w_s,
    )


def run(config: Config, problems: int, n: int, d: int, batch: int) -> dict[str, float]:
    """Float32 against float64 on ``problems`` random problems of one configuration."""
    same = 0
    gaps: list[float] = []
    t32 = t64 = 0.0
    for seed in range(problems):
        x, probs, labeled = problem(seed, n, d, config.k)
        runs = {}
        for dtype in ("float64", "float32"):
            t0 = time.perf_counter()
            runs[dtype] = select(
                "bait",
                embeddings=x,
                probs=probs,
                labeled=labeled,
                batch_size=batch,
                task=config.task,
                dtype=dtype,
                lam=config.lam,
            )
            if dtype == "float64":
                t64 += time.perf_counter() - t0
            else:
                t32 += time.perf_counter() - t0
        r64, r32 = runs["float64"], runs["float32"]
        if r64.indices.tolist() == r32.indices.tolist():
            same += 1
            gaps.append(0.0)
            continue
        o64 = set_objective(x, probs, labeled, r64.indices, config.lam)
        o32 = set_objective(x, probs, labeled, r32.indices, config.lam)
        gaps.append(o32 / o64 - 1.0)
    g = np.asarray(gaps)
    return {
        "same": same,
        "problems": problems,
        "median_gap": float(np.median(g)),
        "max_gap": float(g.max()),
        "min_gap": float(g.min()),
        "t64": t64,
        "t32": t32,
    }


def main(argv: Sequence[str] | None = None) -> list[dict[str, object]]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problems", type=int, default=24, help="random problems per configuration")
    ap.add_argument("--n", type=int, default=600)
    ap.add_argument("--d", type=int, default=16)
    ap.add_argument("--batch", type=int, default=20)
    args = ap.parse_args(argv)
    print(
        f"machine: {platform.node()} | {platform.machine()} | torch {torch.__version__} | "
        f"n={args.n} d={args.d} B={args.batch}, 20 labeled rows, reference convention, oversample 2"
    )
    print("gap = exact float64 tr(M^-1 F) of the float32 choice / that of the float64 choice - 1")
    print()
    head = "| task | k | lam | identical selections | median gap | min gap | max gap | float64 s | float32 s |"
    print(head)
    print("|---|---|---|---|---|---|---|---|---|")
    out: list[dict[str, object]] = []
    for cfg in CONFIGS:
        r = run(cfg, args.problems, args.n, args.d, args.batch)
        k = cfg.k if cfg.k else "-"
        print(
            f"| {cfg.task} | {k} | {cfg.lam:g} | {r['same']}/{r['problems']} | {100 * r['median_gap']:+.3f}% | "
            f"{100 * r['min_gap']:+.3f}% | {100 * r['max_gap']:+.3f}% | {r['t64']:.1f} | {r['t32']:.1f} |"
        )
        out.append({"task": cfg.task, "k": cfg.k, "lam": cfg.lam, **r})
    return out


if __name__ == "__main__":
    main()

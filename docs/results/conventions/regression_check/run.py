"""Side check, not part of experiment 5: four BAIT variants on experiment 3's MNIST MLP regression.

Seeds 0-2, experiment 3's sizes (8,000 pool, 100 initial labels, 20 rounds of 10). Run from the
repository root (the committed results.csv was written by this script into /tmp and copied here):

    PYTHONPATH=. OMP_NUM_THREADS=1 BAIT_THREADS=1 python docs/results/conventions/regression_check/run.py 3

Compared in docs/results/README.md with experiment 3's BAIT at the old default (reference, lam=1),
kept in ../../regression/previous_default_lam1.csv.
"""

import sys
from pathlib import Path

from bench.experiments import regression
from bench.experiments.common import ResultStore, StrategySpec, parse_seeds, run_grid

VARIANTS = [("sum", 1.0), ("reference", 0.01), ("paper", 1.0), ("sum", 0.01)]

if __name__ == "__main__":
    specs = [
        StrategySpec(f"bait-{c}-lam{lam:g}", "bait", {"lam": lam, "convention": c, "oversample": 2})
        for c, lam in VARIANTS
    ]
    sizes = {k: dict(v) for k, v in regression.FULL.items()}
    grid = regression.settings(["mnist-mlp"], sizes)
    store = ResultStore(Path(__file__).resolve().parent)
    run_grid(grid, specs, parse_seeds(sys.argv[1] if len(sys.argv) > 1 else "3"), store, desc="regression_check")

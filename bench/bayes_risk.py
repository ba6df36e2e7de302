"""The paper's Bayesian linear regression experiment (Figure "bayes_risk", Sec. BADGE comparison).

Exact Bayes risk ``sigma^2 tr(Lambda_S^{-1} Sigma)``, ``Lambda_S = sum_{x in S} x x^T + lam sigma^2 I``
(appendix Lemma "bayesRisk"), against the batch size ``B`` for

* ``bait``: ``select("bait", task="regression", convention="sum", lam=lam*sigma^2, fisher_weights=w)``,
  the paper's "Trace+Fisher": it minimises ``tr(Lambda_S^{-1} F)`` with ``F`` the (weighted) pool
  second moment, i.e. the Bayes risk itself up to ``sigma^2``;
* ``logdet``: greedy maximisation of ``log det Lambda_S`` (the paper's "Log-det");
* ``random``: ``B`` i.i.d. draws from the data distribution, as a reference point;
* ``optimum`` (orthonormal case only): the exact minimum over multisets, by dynamic programming.

Two distributions in ``d`` dimensions share ``Sigma = diag(p)``, ``p_i ∝ 1/i^2`` (normalised, so
``tr Sigma = 1`` and the risk of the empty design is ``1/lam``):

(a) Gaussian: a pool of ``n`` draws from ``N(0, Sigma)``; BAIT's ``F`` is the pool mean (no weights),
    the risk uses the population ``Sigma``.
(b) Orthonormal: ``P[x = e_i] = p_i``. The paper's setting has unlimited unlabeled data, so a basis
    vector can be chosen several times: the pool holds ``copies = max(B)`` replicas of each ``e_i``
    with ``fisher_weights = p_i / copies``, so that ``F = Sigma`` exactly. There greedy BAIT is optimal
    (appendix proposition "Optimality of Greedy"), which the ``optimum`` column checks.

Usage::

    python bench/bayes_risk.py              # d = 100, the paper's figure; table + bench/out/bayes_risk.png
    python bench/bayes_risk.py --smoke      # small and fast
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

from selection import select
from selection.logdet import greedy_logdet_kron


def spectrum(d: int) -> np.ndarray:
    """``p_i ∝ 1/i^2``, ``i = 1..d``, normalised to sum to 1: ``(d,)``."""
    p = 1.0 / np.arange(1, d + 1, dtype=np.float64) ** 2
    return p / p.sum()


def gaussian_pool(n: int, p: np.ndarray, seed: int) -> np.ndarray:
    """``n x d`` draws from ``N(0, diag(p))``."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, p.shape[0])) * np.sqrt(p)


def orthonormal_pool(p: np.ndarray, copies: int) -> tuple[np.ndarray, np.ndarray]:
    """``copies`` replicas of each basis vector and weights making their weighted second moment ``diag(p)``.

    Returns:
        ``(d * copies) x d`` rows (``e_1`` x copies, then ``e_2`` ...) and ``(d * copies,)`` weights.
    """
    d = p.shape[0]
    X = np.repeat(np.eye(d), copies, axis=0)
    return X, np.repeat(p / copies, copies)


def bayes_risk(XS: np.ndarray, Sigma: np.ndarray, lam: float, sigma: float) -> float:
    """``sigma^2 tr((XS^T XS + lam sigma^2 I)^{-1} Sigma)`` for a ``B x d`` design ``XS``."""
    d = Sigma.shape[0]
    Lam = XS.T @ XS + lam * sigma**2 * np.eye(d)
    return float(sigma**2 * np.trace(np.linalg.solve(Lam, Sigma)))


def bait_batch(
    X: np.ndarray, B: int, *, ridge: float, weights: np.ndarray | None, oversample: float, seed: int = 0
) -> tuple[np.ndarray, float]:
    """BAIT ("Trace+Fisher") through the public API; returns the rows and its objective ``tr(M^{-1} F)``."""
    res = select(
        "bait",
        embeddings=X,
        task="regression",
        batch_size=B,
        seed=seed,
        convention="sum",
        lam=ridge,
        fisher_weights=weights,
        oversample=oversample,
    )
    assert res.objective is not None
    return res.indices, res.objective


def logdet_order(X: np.ndarray, B: int, *, ridge: float) -> np.ndarray:
    """Greedy ``max log det(ridge I + sum x x^T)`` picks (forward greedy: every prefix is the batch
    for its size). Ties, e.g. replicas, go to the lowest row."""
    Xt = torch.from_numpy(X)
    ones = torch.ones(X.shape[0], 1, dtype=Xt.dtype)
    out = greedy_logdet_kron(ones, Xt, ones[:0], Xt[:0], lam=ridge, steps=B)
    return np.asarray(out.picks, dtype=np.int64)


def orthonormal_optimum(p: np.ndarray, B: int, ridge: float, copies: int | None = None) -> tuple[float, np.ndarray]:
    """Exact ``min sum_i p_i / (n_i + ridge)`` over ``n in N^d``, ``sum n_i <= B``, ``n_i <= copies``.

    Dynamic programming over coordinates: ``V_i(b) = min_{0<=c<=b} p_i/(c + ridge) + V_{i-1}(b - c)``,
    ``O(d B^2)``. With ``ridge = lam sigma^2`` the value times ``sigma^2`` is the optimal Bayes risk.

    Returns:
        The optimal value and one optimal allocation ``n`` (``(d,)`` int64).
    """
    d = p.shape[0]
    cap = B if copies is None else min(B, copies)
    c = np.arange(B + 1)
    V = np.zeros(B + 1)  # V_0(b) = 0: no coordinates yet
    choice = np.zeros((d, B + 1), dtype=np.int64)
    for i in range(d):
        cost = np.where(c <= cap, p[i] / (c + ridge), np.inf)  # (B+1,) cost of c copies of e_i
        # table[b, c] = cost[c] + V[b - c] for c <= b
        table = cost[None, :] + np.where(c[None, :] <= c[:, None], V[np.clip(c[:, None] - c[None, :], 0, B)], np.inf)
        choice[i] = np.argmin(table, axis=1)
        V = table[c, choice[i]]
    n = np.zeros(d, dtype=np.int64)
    b = int(np.argmin(V))  # sum n_i <= B
    for i in range(d - 1, -1, -1):
        n[i] = choice[i, b]
        b -= int(n[i])
    return float(V.min()), n


@dataclass
class Row:
    case: str
    B: int
    bait: float
    logdet: float
    random: float
    optimum: float | None
    bait_objective: float


def run_case(
    case: str, *, d: int, n: int, batch_sizes: list[int], lam: float, sigma: float, seed: int, oversample: float
) -> list[Row]:
    """Risks of every method at every batch size for ``case`` in ``{"gaussian", "orthonormal"}``."""
    p = spectrum(d)
    Sigma = np.diag(p)
    ridge = lam * sigma**2
    copies = max(batch_sizes)
    if case == "gaussian":
        X, weights = gaussian_pool(n, p, seed), None
    else:
        X, weights = orthonormal_pool(p, copies)
    ld = logdet_order(X, max(batch_sizes), ridge=ridge)
    rng = np.random.default_rng(seed + 1)
    if case == "gaussian":  # pool rows are i.i.d. already
        iid = rng.permutation(X.shape[0])
    else:  # i ~ p, the j-th draw of e_i takes its j-th replica
        coords = rng.choice(d, size=copies, p=p)
        iid = np.array([i * copies + int((coords[:t] == i).sum()) for t, i in enumerate(coords)])
    rows = []
    for B in batch_sizes:
        picks, objective = bait_batch(X, B, ridge=ridge, weights=weights, oversample=oversample, seed=seed)
        opt = None
        if case == "orthonormal":
            opt = sigma**2 * orthonormal_optimum(p, B, ridge, copies)[0]
        rows.append(
            Row(
                case=case,
                B=B,
                bait=bayes_risk(X[picks], Sigma, lam, sigma),
                logdet=bayes_risk(X[ld[:B]], Sigma, lam, sigma),
                random=bayes_risk(X[iid[:B]], Sigma, lam, sigma),
                optimum=opt,
                bait_objective=sigma**2 * objective,
            )
        )
    return rows


def format_table(rows: list[Row]) -> str:
    head = f"{'case':<12} {'B':>5} {'BAIT':>10} {'Log-det':>10} {'random':>10} {'optimum':>10} {'logdet/BAIT':>12}"
    lines = [head, "-" * len(head)]
    for r in rows:
        opt = "-" if r.optimum is None else f"{r.optimum:.5f}"
        lines.append(
            f"{r.case:<12} {r.B:>5} {r.bait:>10.5f} {r.logdet:>10.5f} {r.random:>10.5f} {opt:>10} "
            f"{r.logdet / r.bait:>12.3f}"
        )
    return "\n".join(lines)


def plot(rows: list[Row], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    for ax, case in zip(axes, ("gaussian", "orthonormal"), strict=True):
        rs = [r for r in rows if r.case == case]
        Bs = [r.B for r in rs]
        ax.plot(Bs, [r.bait for r in rs], "o-", label="Trace+Fisher (BAIT)")
        ax.plot(Bs, [r.logdet for r in rs], "s--", label="Log-det")
        ax.plot(Bs, [r.random for r in rs], ":", color="gray", label="random")
        if case == "orthonormal":
            ax.plot(Bs, [r.optimum for r in rs], "k+", markersize=10, label="optimum (DP)")
        ax.set_yscale("log")
        ax.set_xlabel("batch size B")
        ax.set_ylabel("Bayes risk")
        ax.set_title(
            "Gaussian, $\\Sigma_{ii} \\propto 1/i^2$" if case == "gaussian" else "orthonormal, $P[e_i] \\propto 1/i^2$"
        )
        ax.legend()
    fig.suptitle(title)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--d", type=int, default=100, help="dimension (paper: 100)")
    ap.add_argument("--n", type=int, default=2000, help="Gaussian pool size")
    ap.add_argument("--batch-sizes", type=str, default="10,25,50,75,100,150,200")
    ap.add_argument("--lam", type=float, default=1.0, help="prior precision lambda (ridge = lam * sigma^2)")
    ap.add_argument("--sigma", type=float, default=1.0, help="noise standard deviation")
    ap.add_argument("--oversample", type=float, default=2.0, help="BAIT oversampling (1 = forward greedy only)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "out")
    ap.add_argument("--smoke", action="store_true", help="d=20, n=300, B in 5,10,20,40: seconds")
    args = ap.parse_args(argv)
    if args.smoke:
        args.d, args.n, args.batch_sizes = 20, 300, "5,10,20,40"
    batch_sizes = sorted({int(b) for b in args.batch_sizes.split(",")})

    print("Bayesian linear regression: exact Bayes risk sigma^2 tr(Lambda_S^-1 Sigma), Sigma_ii ∝ 1/i^2")
    print(
        f"inputs: d={args.d} n_gaussian={args.n} batch_sizes={batch_sizes} lam={args.lam} sigma={args.sigma} "
        f"oversample={args.oversample} seed={args.seed}"
    )
    print(
        f"machine: {platform.platform()} python {platform.python_version()} torch {torch.__version__} "
        f"threads={torch.get_num_threads()} OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}"
    )
    t0 = time.perf_counter()
    rows: list[Row] = []
    for case in ("gaussian", "orthonormal"):
        rows += run_case(
            case, d=args.d, n=args.n, batch_sizes=batch_sizes, lam=args.lam, sigma=args.sigma,
            seed=args.seed, oversample=args.oversample,
        )  # fmt: skip
    print(format_table(rows))
    worst = max(abs(r.bait_objective - r.bait) / r.bait for r in rows if r.case == "orthonormal")
    print(f"check: BAIT objective * sigma^2 vs recomputed risk (orthonormal, F = Sigma): max rel. diff {worst:.2e}")
    ortho = [r for r in rows if r.optimum is not None]
    gap = max((r.bait - r.optimum) / r.optimum for r in ortho if r.optimum is not None)
    print(f"check: orthonormal BAIT vs DP optimum: max rel. excess {gap:.2e}")
    args.out.mkdir(parents=True, exist_ok=True)
    png = args.out / ("bayes_risk_smoke.png" if args.smoke else "bayes_risk.png")
    plot(rows, png, f"Bayesian linear regression, d={args.d}, lam={args.lam}, sigma={args.sigma}")
    print(f"plot: {png}   ({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

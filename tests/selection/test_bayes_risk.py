"""The paper's Bayesian linear regression claims, on a small instance, through the real library.

* Gaussian data: BAIT ("Trace+Fisher") and greedy log-det reach almost the same Bayes risk.
* Orthonormal data: BAIT is clearly better, log-det cycles through the coordinates, and greedy BAIT
  equals the exact optimum (appendix proposition "Optimality of Greedy"), computed by DP.
"""

from __future__ import annotations

import importlib.util
import itertools
import sys
from pathlib import Path

import numpy as np
import pytest

_PATH = Path(__file__).resolve().parents[2] / "bench" / "bayes_risk.py"
_spec = importlib.util.spec_from_file_location("bench_bayes_risk", _PATH)
assert _spec is not None and _spec.loader is not None
br = importlib.util.module_from_spec(_spec)
sys.modules["bench_bayes_risk"] = br
_spec.loader.exec_module(br)

D = 12
BATCHES = [3, 6, 12, 18, 24]


def brute_force_optimum(p, B, ridge, copies):
    best = np.inf
    for n in itertools.product(range(min(B, copies) + 1), repeat=p.shape[0]):
        if sum(n) <= B:
            best = min(best, float(np.sum(p / (np.array(n) + ridge))))
    return best


@pytest.mark.parametrize(("B", "ridge", "copies"), [(0, 1.0, 5), (1, 0.5, 5), (4, 0.1, 5), (6, 2.0, 6), (7, 0.3, 2)])
def test_dp_optimum_matches_enumeration(B, ridge, copies):
    p = br.spectrum(4)
    value, n = br.orthonormal_optimum(p, B, ridge, copies)
    assert value == pytest.approx(brute_force_optimum(p, B, ridge, copies), rel=1e-12)
    assert n.sum() <= B and n.max(initial=0) <= copies
    assert value == pytest.approx(float(np.sum(p / (n + ridge))), rel=1e-12)


def test_bayes_risk_formula_matches_monte_carlo():
    # Lemma: E ||theta_MAP - theta*||_Sigma^2 = sigma^2 tr((X^T X + lam sigma^2 I)^-1 Sigma).
    rng = np.random.default_rng(0)
    d, m, lam, sigma, draws = 4, 6, 2.0, 0.7, 200_000
    XS = rng.normal(size=(m, d))
    Sigma = np.diag(br.spectrum(d))
    theta = rng.normal(size=(draws, d)) / np.sqrt(lam)
    y = theta @ XS.T + sigma * rng.normal(size=(draws, m))
    Lam = XS.T @ XS + lam * sigma**2 * np.eye(d)
    theta_hat = np.linalg.solve(Lam, XS.T @ y.T).T  # ridge regression = MAP
    err = theta_hat - theta
    mc = np.mean(np.einsum("ij,jk,ik->i", err, Sigma, err))
    assert mc == pytest.approx(br.bayes_risk(XS, Sigma, lam, sigma), rel=0.01)


@pytest.mark.parametrize(("lam", "sigma"), [(1.0, 1.0), (0.5, 2.0)])
def test_greedy_bait_equals_dp_optimum_in_orthonormal_case(lam, sigma):
    p = br.spectrum(D)
    copies = max(BATCHES)
    X, w = br.orthonormal_pool(p, copies)
    ridge = lam * sigma**2
    for B in BATCHES:
        picks, objective = br.bait_batch(X, B, ridge=ridge, weights=w, oversample=1)
        risk = br.bayes_risk(X[picks], np.diag(p), lam, sigma)
        optimum, _ = br.orthonormal_optimum(p, B, ridge, copies)
        assert risk == pytest.approx(sigma**2 * optimum, rel=1e-10)
        assert sigma**2 * objective == pytest.approx(risk, rel=1e-10)  # BAIT's objective is the Bayes risk


def test_forward_backward_bait_also_reaches_the_optimum_in_orthonormal_case():
    p = br.spectrum(D)
    X, w = br.orthonormal_pool(p, 2 * max(BATCHES))
    for B in BATCHES:
        picks, _ = br.bait_batch(X, B, ridge=1.0, weights=w, oversample=2)
        optimum, _ = br.orthonormal_optimum(p, B, 1.0)
        assert br.bayes_risk(X[picks], np.diag(p), 1.0, 1.0) == pytest.approx(optimum, rel=1e-10)


def test_logdet_cycles_through_coordinates_in_orthonormal_case():
    p = br.spectrum(D)
    X, _ = br.orthonormal_pool(p, 3)
    coords = X[br.logdet_order(X, 3 * D, ridge=1.0)].argmax(axis=1)
    np.testing.assert_array_equal(coords, np.tile(np.arange(D), 3))


def test_bait_clearly_better_than_logdet_in_orthonormal_case():
    rows = br.run_case("orthonormal", d=D, n=0, batch_sizes=BATCHES, lam=1.0, sigma=1.0, seed=0, oversample=2)
    for r in rows:
        assert r.bait <= r.logdet * (1 + 1e-12)
        if r.B >= D // 2:
            assert r.logdet >= 1.3 * r.bait, r
        if r.B >= D:
            assert r.logdet >= 1.5 * r.bait, r


def test_bait_and_logdet_close_in_gaussian_case():
    rows = br.run_case("gaussian", d=D, n=400, batch_sizes=BATCHES, lam=1.0, sigma=1.0, seed=0, oversample=2)
    for r in rows:
        assert abs(r.logdet - r.bait) <= 0.05 * r.bait, r  # measured: within 3.5% over seeds 0-3
        assert r.bait < 0.8 * r.random, r  # both far from random: "close" is not "equally bad"


def test_smoke_run_prints_table_and_writes_png(tmp_path, capsys):
    assert br.main(["--smoke", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "orthonormal" in out and "gaussian" in out and "Log-det" in out
    png = tmp_path / "bayes_risk_smoke.png"
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

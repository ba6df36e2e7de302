"""Exact BAIT (forward greedy + backward pruning) without the ``n x dk x k`` tensor, and its variants.

Implements exact fast BAIT as derived in docs/algorithm.md: per-candidate ``r x r`` matrices ``g_x = V_x^T P V_x`` and
``h_x = V_x^T Q V_x`` (``P = M^{-1}``, ``Q = P F P``) formed from ``d x d`` blocks, kept current by
symmetric square-root rank-``r`` updates with one pool GEMM per greedy step.

Conventions (pinned by tests/selection/test_bait.py):

* The last layer ``W`` is ``k x d``, vectorised class-major (index ``c * d + j``).
  ``I(x) = (diag p - p p^T) ⊗ x x^T = V_x V_x^T`` with column ``c`` of ``V_x`` equal to
  ``sqrt(p_c) (e_c - p) ⊗ x``. Regression (one output, squared loss): ``I(x) = x x^T``.
* ``F`` is the mean of ``I(x)`` over **all** ``n`` pool rows (or the ``fisher_weights``-weighted
  mean); ``bait_nofisher`` uses ``F = I``.
* ``n_L`` = number of labeled + reserved rows (:attr:`Problem.in_design`), ``B`` = batch size.
  ``M = lam I + w_L sum_{labeled+reserved} I(x) + w_S sum_{picked} I(x)`` with
  ``convention="reference"`` (the authors' code, default): ``w_L = 1/(n_L+B)``, ``w_S = B/(n_L+B)``;
  ``"paper"``: ``w_L = 1/n_L`` (0 if ``n_L = 0``), ``w_S = 1``; ``"sum"``: ``w_L = w_S = 1``.
* Forward: ``min(oversample * B, n_C)`` picks without repeats, each maximising
  ``tr(h_x (I + g_x)^{-1})`` with ``V_x`` scaled by ``sqrt(w_S)``; backward: while more than ``B``
  remain, remove the pick whose removal raises ``tr(M^{-1} F)`` least, ``tr(h_s (I - g_s)^{-1})``.
* Ties go to the lowest pool row index. Scores within ``rtol * max|score|`` of the best count as
  tied (``rtol = 1e-10`` for float64 state, ``1e-5`` for float32), so rows that are exact duplicates
  tie regardless of summation order. NaN scores lose (``-inf`` forward, ``+inf`` backward).
* The returned indices are the kept picks in forward order. ``objective`` is ``tr(M^{-1} F)`` of
  the final set in the full ``k d`` parameter space.

Work is done in the reduced class space (softmax null direction dropped, ``r = k - 1``,
``D = r d``; regression and binary classification become rank-one problems). The ``D x D`` matrices
``P`` and ``Q`` and the backward pass are float64 whenever they fit ``max_memory_gb``; pool-sized
GEMMs and the per-candidate state run in the dtype of ``problem.X``.

Planning (:mod:`selection.bait.plan`): ``approx=None`` ("auto") runs exact BAIT whenever a
cost model with this machine's measured rates says it fits ``time_budget_s`` and ``max_memory_gb``;
otherwise the plan of smallest estimated gap that fits, built from candidate pre-filtering, the
Fisher-weighted PCA projection, a class approximation of each candidate's Fisher (top-``c``, or
top-``c`` plus sampled pseudo-labels from the rest) and forward-only picking; a guard
(:class:`selection.bait.engine._Guard`) stops the greedy passes so the call returns within 1.5x ``time_budget_s``
(docs/algorithm-many-classes.md). ``approx="exact"`` forces exact. The plan, its reason and its estimate are
``diagnostics["approximation"]``; the objective reported for an approximate or pre-filtered run is
the exact one of its set whenever that fits the budgets (``diagnostics["objective_kind"]``).

The package, the way its parts depend on each other (each imports only those above it):

* :mod:`selection.bait.threads`: the worker threads (how many, the pool, per-thread buffers);
* :mod:`selection.bait.approx`: top-``c``/sampled class factors and candidate pre-filtering;
* :mod:`selection.bait.engine`: the state, setup, greedy forward and backward steps, Woodbury updates;
* :mod:`selection.bait.plan`: the cost model, the budgets and the choice of plan;
* :mod:`selection.bait.driver`: the strategies :func:`bait`, :func:`bait_nofisher`, :func:`logdet_fisher`.
"""

from selection.bait.driver import CONVENTIONS, DEFAULT_LAM, bait, bait_nofisher, design_weights, logdet_fisher
from selection.bait.plan import APPROX_CHOICES, APPROXIMATIONS, DEFAULT_TIME_BUDGET_S, estimate_bytes
from selection.bait.threads import resolve_threads

__all__ = [
    "APPROXIMATIONS",
    "APPROX_CHOICES",
    "CONVENTIONS",
    "DEFAULT_LAM",
    "DEFAULT_TIME_BUDGET_S",
    "bait",
    "bait_nofisher",
    "design_weights",
    "estimate_bytes",
    "logdet_fisher",
    "resolve_threads",
]

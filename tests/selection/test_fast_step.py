"""The greedy step's chunking against the naive reference (tests/selection/naive_bait.py), float64.

The step processes candidates in chunks; a chunk of one row once aliased ``g`` in the batched score
(a "batch-last" copy of a 1-row chunk was a view), so the last candidate's state drifted and the
picks left the naive ones. These cases put one row (or a few) in the last chunk.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from selection.bait import bait
from selection.linalg import batch_last, trace_solve_scores
from tests.selection.naive_bait import naive_bait
from tests.selection.test_bait import Case, make_data, make_problem


@pytest.mark.parametrize("k", [3, 5, 10])
@pytest.mark.parametrize("tail", [1, 2])
def test_last_chunk_with_few_rows_matches_naive(k: int, tail: int) -> None:
    # Step chunks hold at least 64 rows: 128 + tail candidates leave a last chunk of `tail` rows.
    n_labeled = 6
    case = Case(seed=40 + k + tail, n=128 + tail + n_labeled, d=4, k=k, batch=8, n_labeled=n_labeled, lam=0.05)
    data = make_data(case)
    problem = make_problem(data, case.batch, chunk_size=64)
    assert (int(problem.candidates.numel()) - tail) % 64 == 0
    out = bait(problem, lam=case.lam, convention=case.convention)
    ref = naive_bait(data.x, data.probs, data.labeled, data.reserved, case.batch, lam=case.lam)
    assert out.diagnostics["forward_indices"] == ref.forward
    assert out.indices.tolist() == ref.indices
    assert out.objective == pytest.approx(ref.objective, rel=1e-8)


def test_last_candidate_can_be_picked_when_alone_in_its_chunk() -> None:
    # The single row of the last chunk is the best candidate at the first step: its score must be right.
    case = Case(seed=7, n=135, d=4, k=4, batch=3, n_labeled=6, lam=0.05)
    data = make_data(case)
    x = data.x.copy()
    x[-1] *= 6.0  # the last row dominates the first gain
    data.x = x
    problem = make_problem(data, case.batch, chunk_size=64)
    assert int(problem.candidates.numel()) % 64 == 1
    out = bait(problem, lam=case.lam)
    ref = naive_bait(data.x, data.probs, data.labeled, data.reserved, case.batch, lam=case.lam)
    assert out.diagnostics["forward_indices"] == ref.forward
    assert out.indices.tolist() == ref.indices


@pytest.mark.parametrize("m", [1, 2, 7])
def test_batched_scores_leave_inputs_unchanged(m: int) -> None:
    rng = np.random.default_rng(m)
    f = torch.tensor(rng.normal(size=(m, 4, 6)))
    g = f @ f.transpose(1, 2) * 0.1
    h = torch.tensor(rng.normal(size=(m, 4, 4)))
    h = h @ h.transpose(1, 2)
    g0, h0 = g.clone(), h.clone()
    for half_h in (False, True):
        trace_solve_scores(g, h, 1.0, half_h=half_h)
        assert torch.equal(g, g0) and torch.equal(h, h0)
    out = batch_last(g)
    out.add_(1.0)
    assert torch.equal(g, g0)

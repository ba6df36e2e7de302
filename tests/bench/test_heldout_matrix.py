"""The held-out penalty matrix (issue 14) at smoke size: baselines on the synthetic stand-ins of
``heldout --smoke``, read beside BAIT and random from the held-out store, never rerunning those."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.experiments import heldout, heldout_matrix
from bench.experiments.common import read_results


def test_baselines_and_matrix_from_the_heldout_rows(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(SystemExit, match=r"run `python -m bench\.experiments\.heldout --phase heldout` first"):
        heldout_matrix.main(["--smoke", "--out", str(out), "--quiet"])
    (out / "choice.json").write_text(json.dumps({"choice": dict.fromkeys(heldout.TASK_TYPES, 0.01)}))
    heldout.main(["--smoke", "--phase", "heldout", "--out", str(out), "--quiet"])
    held_before = (out / "heldout" / "results.csv").read_text()

    path = heldout_matrix.main(["--smoke", "--out", str(out), "--quiet"])

    assert (out / "heldout" / "results.csv").read_text() == held_before  # BAIT and random are not rerun
    base = read_results(out / heldout_matrix.STORE / "results.csv")
    held = read_results(out / "heldout" / "results.csv")
    for ds, tt in heldout.SYNTHETIC.items():
        want = {"coreset", "kmeanspp"} if tt == "regression" else {"badge", "margin", "coreset", "typiclust"}
        ran = {r["strategy"] for r in base if r["config"] == ds}
        assert ran == want, (ds, ran)
        # the same initial labels and head seed as the held-out rows: every round-0 score equals random's there
        held0 = [r["value"] for r in held if r["config"] == ds and r["seed"] == 0 and r["round"] == 0]
        r0 = {r["strategy"]: r["value"] for r in base if r["config"] == ds and r["seed"] == 0 and r["round"] == 0}
        assert set(r0) == want and set(r0.values()) == set(held0), (r0, held0)
    assert len(base) == 2 * 3 * (4 + 4 + 2)  # seeds x rounds 0..2 x strategies per dataset

    text = path.read_text()
    assert text.count("| **column mean** |") == 2  # paper budgets and every round
    header = "| beats \\ beaten | " + " | ".join(heldout_matrix.ORDER) + " |"
    assert header in text
    assert "BAIT's column mean:" in text and "|t| threshold 12.706 (2 paired seeds)" in text
    assert "synthetic-regression: 15, 20" in text
    runs = [json.loads(x) for x in (out / "runs.jsonl").read_text().splitlines()]
    assert [r["phase"] for r in runs] == ["heldout", "baselines"]

    # --phase report rebuilds the same file from the stored rows alone
    path.unlink()
    heldout_matrix.main(["--smoke", "--out", str(out), "--phase", "report"])
    assert path.read_text() == text

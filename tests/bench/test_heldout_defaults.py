"""The service's BAIT defaults are the ones the held-out experiment chose on the tune half (issue 14)."""

from __future__ import annotations

import json
from pathlib import Path

import selection
from service.domain import strategies

CHOICE = Path(__file__).resolve().parents[2] / strategies.DEFAULTS_EVIDENCE / "choice.json"


def test_catalog_defaults_are_the_tune_half_choice() -> None:
    choice = json.loads(CHOICE.read_text())
    lam = strategies.CATALOG["bait"].params["lam"].default
    # One default for every task type: the rule GET /v1/strategies states.
    assert set(choice["choice"]) == {"binary", "multiclass", "regression"}
    assert set(choice["choice"].values()) == {lam}, choice["choice"]
    assert choice["default_lam"] == lam
    assert choice["convention"] == strategies.CATALOG["bait"].params["convention"].default
    # ... and the library's own defaults are the same values.
    assert lam == selection.bait.DEFAULT_LAM


def test_defaults_doc_reads_the_catalog() -> None:
    doc = strategies.defaults_doc()["bait"]
    params = strategies.CATALOG["bait"].params
    assert (doc["lam"], doc["convention"], doc["oversample"]) == (
        params["lam"].default,
        params["convention"].default,
        params["oversample"].default,
    )
    assert (Path(__file__).resolve().parents[2] / doc["evidence"] / "README.md").is_file()

"""The web process's torch-free strategy catalog matches the selection registry exactly."""

from __future__ import annotations

import inspect
import re

import pytest

import selection
from selection.problem import REGISTRY
from service.domain import strategies
from service.errors import BadRequest


def _annotation(p: inspect.Parameter) -> str:
    a = p.annotation
    return a if isinstance(a, str) else getattr(a, "__name__", str(a))


def _signature_params(name: str) -> dict[str, tuple[str, object]]:
    fn = REGISTRY[name].fn
    params = inspect.signature(fn).parameters.values()
    return {p.name: (_annotation(p), p.default) for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}


def test_catalog_names_match_selection_registry() -> None:
    assert sorted(strategies.CATALOG) == sorted(selection.STRATEGIES)


@pytest.mark.parametrize("name", sorted(selection.STRATEGIES))
def test_catalog_entry_matches_strategy_signature(name: str) -> None:
    spec = strategies.CATALOG[name]
    info = selection.STRATEGIES[name]
    assert spec.tasks == info.tasks
    assert spec.summary == info.summary
    assert tuple(sorted(spec.inputs)) == info.inputs
    expected = _signature_params(name)
    got = {k: (p.annotation, p.default) for k, p in spec.params.items()}
    assert got == expected
    for k, (_, default) in expected.items():  # same type of default too (2 vs 2.0 would pass ==)
        assert type(spec.params[k].default) is type(default)


def test_check_request_accepts_defaults_of_every_strategy() -> None:
    for name, spec in strategies.CATALOG.items():
        params = {k: p.default for k, p in spec.params.items() if k not in strategies.ARRAY_PARAMS}
        for task in spec.tasks:
            strategies.check_request(name, task, params)


def test_check_request_names_valid_choices() -> None:
    with pytest.raises(BadRequest, match=r"valid strategies: .*bait.*random"):
        strategies.check_request("fancy", "classification", {})
    with pytest.raises(
        BadRequest, match=r"strategies for regression: auto, bait, bait_nofisher, coreset, kmeanspp, random, typiclust$"
    ):
        strategies.check_request("margin", "regression", {})
    with pytest.raises(BadRequest, match=r"valid parameters: .*oversample.*seed"):
        strategies.check_request("bait", "classification", {"oversampel": 2})
    with pytest.raises(BadRequest, match="'lam' of strategy 'bait' must be float"):
        strategies.check_request("bait", "classification", {"lam": "big"})
    with pytest.raises(BadRequest, match=re.escape("'approx_dim' of strategy 'bait' must be int | None, got 2.5")):
        strategies.check_request("bait", "classification", {"approx_dim": 2.5})
    with pytest.raises(BadRequest, match="per-row arrays"):
        strategies.check_request("bait", "classification", {"fisher_weights": [1.0]})


def test_auto_arms_and_round_keys_match_the_library() -> None:
    from selection import auto

    assert set(strategies.AUTO_ARMS) == set(auto.ALL_ARMS)
    assert set(strategies.AUTO_ROUND_KEYS) == set(auto.ROUND_KEYS)

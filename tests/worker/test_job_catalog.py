"""One catalog of job paths (service/catalog.py): every job path resolves to a callable defined where the
path says, every child-process module imports and runs as ``__main__``, and no other module of service/,
worker/ or bait/ writes a job path of its own."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest

from service import catalog
from service.queue import resolve

ROOT = Path(__file__).resolve().parents[2]
JOB_PATH = re.compile(r"^worker(\.[a-z_][a-z0-9_]*)+$")


@pytest.mark.parametrize("path", catalog.JOBS)
def test_every_job_path_resolves_to_a_callable_defined_there(path: str) -> None:
    fn = resolve(path)
    assert callable(fn)
    module, _, name = path.rpartition(".")
    assert (fn.__module__, fn.__name__) == (module, name), f"{path} is a re-export of {fn.__module__}.{fn.__name__}"


@pytest.mark.parametrize("module", catalog.CHILD_MODULES)
def test_every_child_module_imports_and_runs_as_main(module: str) -> None:
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, module
    assert 'if __name__ == "__main__":' in Path(spec.origin).read_text(), f"{module} cannot run with python -m"


def test_each_path_is_listed_once() -> None:
    paths = [*catalog.JOBS, *catalog.CHILD_MODULES]
    assert len(paths) == len(set(paths))


def _strings_outside_docstrings(tree: ast.AST) -> list[ast.Constant]:
    docstrings: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                docstrings.add(id(value))
    return [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
    ]


def test_no_module_writes_a_job_path_of_its_own() -> None:
    found = []
    for package in ("service", "worker", "bait"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if rel == "service/catalog.py":
                continue
            for node in _strings_outside_docstrings(ast.parse(path.read_text())):
                if JOB_PATH.match(node.value):
                    found.append(f"{rel}:{node.lineno}: {node.value!r}")
    assert not found, "job paths belong in service/catalog.py:\n" + "\n".join(found)

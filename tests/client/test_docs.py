"""docs/client.md: every fenced Python example runs, in order, against a live service (one namespace, as
a reader would paste them into one session)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.client.conftest import LiveFactory
from tests.fake_labelstudio import fake_labelstudio

pytestmark = pytest.mark.slow

DOC = Path(__file__).resolve().parents[2] / "docs" / "client.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def test_every_python_example_of_the_client_docs_runs(
    live_service: LiveFactory, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    blocks = python_blocks(DOC.read_text())
    assert len(blocks) >= 10, "the page lost its examples"
    monkeypatch.chdir(tmp_path)  # examples write files (a Parquet file) where they run
    with fake_labelstudio() as ls, live_service(outbound_allow="127.0.0.1") as live:
        monkeypatch.setenv("BAIT_URL", live.url)
        monkeypatch.setenv("BAIT_API_KEY", live.key)
        monkeypatch.setenv("HOOK_URL", "http://127.0.0.1:9/hook")
        monkeypatch.setenv("LABEL_STUDIO_URL", ls.url)
        monkeypatch.setenv("LABEL_STUDIO_TOKEN", ls.token)
        namespace: dict[str, Any] = {"__name__": "docs_client"}
        for number, block in enumerate(blocks, 1):
            try:
                exec(compile(block, f"docs/client.md block {number}", "exec"), namespace)
            except Exception as exc:
                raise AssertionError(f"example {number} of docs/client.md failed:\n{block}") from exc
    assert namespace["result"].created == 5_000 and len(namespace["picked"].indices) == 5
    assert namespace["studio"].ml_backend_url and namespace["rotated"].secret != namespace["studio"].secret

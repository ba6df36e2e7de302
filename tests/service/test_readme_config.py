"""The README's configuration table lists every setting with its default and its description (the
``Field(description=...)`` of service.config.Settings), so the two cannot drift apart."""

from __future__ import annotations

import re
from typing import Any

from service.config import Settings
from tests.conftest import REPO

ROW = re.compile(r"^\| `BAIT_(\w+)` \| `([^`]*)` \| (.*) \|$")


def shown_default(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, int) and not isinstance(value, bool) and value >= 2**20 and value % 2**20 == 0:
        return f"{value} ({value // 2**20} MiB)"
    return str(value)


def table() -> dict[str, tuple[str, str]]:
    text = (REPO / "README.md").read_text()
    section = text.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    return {m.group(1).lower(): (m.group(2), m.group(3)) for m in map(ROW.match, section.splitlines()) if m}


def test_every_setting_is_in_the_readme_table_with_its_default_and_description() -> None:
    rows = table()
    expected = {
        name: (shown_default(field.default), field.description or "") for name, field in Settings.model_fields.items()
    }
    missing = sorted(set(expected) - set(rows))
    assert not missing, f"settings missing from the README's configuration table: {missing}"
    assert not sorted(set(rows) - set(expected)), "the README lists settings that do not exist"
    wrong = {name: (rows[name], want) for name, want in expected.items() if rows[name] != want}
    assert not wrong, wrong

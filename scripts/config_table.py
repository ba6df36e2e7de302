"""Rewrite the README's configuration table from service.config.Settings (names, defaults, descriptions).

    .venv/bin/python scripts/config_table.py        # rewrites README.md in place
tests/service/test_readme_config.py checks the two agree.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from service.config import Settings
from tests.service.test_readme_config import shown_default

README = Path(__file__).resolve().parents[1] / "README.md"
HEADER = "| variable | default | meaning |\n|---|---|---|\n"


def table() -> str:
    rows = [
        f"| `BAIT_{name.upper()}` | `{shown_default(field.default)}` | {field.description or ''} |"
        for name, field in Settings.model_fields.items()
    ]
    return HEADER + "\n".join(rows) + "\n"


def main() -> None:
    text = README.read_text()
    head, rest = text.split("## Configuration", 1)
    section, tail = rest.split("\n## ", 1)
    new_section = re.sub(r"\| variable \| default \| meaning \|\n\|---\|---\|---\|\n(?:\|.*\|\n)+", table(), section)
    README.write_text(head + "## Configuration" + new_section + "\n## " + tail)


if __name__ == "__main__":
    main()

"""docs/configuration.md is generated from service.config.Settings (``python -m service.config_doc``): the
committed page must be exactly what the generator writes, so a setting added, renamed, re-defaulted or
re-described without regenerating the page fails here."""

from __future__ import annotations

from pathlib import Path

import pytest

from service import config_doc
from service.config import Settings
from tests.conftest import REPO


def test_committed_configuration_page_is_the_generated_one() -> None:
    page = REPO / "docs" / "configuration.md"
    assert page.read_text() == config_doc.render(), (
        "docs/configuration.md differs from service/config.py: run `python -m service.config_doc`"
    )


def test_every_setting_has_a_row_with_its_default_and_description() -> None:
    lines = [line for line in config_doc.render().splitlines() if line.startswith("| `BAIT_")]
    rows = {line.split(" | ")[0].strip("| `"): line for line in lines}
    assert sorted(rows) == sorted(f"BAIT_{name.upper()}" for name in Settings.model_fields)
    port = rows["BAIT_PORT"]
    assert "`8000`" in port and "port `bait serve` listens on" in port
    assert "`unset`" in rows["BAIT_REDIS_URL"]
    assert "`67108864 (64 MiB)`" in rows["BAIT_MAX_JSON_BYTES"]
    assert "`{}`" in rows["BAIT_TENANT_DATA_ROOTS"]  # a default_factory, shown by its value
    # Outside code spans <...> would be swallowed as an HTML tag; inside one it must stay as written.
    assert "&lt;tenant name&gt;" in rows["BAIT_TENANT_DATA_ROOTS"]
    assert "`Authorization: Bearer <token>`" in rows["BAIT_METRICS_TOKEN"]


def test_check_mode_reports_a_stale_page_and_the_writer_fixes_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "configuration.md"
    page.write_text(config_doc.render().replace("`BAIT_PORT` | `8000`", "`BAIT_PORT` | `8080`"))
    assert config_doc.main(["--check", "--output", str(page)]) == 1
    assert "run `python -m service.config_doc`" in capsys.readouterr().err
    assert config_doc.main(["--output", str(page)]) == 0
    assert config_doc.main(["--check", "--output", str(page)]) == 0
    assert page.read_text() == config_doc.render()


def test_writer_refuses_a_missing_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert config_doc.main(["--output", str(tmp_path / "nowhere" / "configuration.md")]) == 2
    assert "run from the repository root or pass --output" in capsys.readouterr().err

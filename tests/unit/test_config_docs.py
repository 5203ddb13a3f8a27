"""docs/configuration.md cannot drift from the configuration object: every key of every
section is documented under its section, with its default, and nothing documented is
unknown to the code."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from dispatcher import config

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
SECTIONS = {
    "database": config.DatabaseConfig,
    "dispatcher": config.DispatcherConfig,
    "metrics": config.MetricsConfig,
    "retention": config.RetentionConfig,
    "artifacts": config.ArtifactsConfig,
    "protection": config.ProtectionConfig,
    "tracing": config.TracingConfig,
}


def _documented(section: str) -> dict[str, str]:
    text = DOC.read_text()
    match = re.search(rf"^## `\[{section}\]`\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match, f"docs/configuration.md has no section [{section}]"
    rows = re.findall(r"^\| `([a-z_]+)` \| ([^|]*) \|", match.group(1), re.M)
    return {key: default.strip() for key, default in rows}


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_every_key_is_documented_with_its_default(section: str) -> None:
    documented = _documented(section)
    fields = {f.name: f for f in dataclasses.fields(SECTIONS[section])}
    assert set(documented) == set(fields), f"[{section}] keys differ from the code"
    for name, f in fields.items():
        default = f.default
        if default is None or default is dataclasses.MISSING:
            continue
        shown = documented[name].replace("`", "").replace('"', "")
        forms = {str(default), str(default).lower()}
        if isinstance(default, int | float) and not isinstance(default, bool):
            forms.add(str(float(default)))
        assert shown in forms, (
            f"[{section}] {name}: documented default {documented[name]!r}, code {default!r}"
        )

"""The console's Jinja2 environment: autoescaping everywhere, undefined names are errors,
and a few filters for times, ages and links. Templates are files next to this package
(``dispatcher/console/templates``: package data)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2

from outbox.recovery import jsonable


def age(seconds: float | None) -> str:
    """``3 d 4 h``, ``5 m 2 s``, ``0.4 s``: a human age (``-`` for none)."""
    if seconds is None:
        return "-"
    if seconds < 10:
        return f"{seconds:.1f} s"
    total = int(seconds)
    parts: list[str] = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if total >= size or (unit == "s" and not parts):
            parts.append(f"{total // size} {unit}")
            total %= size
    return " ".join(parts[:2])


def when(value: datetime | float | None) -> str:
    """A database time as ``2025-01-31 12:00:03.123Z``."""
    if value is None:
        return "-"
    if isinstance(value, int | float):
        value = datetime.fromtimestamp(value, UTC)
    text = value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    return text + "Z"


def op_url(tenant: str, operation_id: str) -> str:
    return "/operation?" + urlencode({"tenant": tenant, "id": operation_id})


def task_url(tenant: str, task_id: str) -> str:
    return "/task?" + urlencode({"tenant": tenant, "id": task_id})


def pretty(value: Any) -> str:
    """JSON for a ``<pre>`` (escaped by the template like any other text)."""
    return json.dumps(jsonable(value), indent=2, sort_keys=True, default=str)


def make_environment(directory: Path) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(directory)),
        autoescape=True,  # every template, whatever its name
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(age=age, when=when, pretty=pretty)
    env.globals.update(op_url=op_url, task_url=task_url, urlencode=urlencode)
    return env

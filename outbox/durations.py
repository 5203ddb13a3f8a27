"""How a person writes a length of time: ``90`` or ``90s``, ``30m``, ``2h``, ``1d``.

Used where a person sets an approval's expiry, on the command line and in the console."""

from __future__ import annotations

import re
from datetime import timedelta

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> timedelta:
    """``90`` / ``90s`` / ``30m`` / ``2h`` / ``1d`` → a positive timedelta; ValueError
    naming what is wrong otherwise."""
    match = _DURATION.match(text)
    if not match or float(match.group(1)) <= 0:
        raise ValueError(
            f"invalid duration {text!r}: a positive number with s, m, h or d (e.g. 30m)"
        )
    return timedelta(seconds=float(match.group(1)) * _UNITS[match.group(2)])

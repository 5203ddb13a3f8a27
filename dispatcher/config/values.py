"""Configuration values: raw TOML or environment values converted to a field's type and
checked against its metadata, and the provider tables frozen read-only."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import re
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

from dispatcher.config.redaction import config_error, echo_value
from dispatcher.config.sections import SECTIONS

_BOOLS = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
RawValue = tuple[Any, str | None, bool]  # (raw value, source, came from the environment)


def _convert(value: Any, typ: Any, from_env: bool) -> Any:
    """``value`` as ``typ``; ValueError describing the expected type otherwise."""
    if typing.get_origin(typ) is Mapping:  # a table of strings (a JSON object from env)
        if from_env:
            try:
                value = json.loads(value)
            except ValueError:
                raise ValueError("must be a JSON object of strings") from None
        if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise ValueError("must be a table of strings")
        return dict(value)
    if typing.get_origin(typ) in (types.UnionType, typing.Union):
        if value is None or value == "":
            return None
        typ = next(a for a in typing.get_args(typ) if a is not type(None))
    if typ is bool:
        if isinstance(value, bool):
            return value
        if from_env and value.strip().lower() in _BOOLS:
            return _BOOLS[value.strip().lower()]
        raise ValueError(
            "must be a boolean (true/false/1/0/yes/no)"
            if from_env
            else "must be a boolean (true or false)"
        )
    if typ is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if from_env and re.fullmatch(r"\s*[+-]?\d+\s*", value):
            return int(value)
        raise ValueError("must be an integer")
    if typ is float:
        number: float | None = None
        if isinstance(value, int | float) and not isinstance(value, bool):
            number = float(value)
        elif from_env:
            with contextlib.suppress(ValueError):
                number = float(value)
        if number is None or not math.isfinite(number):
            raise ValueError("must be a finite number")
        return number
    if typ is str:
        if isinstance(value, str):
            return value
        raise ValueError("must be a string")
    raise TypeError(f"unsupported configuration field type {typ!r}")  # a bug, not user input


def _check(value: Any, meta: Mapping[str, Any]) -> Any:
    if "choices" in meta:
        for choice in meta["choices"]:
            if value.lower() == choice.lower():
                return choice
        raise ValueError(f"must be one of {', '.join(meta['choices'])}")
    ops: dict[str, Callable[[Any, Any], bool]] = {
        ">=": lambda v, b: v >= b,
        ">": lambda v, b: v > b,
        "<=": lambda v, b: v <= b,
        "<": lambda v, b: v < b,
    }
    bounds = [
        (op, meta[name])
        for name, op in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))
        if name in meta
    ]
    if not all(ops[op](value, bound) for op, bound in bounds):
        raise ValueError("must be " + " and ".join(f"{op} {bound}" for op, bound in bounds))
    check: Callable[[Any], Any] | None = meta.get("check")
    return check(value) if check else value


def build_section(section: str, values: Mapping[str, RawValue]) -> Any:
    """Build the section's dataclass from ``values`` using its fields and type hints."""
    cls = SECTIONS[section]
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name not in values:
            continue
        raw, source, from_env = values[f.name]
        key = f"{section}.{f.name}"
        try:
            value = _convert(raw, hints[f.name], from_env)
            kwargs[f.name] = None if value is None else _check(value, f.metadata)
        except ValueError as exc:
            raise config_error(key, f"{exc}{echo_value(key, raw)}", source) from None
    return cls(**kwargs)


def freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return types.MappingProxyType({k: freeze(v) for k, v in value.items()})
    if isinstance(value, list | tuple):  # lists stay lists: the provider registry expects them
        return [freeze(v) for v in value]
    return value


def env_provider_value(text: str, current: Any) -> Any:
    """Strings stay strings where the file has a string; otherwise JSON numbers, booleans
    and arrays are parsed, anything else is kept as the string."""
    if isinstance(current, str):
        return text
    try:
        parsed = json.loads(text)
    except ValueError:
        return text
    if isinstance(parsed, float) and not math.isfinite(parsed):
        return text
    if isinstance(parsed, bool | int | float | list):
        return parsed
    return text


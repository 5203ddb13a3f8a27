"""Credentials in provider configuration: references only, resolved once, never shown.

A header value or any other credential is written in the configuration as a *reference*:
``env:NAME`` (an environment variable) or ``file:PATH`` (a file's content, trailing
newline stripped, as Kubernetes and systemd credentials mount them). A literal value is
a configuration error: a token pasted into a TOML file ends up in backups, diffs and
support tickets.

References are resolved when the provider is built, so a missing variable stops the
daemon at start-up rather than at the first dispatch. The resolved value lives in a
:class:`Secret` whose ``repr``/``str`` are redacted; error messages name the
configuration key and the reference (``env:NAME``), never the value.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from outbox.errors import ProviderConfigError

REDACTED: Final = "<redacted>"
MAX_SECRET_FILE_BYTES: Final = 64 * 1024


class Secret:
    """A resolved credential. Only :meth:`reveal` gives the value, to put it on the wire."""

    __slots__ = ("_value", "reference")

    def __init__(self, value: str, reference: str) -> None:
        self._value = value
        self.reference = reference
        """Where the value came from (``env:NAME`` / ``file:PATH``): safe to log."""

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return f"Secret({self.reference!r}, {REDACTED})"

    def __str__(self) -> str:
        return REDACTED

    def __format__(self, format_spec: str) -> str:
        return REDACTED

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(self.reference)

    def __reduce__(self) -> tuple[object, ...]:
        raise TypeError("a Secret cannot be pickled")


def resolve_secret(reference: object, key: str, environ: Mapping[str, str] | None = None) -> Secret:
    """Resolve ``env:NAME`` / ``file:PATH``; ``key`` is the dotted config key for errors.

    The offending value never appears in an error: if it was a literal, it may be the
    secret itself.
    """
    env = os.environ if environ is None else environ
    if not isinstance(reference, str):
        raise ProviderConfigError(f"{key}: must be a string reference 'env:NAME' or 'file:PATH'")
    scheme, sep, target = reference.partition(":")
    if not sep or scheme not in ("env", "file") or not target:
        raise ProviderConfigError(
            f"{key}: a literal credential is not allowed in configuration; "
            "write 'env:NAME' or 'file:PATH'"
        )
    if scheme == "env":
        if target not in env:
            raise ProviderConfigError(f"{key}: environment variable {target!r} is not set")
        value = env[target]
    else:
        path = Path(target)
        try:
            with path.open("rb") as handle:
                raw = handle.read(MAX_SECRET_FILE_BYTES + 1)
        except OSError as exc:
            raise ProviderConfigError(
                f"{key}: cannot read secret file {target!r} ({exc.__class__.__name__})"
            ) from None
        if len(raw) > MAX_SECRET_FILE_BYTES:
            raise ProviderConfigError(f"{key}: secret file {target!r} is too large")
        try:
            value = raw.decode("utf-8").rstrip("\r\n")
        except UnicodeDecodeError:
            raise ProviderConfigError(f"{key}: secret file {target!r} is not UTF-8") from None
    if not value:
        raise ProviderConfigError(f"{key}: the secret referenced by {reference!r} is empty")
    if any(ch in value for ch in "\r\n\0"):
        raise ProviderConfigError(f"{key}: the secret referenced by {reference!r} has a newline")
    return Secret(value, reference)

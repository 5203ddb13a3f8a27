"""Artifacts: large payloads kept outside the row, named by ``payload_ref`` and bound by
``payload_digest``.

An operation may carry ``payload_ref`` (a reference to a retained artifact) instead of an
inline ``payload``; ``payload_digest`` is then required. The digest of an artifact is the
same ``sha256:`` digest over the RFC 8785 canonical JSON as for an inline payload
(:func:`outbox.digest.payload_digest`), computed over the artifact's *parsed JSON value*,
not its bytes: the same object written with other whitespace or key order has the same
digest, and an approval binds to an artifact exactly as it binds to an inline payload.

The dispatcher resolves the reference through an :class:`ArtifactStore` right before each
send and re-send. A missing artifact blocks the operation (``artifact_missing``); content
whose digest differs from the recorded one — substituted, edited, truncated or not JSON —
blocks it too (``artifact_digest_mismatch``). Substituted data is never sent.

Built in: :class:`LocalArtifactStore`, a directory on the dispatcher's host (``[artifacts]
root`` in the configuration). References are relative paths below that directory; absolute
paths, ``..`` segments, backslashes and NUL characters are refused.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Protocol, runtime_checkable

from outbox.digest import canonical_json, payload_digest

ARTIFACT_MISSING = "artifact_missing"
ARTIFACT_DIGEST_MISMATCH = "artifact_digest_mismatch"
MAX_REF_LENGTH = 1024


class ArtifactMissing(LookupError):
    """The referenced artifact does not exist (or cannot be read) in the store."""


class InvalidReference(ValueError):
    """The reference is not a safe relative path."""


@runtime_checkable
class ArtifactStore(Protocol):
    """Where retained artifacts live. Implementations must be thread-safe."""

    def read(self, ref: str) -> bytes:
        """The artifact's bytes; :class:`ArtifactMissing` if it is not there."""
        ...


def check_ref(ref: str) -> PurePosixPath:
    """The reference as a relative path; :class:`InvalidReference` when it is unsafe."""
    if not isinstance(ref, str) or not ref or len(ref) > MAX_REF_LENGTH:
        raise InvalidReference("a reference is a non-empty string of at most 1024 characters")
    if "\x00" in ref or "\\" in ref:
        raise InvalidReference("a reference may not contain NUL or backslash characters")
    path = PurePosixPath(ref)
    if path.is_absolute() or ref.startswith("/"):
        raise InvalidReference("a reference is a relative path")
    if any(part in ("..", ".", "") for part in ref.split("/")):
        raise InvalidReference("a reference may not contain '..', '.' or empty segments")
    return path


class LocalArtifactStore:
    """Artifacts as files below ``root``: the reference ``a/b.json`` is ``root/a/b.json``."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).resolve()

    def path(self, ref: str) -> Path:
        target = (self.root / check_ref(ref)).resolve()
        if not target.is_relative_to(self.root):  # a symlink pointing out of the store
            raise InvalidReference("the reference leaves the artifact store")
        return target

    def read(self, ref: str) -> bytes:
        try:
            return self.path(ref).read_bytes()
        except InvalidReference:
            raise
        except OSError as exc:
            raise ArtifactMissing(f"{ref}: {exc.strerror or type(exc).__name__}") from None

    def write(self, ref: str, data: bytes) -> None:
        """Write atomically (a temporary file, then rename)."""
        target = self.path(ref)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def store_payload(store: LocalArtifactStore, ref: str, payload: Mapping[str, Any]) -> str:
    """Retain ``payload`` as canonical JSON under ``ref``; returns its ``payload_digest``
    (stage the operation with ``payload_ref=ref, payload_digest=<this>``)."""
    store.write(ref, canonical_json(dict(payload)))
    return payload_digest(dict(payload))


@dataclass(frozen=True)
class Resolved:
    ok: bool
    payload: dict[str, Any] | None = None
    reason: str | None = None
    detail: str | None = None


def resolve(store: ArtifactStore | None, ref: str, expected_digest: str | None) -> Resolved:
    """Read and verify one artifact. Never raises for bad data: returns the reason."""
    if store is None:
        return Resolved(False, reason=ARTIFACT_MISSING, detail="no artifact store is configured")
    if not expected_digest:
        return Resolved(False, reason=ARTIFACT_DIGEST_MISMATCH, detail="no payload_digest")
    try:
        check_ref(ref)
        data = store.read(ref)
    except InvalidReference as exc:
        return Resolved(False, reason=ARTIFACT_MISSING, detail=f"invalid reference: {exc}")
    except ArtifactMissing as exc:
        return Resolved(False, reason=ARTIFACT_MISSING, detail=str(exc)[:300])
    except Exception as exc:  # a store plug-in's own failure: not resolvable now
        return Resolved(False, reason=ARTIFACT_MISSING, detail=type(exc).__name__)
    try:
        value = json.loads(data)
        digest = payload_digest(value)
    except Exception as exc:  # not JSON, or not canonicalisable: not what was recorded
        return Resolved(False, reason=ARTIFACT_DIGEST_MISMATCH, detail=type(exc).__name__)
    if digest != expected_digest:
        return Resolved(
            False, reason=ARTIFACT_DIGEST_MISMATCH, detail="content differs from payload_digest"
        )
    if not isinstance(value, dict):
        return Resolved(False, reason="payload_not_object", detail=type(value).__name__)
    return Resolved(True, payload=value)

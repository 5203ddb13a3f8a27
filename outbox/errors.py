"""Errors: one base class, specific subclasses with structured fields.

A subclass's default message is its docstring; keyword arguments become attributes and
are appended to the message (identifiers only: never payload values or credentials).
"""

from __future__ import annotations

from typing import Any


class OutboxError(Exception):
    """An outboxd error."""

    def __init__(self, message: str | None = None, **fields: Any) -> None:
        self.fields = fields
        for key, value in fields.items():
            setattr(self, key, value)
        base = message or (self.__doc__ or self.__class__.__name__).strip().splitlines()[0]
        if fields:
            detail = ", ".join(f"{k}={v!r}" for k, v in fields.items())
            base = f"{base} ({detail})"
        super().__init__(base)


class ConfigError(OutboxError):
    """The configuration is invalid."""


class ProviderConfigError(ConfigError):
    """A provider section is invalid; the message names the section and key."""


class MissingExtra(OutboxError, ImportError):
    """An optional part is used without the extra that installs its packages."""


class PayloadMismatch(OutboxError):
    """An operation with this id already exists with a different payload."""


class RevisionConflict(OutboxError):
    """The task's state_revision is not the expected one; nothing was written."""


class TaskNotFound(OutboxError):
    """No such task."""


class OperationNotFound(OutboxError):
    """No such operation."""


class WaitTimeout(OutboxError):
    """The operation was not settled in time; it is still in the state named here."""


class DuplicateIdempotencyKey(OutboxError):
    """Another operation of this tenant and provider already uses this idempotency key."""


class SecretInPayload(OutboxError):
    """The payload carries what looks like a credential; credentials never enter a record."""


class InvalidPayload(OutboxError):
    """The payload is not a JSON object within the size limit."""


class PayloadUndecodable(InvalidPayload):
    """The payload has a shape the dispatcher could not decode (nested deeper than
    ``outbox.decoding.MAX_JSON_DEPTH`` levels, a lone UTF-16 surrogate): refused before
    anything is written, as the database refuses it at INSERT."""


class IllegalTransition(OutboxError):
    """That status change is not allowed."""


class ImmutableField(OutboxError):
    """A field that is immutable after insert was changed."""


class AppendOnly(OutboxError):
    """Attempts and events are append-only."""


class MigrationError(OutboxError):
    """The database schema is not at a revision this code can use."""


class AmbiguousTenant(OutboxError):
    """Several tenants exist; name one with --tenant."""


class ApprovalError(OutboxError):
    """The approval request is invalid."""

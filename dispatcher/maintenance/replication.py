"""Whether a failover can lose a commit: PostgreSQL's standbys, read at start-up.

A ``dispatching`` mark is the promise that an operation may have been sent; a receipt is
the proof it was applied. On a primary that streams to standbys asynchronously (PostgreSQL's
default), a crash followed by a promotion loses the last commits: marks and receipts the
old primary had committed are gone on the new one, and the operations they covered are sent
again. A receiver that deduplicates absorbs that; one that does not applies them twice.

So, where standbys are attached, outboxd runs only when its commits wait for a standby
(``synchronous_standby_names`` set and the session's ``synchronous_commit`` at least
``remote_write``), or when the operator said ``[database] standbys = "accept-asynchronous"``:
then it runs, and says so at start-up, on ``/readyz`` and in the gauge
``outbox_replication_asynchronous``. Where no standby is attached there is nothing to lose
at failover (there is no failover).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.engine import Engine

from dispatcher.store import store_for

# synchronous_commit values that wait for a synchronous standby before a commit returns
_WAITS = frozenset({"on", "remote_write", "remote_apply"})


@dataclass(frozen=True)
class Replication:
    standbys: int
    """Standbys streaming from this server now (``pg_stat_replication``)."""
    synchronous_names: str
    """``synchronous_standby_names`` ('' when none)."""
    synchronous_commit: str
    """This session's ``synchronous_commit``."""

    @property
    def can_lose_commits(self) -> bool:
        """A failover to one of the standbys may lose commits outboxd relies on."""
        if self.standbys == 0:
            return False
        return not self.synchronous_names.strip() or self.synchronous_commit not in _WAITS

    def describe(self) -> str:
        if not self.synchronous_names.strip():
            why = "synchronous_standby_names is empty"
        else:
            why = f"synchronous_commit is {self.synchronous_commit!r}"
        return (f"PostgreSQL streams to {self.standbys} standby(s) asynchronously ({why}): a"
                " failover may lose dispatching marks and receipts, and the operations they"
                " covered would be sent again (a receiver without deduplication applies"
                " them twice)")


def read(engine: Engine) -> Replication | None:
    """The replication state of the server ``engine`` reaches (None on SQLite)."""
    with engine.connect() as conn:
        found = store_for(engine.dialect.name).replication(conn)
    return None if found is None else Replication(*found)

"""Every statement the daemon runs, on SQLite and PostgreSQL.

:mod:`.interface` (the :class:`~.interface.Store` every hot-path step goes through),
:mod:`.postgres` and :mod:`.sqlite` (its two implementations), :mod:`.common` (the
predicates, SET clauses and statements both write the same way, the repair paths' among
them: lease recovery, reconciliation), :mod:`.transitions`
(the records those statements take), and :mod:`.journal` (the append-only
``outbox_events`` rows written beside them). Uses only ``outbox``.
"""

from __future__ import annotations

from dispatcher.store.interface import Store
from dispatcher.store.postgres import PostgresStore
from dispatcher.store.sqlite import SQLiteStore

__all__ = ["Store", "store_for"]

_STORES: dict[str, Store] = {"postgresql": PostgresStore(), "sqlite": SQLiteStore()}


def store_for(dialect: str) -> Store:
    """The store for a SQLAlchemy dialect name (``engine.dialect.name``)."""
    try:
        return _STORES[dialect]
    except KeyError:
        raise ValueError(f"no outbox store for the {dialect!r} dialect "
                         "(supported: postgresql, sqlite)") from None

"""Every statement the daemon runs, on SQLite and PostgreSQL: :mod:`.queries` (claims,
marks, transitions, receipts; both dialects), :mod:`.pg_batch` (PostgreSQL's one-statement
batches), :mod:`.repair_queries` (what lease recovery, reconciliation and verification
read and write), :mod:`.transitions` (the records those statements take), and
:mod:`.journal` (the append-only ``outbox_events`` rows written beside them). Uses only
``outbox``."""

"""What the live code shares with the database rules the migrations installed: the NOTIFY
channel the insert trigger wakes dispatchers on, and the default payload size limit.

The rules themselves belong to the revisions that installed them
(:mod:`outbox.migrations.rules_0001` for 0001 and 0002; later revisions carry their own);
``tests/foundation/test_rules.py`` checks these names agree with them.
"""

from __future__ import annotations

DEFAULT_MAX_PAYLOAD_BYTES = 262_144
"""The ``outbox_meta`` row ``max_payload_bytes`` the migrations write unless told otherwise."""
NOTIFY_CHANNEL = "outbox_operations"
"""PostgreSQL: the channel of the statement-level NOTIFY on insert into outbox_operations."""
SETTLED_CHANNEL = "outbox_settled"
"""PostgreSQL: the channel the dispatcher's record step notifies on for each operation it
settles (payload: the JSON array ``[tenant_id, operation_id]``); ``outbox.wait_for``
listens on it. Sent by the statement itself, so it needs no database rule."""

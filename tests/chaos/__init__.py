"""The crash and fault suite: a seeded nemesis against real processes (``nemesis``), a
TCP fault proxy of our own in front of PostgreSQL (``proxy``), the checker that counts
lost / duplicated / unexpected effects from the receiver's ledger and the records
(``checker``), the soak entry point (``python -m tests.chaos.soak``), the CI tier and the
hypothesis state machine."""

"""The command line, one module per group of verbs: :mod:`.main` (the entry point,
``migrate``, ``run``, ``status``, ``sim``, and the table of the others), :mod:`.ops`
(operator commands), :mod:`.approve` (approve, revoke), :mod:`.purge` (retention and
erasure), :mod:`.console` (the operator console), :mod:`.demo`; :mod:`.common` holds what
they share. Verbs are thin: the logic they run lives in ``outbox`` or in the room that owns
it, which the console uses too."""

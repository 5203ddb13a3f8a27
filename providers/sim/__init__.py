"""``outboxd sim``: a real HTTP receiver honouring ``Idempotency-Key``, with faults.

See :mod:`providers.sim.server` for the endpoints and :mod:`providers.sim.cli` for flags.
"""

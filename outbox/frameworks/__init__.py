"""Agent frameworks, joined to the outbox where they keep their own state: each module here
writes the effects an agent framework's step implies in the same transaction as that step's
checkpoint. Each needs its framework's extra; importing this package imports none."""

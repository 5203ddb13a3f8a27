"""Alembic migrations of the outbox tables, shipped inside the package."""

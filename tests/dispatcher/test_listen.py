"""PostgreSQL wake-ups: with ``listen`` on (the default) a replica holds a ``LISTEN``
session and is woken by the NOTIFY each new row sends; with it off, it holds none and
still dispatches everything by polling."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import Engine

from outbox import db
from outbox.ddl import NOTIFY_CHANNEL
from tests.dispatcher import PROVIDER, assert_once_each, stage
from tests.support.daemon import (
    DaemonProcess,
    http_provider,
    settled,
    status_counts,
    wait_until,
    write_config,
)
from tests.support.sim import SimProcess


def listening_sessions(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(
            conn.execute(
                sa.text(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND query = :q"
                ),
                {"q": f"LISTEN {NOTIFY_CHANNEL}"},
            ).scalar_one()
        )


@pytest.mark.slow
@pytest.mark.parametrize("listen", [True, False])
def test_listen_setting_decides_the_wake_up_and_polling_still_drains(
    pg_url: str, tmp_path: Path, listen: bool
) -> None:
    engine = db.create_engine(pg_url)
    try:
        with SimProcess(tmp_path) as sim:
            cfg = write_config(
                tmp_path,
                pg_url,
                {PROVIDER: http_provider(sim)},
                dispatcher={"listen": listen, "poll_interval_ms": 100},
            )
            with DaemonProcess(cfg):
                ids = stage(engine, 20)
                wait_until(lambda: settled(engine, 20), timeout=60, message="drained")
                assert listening_sessions(engine) == (1 if listen else 0)
            assert status_counts(engine) == {"applied": 20}
            assert_once_each(sim, ids)
    finally:
        engine.dispose()

"""Procrastinate no-op jobs on the same PostgreSQL, for comparison. Procrastinate is
installed into the bench environment by ``make bench`` only; it is never a dependency of
outboxd. Run as a subprocess: ``python -m bench.procrastinate_run DSN JOBS CONCURRENCY``
prints jobs per second."""

from __future__ import annotations

import asyncio
import sys
import time


async def _run(dsn: str, jobs: int, concurrency: int) -> float:
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    @app.task(queue="bench")
    async def noop() -> None:
        return None

    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        for start in range(0, jobs, 500):
            await asyncio.gather(*(noop.defer_async() for _ in range(min(500, jobs - start))))
        t0 = time.perf_counter()
        await app.run_worker_async(
            queues=["bench"], concurrency=concurrency, wait=False, install_signal_handlers=False
        )
        return jobs / (time.perf_counter() - t0)


def main() -> int:
    dsn, jobs, concurrency = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    print(f"{asyncio.run(_run(dsn, jobs, concurrency)):.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

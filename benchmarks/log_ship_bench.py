"""What shipping a run's log lines costs the run (``workers/logship.py``), against real
Postgres. Prints measured figures (nothing is asserted):

1. The time of one ``logging`` call of a gyre_core logger at INFO, without the shipper
   (a handler that drops the record) and with it running, its writer thread storing the
   lines every 0.5 s meanwhile.
2. How fast the writer stores lines: from ``close()`` to the last line committed, and the
   lines per second over the whole run of the script.

It works in a throwaway database (``test_<name>``), created and dropped here.

    .venv/bin/python benchmarks/log_ship_bench.py [--lines 50000]
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def timed_calls(logger: logging.Logger, n: int) -> float:
    """Seconds per call of ``logger.info`` with a short formatted message."""
    start = time.perf_counter()
    for i in range(n):
        logger.info("step %d: loss %.4f, %d tokens", i, 0.5, 1024)
    return (time.perf_counter() - start) / n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--lines", type=int, default=50_000)
    p.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/gyre_bench")
    args = p.parse_args()
    sys.path[:0] = [str(ROOT / "platform"), str(ROOT)]
    os.environ["DATABASE_URL"] = args.database_url
    os.environ.setdefault("GYRE_SECRET_KEY", "bench-secret-key-" + "x" * 40)
    os.environ["DJANGO_SETTINGS_MODULE"] = "gyre_web.settings"
    os.environ["GYRE_RUN_LOG_MAX_LINES"] = str(args.lines * 2)
    os.environ["GYRE_LOG_FORMAT"] = "text"
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test.utils import setup_databases, teardown_databases
    from gyre_web.runs import services
    from gyre_web.runs.models import RunLogLine
    from gyre_web.teams import services as teams

    from workers.logship import PENDING, LogShipper

    logging.getLogger().handlers.clear()  # nothing printed: only the handler under test
    logger = logging.getLogger("gyre_core.bench")
    print(f"cpus: {os.cpu_count()}, load average: {os.getloadavg()}")
    old = setup_databases(verbosity=0, interactive=False)
    try:
        owner = get_user_model().objects.create_user("bench")
        team = teams.create_team(name="bench", owner=owner)
        exp = services.create_experiment(team=team, name="logs")
        config = {"backend": "sim", "steps": 1, "sim": {"rollouts": 8, "rollouts_per_step": 8}}
        run = services.create_run(experiment=exp, config=config, launch=False)

        logger.setLevel(logging.INFO)
        logging.getLogger().addHandler(logging.NullHandler())
        base = timed_calls(logger, args.lines)
        shipper = LogShipper(run.pk).start()
        began = time.perf_counter()
        shipped = timed_calls(logger, args.lines)
        closing = time.perf_counter()
        shipper.close()
        ended = time.perf_counter()
        stored = RunLogLine.objects.filter(run=run).count()
        print(f"logger.info, no shipper:   {base * 1e6:6.2f} us a call ({args.lines} calls)")
        print(f"logger.info, shipper on:   {shipped * 1e6:6.2f} us a call ({args.lines} calls)")
        print(
            f"lines stored: {stored} of {args.lines} (at most {PENDING} wait; more are dropped, counted in one line)"
        )
        print(f"close() to the last line committed: {ended - closing:.2f} s")
        print(f"stored lines per second, whole run: {stored / (ended - began):,.0f}")
    finally:
        connection.close()
        teardown_databases(old, verbosity=0)


if __name__ == "__main__":
    main()

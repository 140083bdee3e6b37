"""Metric rollups: the downsampled series read from the rollup blocks equal a brute-force
bucketing of the raw points (random data, gaps, replayed steps, several runs and names), on
Postgres here and on SQLite (embedded mode) in a subprocess; incremental upkeep equals a
rebuild from the points; the grid snaps to blocks and never returns more than asked."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def brute_force(run_ids: list[int], names: list[str], points: int) -> dict[str, Any]:
    """The expected answer, from the raw points in Python, on the grid ``rollups.grid``
    (or the plain grid for a short span) defines."""
    from gyre_web.runs import rollups
    from gyre_web.runs.models import MetricPoint

    rows = list(
        MetricPoint.objects.filter(run_id__in=run_ids, name__in=names).values_list(
            "run_id", "name", "step", "value"
        )
    )
    lo, hi = min(r[2] for r in rows), max(r[2] for r in rows)
    grid = rollups.grid(lo, hi, points)
    buckets: dict[tuple[int, str, int], list[tuple[int, float]]] = {}
    for run_id, name, step, value in rows:
        b = (step - grid.origin) // grid.width
        buckets.setdefault((run_id, name, b), []).append((step, value))
    series: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for (run_id, name, b), pts in sorted(buckets.items()):
        last_step, last = max(pts)
        series.setdefault((run_id, name), []).append(
            {"step": grid.origin + b * grid.width, "last_step": last_step,
             "min": min(v for _, v in pts), "max": max(v for _, v in pts), "last": last}
        )  # fmt: skip
    return {
        "bucket": grid.width,
        "series": [{"run": r, "name": n, "points": p} for (r, n), p in sorted(series.items())],
        "level": grid.level,
    }


def fill_random(seed: int, runs: int = 2) -> list[int]:
    """Runs with two metrics over ~20k steps (sparse, with gaps and replays), written
    through ``append_events`` in batches like the sink's; -> run ids."""
    from django.contrib.auth import get_user_model
    from gyre_web.runs import services
    from gyre_web.teams.services import create_team

    rng = random.Random(seed)
    user = get_user_model().objects.create_user(f"rollup{seed}-{rng.random()}")
    team = create_team(name=f"rollup {seed} {rng.random()}", owner=user)
    exp = services.create_experiment(team=team, name="rollups")
    config = {"backend": "sim", "steps": 2, "sim": {"workload": "uniform", "rollouts": 16,
                                                    "rollouts_per_step": 8}}  # fmt: skip
    ids = []
    for r in range(runs):
        run = services.create_run(experiment=exp, config=config, launch=False)
        ids.append(run.pk)
        steps = sorted(rng.sample(range(rng.randrange(0, 50), 20_000 + 37 * r), 2500))
        steps += rng.sample(steps, 100)  # replays: the first value must stay
        events = []
        for step in steps:
            metrics = {"loss": rng.uniform(-5, 5)}
            if rng.random() < 0.7:
                metrics["reward"] = rng.choice([0.0, 1.0, rng.random()])
            events.append({"kind": "step_finished", "t": float(step),
                           "data": {"step": step, "version": 1, "metrics": metrics}})  # fmt: skip
        while events:
            cut = rng.randrange(1, 300)
            services.append_events(run_id=run.pk, events=events[:cut])
            events = events[cut:]
    return ids


def check_against_brute_force(seed: int) -> list[int]:
    """Compare the selector with the brute force for several requests; -> grid levels."""
    from gyre_web.runs import rollups, selectors, services
    from gyre_web.runs.models import MetricRollup

    ids = fill_random(seed)
    levels = []
    for run_ids, names, points in [
        (ids, ["loss", "reward"], 1000), (ids[:1], ["loss"], 1000), (ids, ["reward"], 500),
        (ids, ["loss"], 37), (ids[1:], ["loss", "reward"], 3), (ids, ["loss"], 10_000),
        (ids, ["loss"], 1),
    ]:  # fmt: skip
        got = selectors.metric_series(run_ids=run_ids, names=names, points=points)
        want = brute_force(run_ids, names, points)
        levels.append(want.pop("level"))
        assert got == want, (run_ids, names, points)
        assert all(len(s["points"]) <= points for s in got["series"])
    incremental = sorted(MetricRollup.objects.filter(run_id__in=ids).values_list(
        "run_id", "name", "level", "bucket", *rollups.FIELDS))  # fmt: skip
    assert services.rebuild_metric_rollups(run_ids=ids) == len(incremental)
    rebuilt = sorted(MetricRollup.objects.filter(run_id__in=ids).values_list(
        "run_id", "name", "level", "bucket", *rollups.FIELDS))  # fmt: skip
    assert incremental == rebuilt
    return levels


@pytest.mark.django_db
def test_rollup_series_equal_brute_force_on_postgres():
    levels = check_against_brute_force(seed=1)
    assert max(levels) >= 2 and 0 in levels  # both paths were compared


def test_rollup_series_equal_brute_force_on_sqlite(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("DATABASE_URL", "REDIS_URL", "GYRE_SECRET_KEY", "DJANGO_SETTINGS_MODULE")}  # fmt: skip
    env.update(GYRE_DATA_DIR=str(tmp_path), PYTHONPATH=str(ROOT))
    code = ("import json; from tests.platform.test_metrics_rollup import check_against_brute_force"
            " as c; print(json.dumps(c(seed=2)))")  # fmt: skip
    for args in (["migrate", "-v", "0"], ["shell", "-c", code]):
        out = subprocess.run([sys.executable, "manage.py", *args], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=300)  # fmt: skip
        assert out.returncode == 0, out.stderr[-3000:]
    assert list(tmp_path.glob("*.sqlite3")), "embedded mode writes a SQLite file"
    assert max(json.loads(out.stdout.strip().splitlines()[-1])) >= 2


@pytest.mark.django_db
def test_replayed_step_keeps_its_first_value_in_points_and_rollups(run):
    from gyre_web.runs import services
    from gyre_web.runs.models import MetricPoint, MetricRollup

    def step(s: int, v: float) -> dict[str, Any]:
        return {"kind": "step_finished", "t": 0.0,
                "data": {"step": s, "version": 1, "metrics": {"loss": v}}}  # fmt: skip

    services.append_events(run_id=run.pk, events=[step(1, 5.0), step(2, 7.0), step(2, 9.0)])
    services.append_events(run_id=run.pk, events=[step(1, -1.0), step(3, 6.0)])
    assert dict(MetricPoint.objects.filter(run=run).values_list("step", "value")) == {
        1: 5.0, 2: 7.0, 3: 6.0}  # fmt: skip
    top = MetricRollup.objects.get(run=run, level=16)
    assert (top.min, top.max, top.last, top.first_step, top.last_step, top.count) == (
        5.0, 7.0, 6.0, 1, 3, 3)  # fmt: skip


def test_grid_snaps_to_blocks_and_never_exceeds_the_points_asked():
    from gyre_web.runs import rollups

    assert rollups.grid(0, 99, 10) == rollups.Grid(0, 10, 0)  # short spans: plain
    assert rollups.grid(0, 124_999, 1000) == rollups.Grid(0, 128, 4)  # 16-step blocks
    rng = random.Random(0)
    for _ in range(2000):
        lo = rng.randrange(-10, 10**6)
        hi = lo + rng.randrange(0, 10**6)
        points = rng.choice([1, 2, 7, 100, 500, 1000, 10_000])
        g = rollups.grid(lo, hi, points)
        plain = rollups.plain_grid(lo, hi, points)
        count = (hi - g.origin) // g.width + 1
        assert g.origin <= lo and count <= points
        if g.level:
            size = 1 << g.level
            assert g.origin % size == 0 and g.width % size == 0
            assert g.width >= PER_BUCKET_MIN * size
            assert count >= 0.75 * ((hi - lo) // plain.width + 1) - 1
        else:
            assert g == plain


PER_BUCKET_MIN = 4


@pytest.fixture
def run(people, sim_config):
    from gyre_web.runs import services

    exp = services.create_experiment(team=people["team"], name="rollup")
    return services.create_run(experiment=exp, config=sim_config, launch=False)


@pytest.mark.django_db
def test_migration_backfill_builds_rollups_for_points_stored_before(run):
    import importlib

    from django.apps import apps
    from gyre_web.runs import selectors
    from gyre_web.runs.models import MetricPoint, MetricRollup

    MetricPoint.objects.bulk_create(  # as stored before rollups existed
        [MetricPoint(run=run, name="loss", step=s, value=float(s % 7)) for s in range(9000)]
    )
    assert not MetricRollup.objects.filter(run=run).exists()
    migration = importlib.import_module("gyre_web.runs.migrations.0004_backfill_metric_rollups")
    migration.backfill(apps, None)
    top = MetricRollup.objects.get(run=run, level=16)
    assert (top.first_step, top.last_step, top.count, top.min, top.max) == (0, 8999, 9000, 0, 6)
    got = selectors.metric_series(run_ids=[run.pk], names=["loss"], points=100)
    assert got == {k: v for k, v in brute_force([run.pk], ["loss"], 100).items() if k != "level"}
    assert got["bucket"] == 96  # level 4 (16-step blocks): 90 -> 96 steps a bucket

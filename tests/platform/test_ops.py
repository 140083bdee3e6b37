"""Ops endpoints (healthz, readyz, Prometheus metrics) against the real Postgres and Redis,
and the JSON log formatter."""

from __future__ import annotations

import io
import json
import logging
import logging.config
import re
import uuid
from datetime import timedelta

import pytest
import redis
from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.test import Client
from django.utils import timezone
from django.utils.log import configure_logging
from gyre_web.cluster import services as cluster
from gyre_web.cluster.models import Node, RoleInterval, Unit
from gyre_web.logging import JsonFormatter, build_logging
from gyre_web.runs import services
from gyre_web.runs.models import Run

# name{labels} value, as the Prometheus text format writes a sample.
SAMPLE = re.compile(r'^([a-z_]+)(\{(?:[a-z_]+="[^"]*",?)*\})? (-?[0-9.e+]+)$')
DEAD_REDIS = "redis://:hunter2@127.0.0.1:1/0"  # port 1: nothing listens there


@pytest.fixture
def ops_client(settings) -> Client:
    settings.ROOT_URLCONF = "tests.platform.ops_urls"
    return Client()


def parse_metrics(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Parse and check the exposition format: every family has HELP and TYPE before its
    samples, every other line is a well-formed sample."""
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    declared: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# HELP "):
            continue
        if line.startswith("# TYPE "):
            name, kind = line.split()[2:4]
            assert kind == "gauge"
            declared.add(name)
            continue
        match = SAMPLE.match(line)
        assert match, f"not a Prometheus sample: {line!r}"
        name, labels, value = match.group(1), match.group(2) or "", match.group(3)
        assert name in declared, f"{name} has no # TYPE line"
        pairs = frozenset(re.findall(r'([a-z_]+)="([^"]*)"', labels))
        samples[(name, pairs)] = float(value)
    return samples


def value(samples, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]


# ---------------------------------------------------------------------- health, readiness


def test_healthz_answers_without_io(ops_client):
    resp = ops_client.get("/healthz")
    assert resp.status_code == 200 and resp.json() == {"status": "ok"}
    assert ops_client.post("/healthz").status_code == 405


@pytest.mark.django_db
def test_readyz_service_mode_checks_database_and_broker(ops_client):
    resp = ops_client.get("/readyz")
    assert resp.status_code == 200, resp.content
    assert resp.json() == {"status": "ready", "problems": [], "warnings": []}


@pytest.mark.django_db
def test_readyz_unreachable_broker_is_503_with_reason(ops_client, settings):
    settings.REDIS_URL = DEAD_REDIS
    resp = ops_client.get("/readyz")
    assert resp.status_code == 503
    body = resp.json()
    assert body["status"] == "unavailable"
    assert len(body["problems"]) == 1 and body["problems"][0].startswith("broker unreachable")
    assert "hunter2" not in resp.content.decode()  # the password is not echoed


@pytest.mark.django_db
def test_readyz_embedded_mode_needs_no_broker(ops_client, settings):
    settings.REDIS_URL = ""  # embedded mode: the filesystem transport
    assert ops_client.get("/readyz").status_code == 200


@pytest.mark.django_db(transaction=True)
def test_readyz_and_metrics_with_database_down(ops_client):
    saved = dict(connection.settings_dict)
    connection.close()
    connection.settings_dict["PORT"] = "1"  # a real connection attempt that is refused
    try:
        resp = ops_client.get("/readyz")
        scrape = ops_client.get("/metrics")
    finally:
        connection.close()
        connection.settings_dict.update(saved)
    assert resp.status_code == 503
    assert [p.split(":")[0] for p in resp.json()["problems"]] == ["database unreachable"]
    assert scrape.status_code == 503 and scrape.content.startswith(b"# database unreachable")
    assert ops_client.get("/readyz").status_code == 200  # back once the database is


# ---------------------------------------------------------------------- metrics


@pytest.fixture
def world(people, sim_config):
    exp = services.create_experiment(team=people["team"], name="ops")
    runs = [services.create_run(experiment=exp, config=sim_config, launch=False) for _ in "abcd"]
    Run.objects.filter(pk=runs[1].pk).update(status="running")
    Run.objects.filter(pk=runs[2].pk).update(status="running")
    Run.objects.filter(pk=runs[3].pk).update(status="succeeded", finished_at=timezone.now())
    now = timezone.now()
    old = (now - timedelta(minutes=5)).isoformat()
    fresh = (now - timedelta(seconds=5)).isoformat()
    event = {"kind": "run_status", "t": 0.0, "data": {"status": "running", "step": 0}}
    services.append_events(run_id=runs[1].pk, events=[{**event, "wall": fresh}] * 90)
    services.append_events(run_id=runs[2].pk, events=[{**event, "wall": old}] * 500)
    services.append_events(run_id=runs[3].pk, events=[{**event, "wall": fresh}] * 30)
    # Units: run 1 has two in rollout (one came from train) and one in train; the finished
    # run 3 left an interval open, which must not count.
    cluster.record_role_changes(
        run_id=runs[1].pk,
        events=[
            {"t": 0.0, "data": {"unit": 0, "to_role": "train"}},
            {"t": 1.0, "data": {"unit": 0, "to_role": "rollout"}},
            {"t": 0.0, "data": {"unit": 1, "to_role": "rollout"}},
            {"t": 0.0, "data": {"unit": 2, "to_role": "train"}},
        ],
    )
    unit = Unit.objects.create(run=runs[3], index=0)
    RoleInterval.objects.create(unit=unit, run=runs[3], role="rollout", start=0.0)
    gpus = [cluster.register_gpu(node_name="n1", index=i) for i in range(3)]
    cluster.lease_gpus(run_id=runs[1].pk, unit_index=0, gpus=gpus[:2])
    cluster.register_gpu(node_name="n2", index=0)
    Node.objects.filter(name="n2").update(alive=False)
    return runs


@pytest.mark.django_db
def test_metrics_counts_runs_events_units_and_inventory(ops_client, world):
    resp = ops_client.get("/metrics")
    assert resp.status_code == 200
    assert resp["Content-Type"].startswith("text/plain; version=0.0.4")
    s = parse_metrics(resp.content.decode())
    assert value(s, "gyre_runs", status="queued") == 1
    assert value(s, "gyre_runs", status="running") == 2
    assert value(s, "gyre_runs", status="succeeded") == 1
    assert value(s, "gyre_runs", status="failed") == 0  # every status, zeros included
    # 90 + 30 events in the last minute (the 500 old ones are outside the window).
    assert value(s, "gyre_events_per_second") == pytest.approx(120 / 60)
    assert value(s, "gyre_units", role="rollout") == 2
    assert value(s, "gyre_units", role="train") == 1
    assert value(s, "gyre_units", role="switching") == 0
    assert value(s, "gyre_nodes", alive="true") == 1
    assert value(s, "gyre_nodes", alive="false") == 1
    assert value(s, "gyre_gpus") == 4 and value(s, "gyre_gpus_leased") == 2


@pytest.mark.django_db
def test_metrics_queue_depth_reads_the_redis_broker(ops_client, settings):
    # A database of its own and a queue name of its own: other tests flush the broker's db.
    settings.REDIS_URL = re.sub(r"/\d+$", "/13", settings.REDIS_URL)
    settings.CELERY_TASK_DEFAULT_QUEUE = queue = f"ops-test-{uuid.uuid4().hex}"
    client = redis.Redis.from_url(settings.REDIS_URL)
    keys = [queue, f"{queue}\x06\x166"]
    try:
        client.lpush(keys[0], "m1", "m2", "m3")
        client.lpush(keys[1], "urgent")  # a priority-6 message lives in its own list
        s = parse_metrics(ops_client.get("/metrics").content.decode())
        assert value(s, "gyre_celery_queue_depth", queue=queue) == 4
        assert value(s, "gyre_broker_up") == 1
        client.rpop(keys[0])
        s = parse_metrics(ops_client.get("/metrics").content.decode())
        assert value(s, "gyre_celery_queue_depth", queue=queue) == 3
    finally:
        client.delete(*keys)
        client.close()


@pytest.mark.django_db
def test_metrics_broker_down_or_absent(ops_client, settings):
    settings.REDIS_URL = DEAD_REDIS
    s = parse_metrics(ops_client.get("/metrics").content.decode())
    assert value(s, "gyre_broker_up") == 0
    settings.REDIS_URL = ""
    s = parse_metrics(ops_client.get("/metrics").content.decode())
    assert not any(name.startswith(("gyre_broker", "gyre_celery")) for name, _ in s)
    assert value(s, "gyre_runs", status="running") == 0


# ---------------------------------------------------------------------- logging


def _log_once(config: dict, **extra) -> str:
    stream = io.StringIO()
    config["handlers"]["console"]["stream"] = stream
    logging.config.dictConfig(config)
    try:
        log = logging.getLogger("gyre.test")
        try:
            raise ValueError("boom")
        except ValueError:
            log.error("launch %s failed", 7, exc_info=True, extra=extra)
    finally:  # back to what Django configured for the rest of the session
        configure_logging(django_settings.LOGGING_CONFIG, django_settings.LOGGING)
    return stream.getvalue()


def test_json_log_lines_carry_fields_extras_and_exceptions():
    out = _log_once(build_logging("json", "INFO"), run_id=7, path=object())
    lines = out.strip().splitlines()
    assert len(lines) == 1  # the traceback stays inside the one JSON line
    entry = json.loads(lines[0])
    assert entry["level"] == "ERROR" and entry["logger"] == "gyre.test"
    assert entry["message"] == "launch 7 failed" and entry["run_id"] == 7
    assert entry["path"].startswith("<object object")  # not JSON: written as repr
    assert "ValueError: boom" in entry["exc"]
    assert entry["ts"].endswith("+00:00")
    assert "args" not in entry and "msg" not in entry  # LogRecord internals stay out


def test_log_level_filters_and_text_format():
    assert _log_once(build_logging("json", "CRITICAL")) == ""
    text = _log_once(build_logging("text", "INFO"))
    assert "ERROR gyre.test: launch 7 failed" in text and not text.startswith("{")


def test_log_settings_from_environment_fail_fast(monkeypatch):
    monkeypatch.setenv("GYRE_LOG_FORMAT", "Text")
    monkeypatch.setenv("GYRE_LOG_LEVEL", "debug")
    config = build_logging()
    assert config["handlers"]["console"]["formatter"] == "text"
    assert config["root"]["level"] == "DEBUG"
    monkeypatch.setenv("GYRE_LOG_LEVEL", "loud")
    with pytest.raises(ImproperlyConfigured, match="GYRE_LOG_LEVEL='loud' is not one of"):
        build_logging()


def test_json_formatter_alone():
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "hi %s", ("there",), None)
    assert json.loads(JsonFormatter().format(record))["message"] == "hi there"


def test_kombus_no_hostname_warning_is_quiet_only_in_embedded_mode(monkeypatch):
    monkeypatch.delenv("REDIS_URL", raising=False)
    assert build_logging("json", "INFO")["loggers"]["kombu.connection"] == {"level": "ERROR"}
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:6379/5")
    assert "kombu.connection" not in build_logging("json", "INFO")["loggers"]

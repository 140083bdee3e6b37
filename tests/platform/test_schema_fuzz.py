"""Schemathesis over every operation of /api/schema/, GETs included, against the in-process
WSGI app on Postgres, authenticated as the team's owner by API token, with seeded objects
(a team with a member per role, an experiment, a simulated run with events and metrics,
a rollout, a tree with a node, a GPU, an API token, a share link, a dataset).

Each operation gets cases generated from its own schema, valid and invalid (positive and
negative modes), with the path ids of the seeded objects and with generated ones. Every
answer must be no server error, a documented status, of the documented content type and
with a body that validates against the documented schema. Hypothesis is derandomized
(one fixed sequence of cases) and bounded; failures are collected, not shrunk.

Each request runs inside a savepoint that is rolled back, so a DELETE or a cancel drawn
early does not starve the cases after it of their objects."""

from __future__ import annotations

import io
from typing import Any

import pytest
import schemathesis
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections, transaction
from gyre_web.cluster.models import Gpu
from gyre_web.datasets.services import create_dataset
from gyre_web.runs import services as runs
from gyre_web.runs.models import Run as RunRow
from gyre_web.runs.reporting import create_reported_run
from gyre_web.teams import services as teams
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.platform.test_endpoints import world  # noqa: F401  (the fixture)
from tests.platform.test_imports import _jsonl

pytestmark = pytest.mark.django_db
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
EXAMPLES = 40  # per operation and mode; the whole run stays around a minute
TASKS = b'{"id": "t1", "prompt": "p"}\n'

# Operations a token may not call (a token cannot mint tokens): they answer 403 here, and
# their successes are in test_credential_lifetimes.py, signed in by session.
SESSION_ONLY = {"POST /api/tokens/"}
STEP = {"kind": "step_finished", "t": 1.0, "data": {"step": 1, "version": 1, "metrics": {}}}


@pytest.fixture
def app():
    """The WSGI app, sharing the test's connection (as Django's test client does)."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield WSGIHandler()
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


def _known(path: str, seeded: dict[str, Any]) -> dict[str, Any]:
    """The seeded objects' ids for the operation's path parameters (a paused run for
    resume and delete, which a queued one refuses)."""
    known: dict[str, Any] = {}
    if path in ("/api/runs/{id}/resume/", "/api/runs/{id}/"):
        known["id"] = seeded["paused"]
    elif path == "/api/runs/{id}/report-events/":
        known["id"] = seeded["reported"]
    elif "{id}" in path:
        known["id"] = seeded["ids"][path.split("/")[2]]
    if "{node_id}" in path:
        known["node_id"] = str(seeded["node"])
    if "{version}" in path:
        known["version"] = "1"
    if "{username}" in path:
        known["username"] = "member"
    return known


def _valid(seeded: dict[str, Any], config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Fixed valid inputs for the operations that random ones almost never satisfy."""
    ids = seeded["ids"]
    experiment = {"team": ids["teams"], "name": "fuzz"}
    gpu = {"node": seeded["gpu_node"], "index": 7}
    return {
        "POST /api/datasets/": {
            "body": {"file": TASKS, "name": "fuzz", "kind": "tasks", "team": ids["teams"]},
            "media_type": "multipart/form-data",
        },
        "POST /api/experiments/": {"body": experiment},
        "PUT /api/experiments/{id}/": {"body": experiment},
        "POST /api/gpus/": {"body": gpu},
        "PUT /api/gpus/{id}/": {"body": gpu},
        "POST /api/runs/": {"body": {"experiment": ids["experiments"], "config": config}},
        "POST /api/runs/report/": {"body": {"experiment": ids["experiments"], "config": config}},
        "POST /api/runs/{id}/report-events/": {"body": {"first": 1, "events": [STEP]}},
        "POST /api/runs/{id}/import/": {
            "body": {"file": _jsonl()},
            "media_type": "multipart/form-data",
        },
        "GET /api/runs/metrics/": {"query": {"runs": str(ids["runs"])}},
        "POST /api/share-links/": {"body": {"run": ids["runs"]}},
        "POST /api/webhooks/": {
            "body": {"team": ids["teams"], "url": "http://127.0.0.1:9/", "events": ["failed"]}
        },
        "POST /api/teams/{id}/members/": {"body": {"username": "viewer", "role": "member"}},
        "POST /api/sweeps/": {
            "body": {
                "experiment": ids["experiments"],
                "base_config": config,
                "mode": "grid",
                "params": {"seed": [1, 2]},
                "max_concurrent": 1,
            }
        },
    }


def _strategy(op: Any, seeded: dict[str, Any], valid: dict[str, Any]) -> st.SearchStrategy[Any]:
    known = _known(op.path, seeded)
    parts = [op.as_strategy(path_parameters=known)] if known else []
    fixed = dict(valid.get(op.label, {}))
    if "body" in fixed:
        fixed.setdefault("media_type", "application/json")
    if fixed:
        parts.append(op.as_strategy(path_parameters=known, **fixed))
    parts.append(op.as_strategy())
    has_input = op.body or any(p.location == "query" for p in op.iter_parameters())
    if has_input:
        parts.append(op.as_strategy(GenerationMode.NEGATIVE, path_parameters=known))
    return st.one_of(parts)


def _invariant(op: Any) -> bool:
    """An operation with nothing to vary: no parameters, no body, and open to anyone (its
    security admits no credentials), so every generated case is the same request."""
    anyone = {} in op.definition.raw.get("security", [])
    return anyone and not op.body and not list(op.iter_parameters())


def _failure(case: Any, err: BaseException) -> str:
    body = repr(case.body)[:200] if case.body is not None else ""
    return f"{case.method} {case.formatted_path} {case.query or ''} {body}: {err!s:.600}"


FUZZ = settings(
    max_examples=EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)


class Run:
    """Cases sent, statuses seen and failures found, by operation."""

    def __init__(self, auth: dict[str, str]) -> None:
        self.auth = auth
        self.cases: dict[str, int] = {}
        self.statuses: dict[str, set[int]] = {}
        self.failures: dict[str, list[str]] = {}

    def send(self, op: Any, case: Any) -> None:
        self.cases[op.label] = self.cases.get(op.label, 0) + 1
        with transaction.atomic():
            response = case.call(headers=self.auth)
            transaction.set_rollback(True)
        self.statuses.setdefault(op.label, set()).add(response.status_code)
        try:
            case.validate_response(response, checks=CHECKS, headers=self.auth)
        except FailureGroup as err:  # collected, not raised: one pass lists them all
            found = self.failures.setdefault(op.label, [])
            if len(found) < 3:
                found.append(_failure(case, err))

    def fuzz(self, op: Any, strategy: st.SearchStrategy[Any]) -> None:
        FUZZ(given(case=strategy)(lambda case: self.send(op, case)))()


def test_every_operation_answers_as_documented(world, people, app, sim_config):  # noqa: F811
    owner = people["owner"]
    owner.is_staff = True  # GPU registration is staff-only
    owner.save()
    token, key = teams.create_api_token(user=owner, name="fuzz")
    paused = runs.create_run(experiment=world["run"].experiment, config=sim_config, launch=False)
    RunRow.objects.filter(pk=paused.pk).update(status="paused")
    reported = create_reported_run(experiment=world["run"].experiment, config=sim_config)
    gpu_node = Gpu.objects.get(pk=world["ids"]["gpus"]).node_id
    dataset = create_dataset(team=people["team"], name="d", kind="tasks", upload=io.BytesIO(TASKS))
    ids = {**world["ids"], "tokens": token.pk, "datasets": dataset.pk}
    seeded = {
        **world, "ids": ids, "paused": paused.pk, "reported": reported.pk, "gpu_node": gpu_node
    }  # fmt: skip
    valid = _valid(seeded, sim_config)
    auth = {"Authorization": f"Token {key}"}
    schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", app, headers=auth)
    ops = [result.ok() for result in schema.get_all_operations()]
    assert len(ops) >= 50, [op.label for op in ops]
    run = Run(auth)
    for op in ops:
        run.fuzz(op, _strategy(op, seeded, valid))

    print(f"\nschemathesis: {sum(run.cases.values())} cases over {len(ops)} operations")
    problems = [line for lines in run.failures.values() for line in lines]
    # The seeded ids reach real objects: every operation answered 2xx at least once.
    problems += [
        f"{op}: never 2xx, only {sorted(seen)}"
        for op, seen in run.statuses.items()
        if min(seen) >= 300 and op not in SESSION_ONLY
    ]
    problems += [
        f"{op}: {sorted(run.statuses[op])}" for op in SESSION_ONLY if 403 not in run.statuses[op]
    ]
    few = {op.label: run.cases.get(op.label, 0) for op in ops if not _invariant(op)}
    problems += [f"{op}: only {n} cases" for op, n in few.items() if n < EXAMPLES // 2]
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems)

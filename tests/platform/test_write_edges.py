"""Every write of the OpenAPI schema (/api/schema/), swept deterministically as the team's
owner: each field of each POST/PUT/PATCH/DELETE, in an otherwise plausible body, set to each
edge value in turn (huge integers, empty, NUL-bearing and unicode strings, nested junk) and
left out in turn, and each path id replaced by unknown and malformed ones. No answer may be
a server error, and every 4xx body must be JSON. (test_schema_fuzz.py validates the
answers of every operation against the schema.)

Each request runs inside a savepoint that is rolled back, so a DELETE drawn early does not
starve the operations after it of their objects."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import transaction

from tests.platform.test_endpoints import world  # noqa: F401  (the fixture)

pytestmark = pytest.mark.django_db
METHODS = ("post", "put", "patch", "delete")
UNKNOWN_ID = 987_654_321
HUGE = [2**31, 2**63, -(2**63) - 1, 10**30, -1, 0]
STRINGS = ["", " ", "\x00", "a\x00b", "ñ🙂\u202e\ufeff", "x" * 5000, "<script>", "' OR 1=1 --"]


def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = schema["components"]["schemas"][node["$ref"].rsplit("/", 1)[1]]
    if "allOf" in node:
        merged: dict[str, Any] = {}
        for part in node["allOf"]:
            merged.update(_resolve(schema, part))
        return merged
    return node


def _send(client: Any, method: str, url: str, media: str, body: Any):
    if media.startswith("multipart/"):
        payload = body if isinstance(body, bytes) else json.dumps(body, default=str).encode()
        upload = SimpleUploadedFile("t.jsonl", payload, content_type="application/jsonl")
        return getattr(client, method)(url, {"file": upload}, format="multipart")
    if body is None:
        return getattr(client, method)(url)
    return getattr(client, method)(url, body, format="json")


@pytest.fixture
def api(world, people, client_for, sim_config):  # noqa: F811
    client = client_for(people["owner"])
    schema = client.get("/api/schema/?format=json").json()
    ops = [(path, method, op) for path, item in schema["paths"].items()
           for method, op in item.items() if method in METHODS]  # fmt: skip
    assert len(ops) >= 20, [f"{m} {p}" for p, m, _ in ops]
    ids = world["ids"]
    ctx = {
        "ids": [*sorted(set(ids.values())), people["member"].pk, world["node"]],
        "names": ["member", "viewer", "owner", "loss", "Lab", "x"],
        "config": sim_config,
        "path_ids": ids,
    }
    return client, schema, ops, ctx


def _check(client: Any, method: str, url: str, media: str, body: Any, failures: list[str]):
    try:
        with transaction.atomic():
            resp = _send(client, method, url, media, body)
            transaction.set_rollback(True)
    except Exception as err:  # the test client re-raises a view's exception: a 500
        failures.append(f"{method} {url} {body!r:.300}: {err!r:.300}")
        return
    if resp.status_code >= 500:
        failures.append(f"{method} {url} {body!r:.300}: {resp.status_code}")
    elif resp.status_code >= 400:
        try:
            assert resp["Content-Type"].startswith("application/json")
            json.loads(resp.content)
        except (AssertionError, ValueError):
            failures.append(f"{method} {url}: {resp.status_code} body is not JSON")


def _valid(schema: dict[str, Any], op: dict[str, Any], ctx: dict[str, Any]) -> dict[str, Any]:
    """A plausible body: real ids for the foreign keys, the run config, the first enum."""
    content = op.get("requestBody", {}).get("content", {})
    if not content:
        return {}
    node = _resolve(schema, next(iter(content.values()))["schema"])
    body: dict[str, Any] = {}
    for name, prop in node.get("properties", {}).items():
        prop = _resolve(schema, prop)
        if prop.get("readOnly"):
            continue
        if "enum" in prop:
            body[name] = next(v for v in prop["enum"] if v is not None)
        elif prop.get("type") == "integer":
            body[name] = ctx["path_ids"].get(f"{name}s", ctx["ids"][0])
        elif prop.get("type") == "string":
            body[name] = "fuzz"
        elif prop.get("type") == "array":
            body[name] = []
        elif name in ("config", "changes"):
            body[name] = ctx["config"] if name == "config" else {"seed": 3}
    return body


def test_every_write_field_takes_every_edge_value(api):
    """Deterministic: each field of each write, in an otherwise plausible body, set to each
    edge value in turn, and each field left out in turn."""
    client, schema, ops, ctx = api
    edges = HUGE + STRINGS + [None, True, 1.5, [], {}, [[{}]], {"a": {"b": [None]}}, "junk"]
    failures: list[str] = []
    for path, method, op in ops:
        content = op.get("requestBody", {}).get("content", {})
        media = next(iter(content), "application/json")
        base = _valid(schema, op, ctx) if content else None
        real = str(ctx["path_ids"].get(path.split("/")[2], 1))
        for pid in [real, str(UNKNOWN_ID), "0", "-1", str(2**63), "abc", "%00", "%C3%B1"]:
            for user in ["member", "nobody", "a%00b", "%F0%9F%99%82", "x" * 300]:
                url = path.replace("{id}", pid).replace("{username}", user)
                _check(client, method, url, media, base, failures)
                if "{username}" not in path:
                    break
        if not content:
            continue
        url = path.replace("{id}", real).replace("{username}", "member")
        for field in base:
            _check(client, method, url, media, {k: v for k, v in base.items() if k != field},
                   failures)  # fmt: skip
            for edge in edges:
                _check(client, method, url, media, {**base, field: edge}, failures)
    assert not failures, "\n".join(failures[:20])

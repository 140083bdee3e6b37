"""Schema-driven fuzzing of every write: walk the OpenAPI schema (/api/schema/) and, for each
POST/PUT/PATCH/DELETE operation, send bodies and path ids drawn from the operation's own
schema and then broken (wrong types, missing required fields, huge integers, empty and
NUL-bearing strings, unicode, nested junk, unknown ids, a run config with one leaf
replaced) as the team's owner. No answer may be a server error, and every 4xx body must be
JSON. Hypothesis with a fixed seed and a bounded number of examples (well under a minute).

Each request runs inside a savepoint that is rolled back, so a DELETE drawn early does not
starve the operations after it of their objects."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import transaction
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

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


def junk() -> st.SearchStrategy[Any]:
    leaves = (
        st.none() | st.booleans() | st.sampled_from(HUGE) | st.integers()
        | st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from(STRINGS) | st.text(max_size=20)
    )  # fmt: skip
    return st.recursive(
        leaves,
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
        ),
        max_leaves=6,
    )


def _mutated(config: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """``config`` with one leaf (or sub-object) replaced by junk."""
    paths: list[tuple[str, ...]] = []

    def walk(node: Any, path: tuple[str, ...]) -> None:
        paths.append(path)
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, (*path, key))

    walk(config, ())

    def replace(path: tuple[str, ...], value: Any) -> Any:
        if not path:
            return value
        out = copy.deepcopy(config)
        node = out
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        return out

    leaf = st.sampled_from(HUGE + STRINGS + [None, True, 1.5, -3, [], {}]) | junk()
    return st.builds(replace, st.sampled_from(paths[1:]), leaf)


def value_for(schema: dict[str, Any], prop: dict[str, Any], name: str, ctx: dict[str, Any]):
    prop = _resolve(schema, prop)
    wrong = junk()
    if "enum" in prop:
        return st.sampled_from([v for v in prop["enum"] if v is not None]) | wrong
    kind = prop.get("type")
    if kind == "integer":
        return st.sampled_from(ctx["ids"] + HUGE + [UNKNOWN_ID]) | st.integers() | wrong
    if kind == "string":
        return st.sampled_from(STRINGS + ctx["names"]) | st.text(max_size=40) | wrong
    if kind == "boolean":
        return st.booleans() | wrong
    if kind == "array":
        item = value_for(schema, prop.get("items", {}), name, ctx)
        return st.lists(item, max_size=4) | wrong
    if name in ("config", "changes"):
        return st.just(ctx["config"]) | _mutated(ctx["config"]) | wrong
    return wrong


def body_for(schema: dict[str, Any], op: dict[str, Any], ctx: dict[str, Any]):
    content = op.get("requestBody", {}).get("content", {})
    if not content:
        return st.none()
    media = next(iter(content))
    node = _resolve(schema, content[media]["schema"])
    props = {k: v for k, v in node.get("properties", {}).items() if not v.get("readOnly")}
    missing = object()
    fields = {k: st.just(missing) | value_for(schema, v, k, ctx) for k, v in props.items()}
    extra = st.dictionaries(st.sampled_from(["id", "unknown", "team", "run", "__proto__"]),
                            junk(), max_size=2)  # fmt: skip
    objects = st.builds(
        lambda chosen, more: {**more, **{k: v for k, v in chosen.items() if v is not missing}},
        st.fixed_dictionaries(fields), extra,
    )  # fmt: skip
    return objects | junk()


def _path_values(template: str, ctx: dict[str, Any]):
    collection = template.split("/")[2]
    real = ctx["path_ids"].get(collection, UNKNOWN_ID)
    ids = st.sampled_from([real, real, UNKNOWN_ID, 0, 2**31, 2**63, "abc", "-1", "1e3"])
    usernames = st.sampled_from(["member", "viewer", "nobody", "ñ", "a%00b", "x" * 200])
    return st.fixed_dictionaries({"id": ids, "username": usernames})


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


def test_every_write_survives_malformed_input(api):
    client, schema, ops, ctx = api
    strategies = []
    for path, method, op in ops:
        content = op.get("requestBody", {}).get("content", {})
        media = next(iter(content), "application/json")
        body = body_for(schema, op, ctx)
        if media.startswith("multipart/"):
            body = (
                body
                | st.binary(max_size=200)
                | st.sampled_from(
                    [b"", b"\x00\xff", b'{"format": "gyre.trajectory/v1"}\n{]', b"[]\n" * 3]
                )
            )
        strategies.append((path, method, media, st.tuples(_path_values(path, ctx), body)))
    seen: dict[tuple[str, str], int] = {}

    # Failures are collected (not raised), so nothing to shrink: one pass lists them all.
    @settings(max_examples=25, deadline=None, derandomize=True, database=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(st.data())
    def fuzz(data: st.DataObject) -> None:
        for path, method, media, strategy in strategies:
            params, body = data.draw(strategy, label=f"{method} {path}")
            url = path.replace("{id}", str(params["id"])).replace(
                "{username}", str(params["username"])
            )
            seen[(method, path)] = seen.get((method, path), 0) + 1
            _check(client, method, url, media, body, failures)

    failures: list[str] = []
    fuzz()
    assert not failures, "\n".join(failures[:20])
    assert len(seen) == len(ops) and min(seen.values()) >= 10

"""The permission matrix: every operation of the OpenAPI schema x every kind of caller,
checked against the policy declared in ``gyre_web.policy`` (not against what the code
happens to do; the views check roles by that same table).

Every route of the API must have a policy entry (a new view without one fails here), and
every operation of the schema an entry in ``OPS``: how to call it (a body, a query, a
fresh object for a call that consumes its target). Who may call it is the policy's
``Rule``: its kind and whether a share link reads it. ``ALLOWED`` says which principals
each kind admits (the team kinds by ``policy.TEAM_ROLES``); a denied
principal gets the status ``_denied`` gives (401 without valid credentials, 403 for a
share link or a role too low (404 for a share link where the endpoint does not exist for
it: ``share_denied``, the datasets), 404 for an object outside the caller's teams, 400 naming
the field for a body that refers to one). No call may answer 5xx.

The role rules of the members endpoint and the websocket (handshake and subscribe per
principal) are in this file too; revocation reaching open sockets is in
``test_access_revocation.py``."""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connections
from django.urls import URLResolver, get_resolver, resolve
from django.utils import timezone
from drf_spectacular.generators import SchemaGenerator
from gyre_web import policy
from gyre_web.alerts.services import create_webhook
from gyre_web.asgi import application
from gyre_web.cluster.services import register_gpu
from gyre_web.datasets.services import create_dataset
from gyre_web.runs import reporting, services
from gyre_web.runs.models import Run, Status
from gyre_web.sweeps.services import create_sweep
from gyre_web.teams import services as teams
from gyre_web.trajectories.services import create_tree, record_rollout_events
from rest_framework.test import APIClient

from tests.platform.uploads import fake_checkpoint, fake_export, synth_jsonl

pytestmark = pytest.mark.django_db
ORIGIN = [(b"origin", b"http://localhost")]

ROLES = ("owner", "admin", "member", "viewer")
CALLERS = ("anonymous", "outsider", "staff", *ROLES)
LAPSED = ("revoked_token", "expired_token", "revoked_share", "expired_share")
PRINCIPALS = (*CALLERS, "revoked_token", "expired_token", "share", "revoked_share", "expired_share")
SIGNED_IN = frozenset({"outsider", "staff", *ROLES})
ALLOWED = {  # policy kind -> who may
    "anyone": frozenset({"anonymous", "share", *SIGNED_IN}),  # refused credentials: 401
    "signed_in": SIGNED_IN,  # any signed-in user (lists filter to what they may see)
    # an object of the team, by role (the test principals are named after their roles)
    **{kind: frozenset(str(r) for r in roles) for kind, roles in policy.TEAM_ROLES.items()},
    "self": frozenset({"member"}),  # the caller's own object (here the member's token)
    "staff": frozenset({"staff"}),  # site administrators (the GPU inventory)
    "session": frozenset(),  # a signed-in session only: every principal here holds a token
}


@dataclass
class Op:  # how the test calls an operation (who may call it: gyre_web.policy)
    body: Callable[[dict[str, Any], str], Any] | None = None
    query: str = ""
    fresh: Callable[[dict[str, Any], str], dict[str, Any]] | None = None  # path ids per call
    ref: str = ""  # the body field naming a team object: outsiders get 400 on it
    multipart: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    share_denied: int = 403  # 404: the endpoint does not exist for a share link


Body = Callable[[dict[str, Any], str], Any]


def _n(who: str) -> int:
    return PRINCIPALS.index(who)


def _fresh_experiment(w: dict[str, Any], who: str) -> dict[str, Any]:
    return {"id": services.create_experiment(team=w["team"], name=f"gone-{who}").pk}


def _fresh_run(w: dict[str, Any], who: str, status: str = Status.QUEUED) -> dict[str, Any]:
    run = services.create_run(experiment=w["exp"], config=w["config"], launch=False)
    Run.objects.filter(pk=run.pk).update(status=status)
    return {"id": run.pk}


def _reported_run(w: dict[str, Any], who: str) -> dict[str, Any]:
    return {"id": reporting.create_reported_run(experiment=w["exp"], config=w["config"]).pk}


def _batch(w: dict[str, Any], who: str) -> dict[str, Any]:
    step = {"kind": "step_finished", "t": 1.0, "data": {"step": 1, "version": 1, "metrics": {}}}
    return {"first": 1, "events": [step]}


def _fresh_webhook(w: dict[str, Any], who: str) -> dict[str, Any]:
    return {"id": create_webhook(team=w["team"], url="http://127.0.0.1:9/", events=["failed"]).pk}


def _webhook(w: dict[str, Any], who: str) -> dict[str, Any]:
    return {"team": w["team"].pk, "url": f"http://127.0.0.1:9/{who}", "events": ["failed"]}


def _sweep(w: dict[str, Any], who: str) -> dict[str, Any]:
    spec = {"mode": "grid", "params": {"seed": [1, 2]}, "max_concurrent": 1}
    return {"experiment": w["exp"].pk, "base_config": w["config"], **spec}


def _fresh_sweep(w: dict[str, Any], who: str) -> dict[str, Any]:
    body = {k: v for k, v in _sweep(w, who).items() if k != "experiment"}
    return {"id": create_sweep(experiment=w["exp"], base_config=body.pop("base_config"), **body).pk}


TASKS = b'{"id": "t1", "prompt": "p"}\n'


def _dataset_row(team: Any) -> Any:
    return create_dataset(team=team, name="tasks", kind="tasks", upload=io.BytesIO(TASKS))


def _fresh_dataset(w: dict[str, Any], who: str) -> dict[str, Any]:
    return {"id": _dataset_row(w["team"]).pk}


def _dataset(w: dict[str, Any], who: str) -> dict[str, Any]:
    file = SimpleUploadedFile("t.jsonl", TASKS, content_type="application/jsonl")
    return {"file": file, "name": who, "kind": "tasks", "team": w["team"].pk}


def _finished_run(w: dict[str, Any], who: str) -> dict[str, Any]:
    return _fresh_run(w, who, Status.SUCCEEDED)


def _cancelled_run(w: dict[str, Any], who: str) -> dict[str, Any]:
    return _fresh_run(w, who, Status.CANCELLED)


def _fresh_team(w: dict[str, Any], who: str) -> dict[str, Any]:
    team = teams.create_team(name=f"Doomed {who}", owner=w["users"]["owner"])
    for role in ("admin", "member", "viewer"):
        teams.set_membership(team=team, user=w["users"][role], role=role)
    return {"id": team.pk}


def _fresh_victim(w: dict[str, Any], who: str) -> dict[str, Any]:
    victim = get_user_model().objects.create_user(f"victim-{who}")
    teams.set_membership(team=w["team"], user=victim, role="viewer")
    return {"id": w["team"].pk, "username": victim.username}


def _fresh_gpu(w: dict[str, Any], who: str) -> dict[str, Any]:
    return {"id": register_gpu(node_name="spare", index=_n(who)).pk}


def _fresh_link(w: dict[str, Any], who: str) -> dict[str, Any]:
    return {"id": teams.create_share_link(created_by=None, run=w["run"])[0].pk}


def _fresh_token(w: dict[str, Any], who: str) -> dict[str, Any]:
    return {"id": teams.create_api_token(user=w["users"]["member"], name="spare")[0].pk}


def _jsonl() -> bytes:
    return synth_jsonl()


def _experiment(w: dict[str, Any], who: str) -> dict[str, Any]:
    return {"team": w["team"].pk, "name": who}


def _run(w: dict[str, Any], who: str) -> dict[str, Any]:
    return {"experiment": w["exp"].pk, "config": w["config"]}


def _renamed(w: dict[str, Any], who: str) -> dict[str, Any]:
    return {"team": w["team"].pk, "name": f"renamed by {who}"}


def _gpu(w: dict[str, Any], who: str) -> dict[str, Any]:
    return {"node": w["gpu"].node_id, "index": 10 + _n(who), "model": who}


def _same_gpu(w: dict[str, Any], who: str) -> dict[str, Any]:
    return {"node": w["gpu"].node_id, "index": w["gpu"].index, "model": who}


def _upload(w: dict[str, Any], who: str) -> dict[str, Any]:
    return {"file": SimpleUploadedFile("t.jsonl", w["jsonl"], content_type="application/jsonl")}


def _joiner(w: dict[str, Any], who: str) -> dict[str, Any]:
    user = get_user_model().objects.create_user(f"joiner-{who}")
    return {"username": user.username, "role": "viewer"}


def _name(w: dict[str, Any], who: str) -> dict[str, Any]:
    return {"name": f"N {who}"}


def _fork(w: dict[str, Any], who: str) -> dict[str, Any]:
    return {"changes": {"seed": 3}}


OPS: dict[tuple[str, str], Op] = {
    ("GET", "/api/auth/session/"): Op(),
    ("GET", "/api/config/presets/"): Op(),
    ("GET", "/api/config/schema/"): Op(),
    ("GET", "/api/datasets/"): Op(share_denied=404),
    ("POST", "/api/datasets/"): Op(body=_dataset, ref="team", multipart=True, share_denied=404),
    ("GET", "/api/datasets/{id}/"): Op(share_denied=404),
    ("DELETE", "/api/datasets/{id}/"): Op(fresh=_fresh_dataset, share_denied=404),
    ("GET", "/api/experiments/"): Op(),
    ("POST", "/api/experiments/"): Op(body=_experiment, ref="team"),
    ("GET", "/api/experiments/{id}/"): Op(),
    ("PUT", "/api/experiments/{id}/"): Op(body=_renamed),
    ("PATCH", "/api/experiments/{id}/"): Op(body=_name),
    ("DELETE", "/api/experiments/{id}/"): Op(fresh=_fresh_experiment),
    ("GET", "/api/gpus/"): Op(),
    ("POST", "/api/gpus/"): Op(body=_gpu),
    ("GET", "/api/gpus/{id}/"): Op(),
    ("PUT", "/api/gpus/{id}/"): Op(body=_same_gpu),
    ("PATCH", "/api/gpus/{id}/"): Op(body=_name),
    ("DELETE", "/api/gpus/{id}/"): Op(fresh=_fresh_gpu),
    ("GET", "/api/rollouts/"): Op(),
    ("GET", "/api/rollouts/{id}/"): Op(),
    ("GET", "/api/runs/"): Op(),
    ("POST", "/api/runs/"): Op(body=_run, ref="experiment"),
    ("GET", "/api/runs/{id}/"): Op(),
    ("DELETE", "/api/runs/{id}/"): Op(fresh=_finished_run),
    ("POST", "/api/runs/{id}/cancel/"): Op(fresh=_fresh_run),
    ("POST", "/api/runs/{id}/pause/"): Op(fresh=_fresh_run),
    ("POST", "/api/runs/{id}/resume/"): Op(fresh=_cancelled_run),
    ("POST", "/api/runs/{id}/fork/"): Op(body=_fork),
    ("POST", "/api/runs/{id}/import/"): Op(fresh=_fresh_run, body=_upload, multipart=True),
    ("POST", "/api/runs/report/"): Op(body=_run, ref="experiment"),
    ("POST", "/api/runs/{id}/report-events/"): Op(fresh=_reported_run, body=_batch),
    ("GET", "/api/runs/{id}/events/"): Op(),
    ("GET", "/api/runs/{id}/checkpoints/"): Op(),
    ("GET", "/api/runs/{id}/logs/"): Op(),
    ("GET", "/api/runs/{id}/checkpoints/{version}/download/"): Op(),
    ("POST", "/api/runs/{id}/checkpoints/{version}/export/"): Op(),
    ("GET", "/api/runs/{id}/checkpoints/{version}/export/"): Op(),
    ("GET", "/api/runs/{id}/checkpoints/{version}/export/download/"): Op(),
    ("GET", "/api/runs/{id}/metrics/"): Op(),
    ("GET", "/api/runs/{id}/roles/"): Op(),
    ("GET", "/api/runs/metrics/"): Op(query="runs={run}"),
    ("GET", "/api/share-links/"): Op(),
    ("POST", "/api/share-links/"): Op(body=lambda w, who: {"run": w["run"].pk}, ref="run"),
    ("GET", "/api/share-links/{id}/"): Op(),
    ("DELETE", "/api/share-links/{id}/"): Op(fresh=_fresh_link),
    ("GET", "/api/sweeps/"): Op(),
    ("POST", "/api/sweeps/"): Op(body=_sweep, ref="experiment"),
    ("GET", "/api/sweeps/{id}/"): Op(),
    ("POST", "/api/sweeps/{id}/cancel/"): Op(fresh=_fresh_sweep),
    ("GET", "/api/teams/"): Op(),
    ("POST", "/api/teams/"): Op(body=_name),
    ("GET", "/api/teams/{id}/"): Op(),
    ("PUT", "/api/teams/{id}/"): Op(body=lambda w, who: {"name": "Lab", "slug": "lab"}),
    ("PATCH", "/api/teams/{id}/"): Op(body=_name),
    ("DELETE", "/api/teams/{id}/"): Op(fresh=_fresh_team),
    ("GET", "/api/teams/{id}/members/"): Op(),
    ("POST", "/api/teams/{id}/members/"): Op(body=_joiner),
    ("DELETE", "/api/teams/{id}/members/{username}/"): Op(fresh=_fresh_victim),
    ("GET", "/api/tokens/"): Op(),
    ("POST", "/api/tokens/"): Op(body=_name),
    ("GET", "/api/tokens/{id}/"): Op(),
    ("DELETE", "/api/tokens/{id}/"): Op(fresh=_fresh_token),
    ("GET", "/api/trees/"): Op(),
    ("GET", "/api/trees/{id}/"): Op(),
    ("GET", "/api/trees/{id}/nodes/"): Op(),
    ("GET", "/api/trees/{id}/nodes/{node_id}/tokens/"): Op(),
    ("GET", "/api/trees/{id}/path/{node_id}/"): Op(),
    ("GET", "/api/trees/{id}/search/"): Op(query="q=root"),
    ("GET", "/api/webhooks/"): Op(),
    ("POST", "/api/webhooks/"): Op(body=_webhook, ref="team"),
    ("GET", "/api/webhooks/{id}/"): Op(),
    ("DELETE", "/api/webhooks/{id}/"): Op(fresh=_fresh_webhook),
    ("GET", "/api/webhooks/{id}/deliveries/"): Op(),
}


def _schema_operations() -> list[tuple[str, str]]:
    schema = SchemaGenerator().get_schema(request=None, public=True)
    methods = ("get", "post", "put", "patch", "delete")
    return [(m.upper(), p) for p, ops in schema["paths"].items() for m in ops if m in methods]


def _denied(rule: policy.Rule, op: Op, who: str) -> set[int]:
    """The statuses the policy gives a principal that ``rule`` does not admit."""
    if who == "anonymous" or who in LAPSED:
        return {401}  # no valid credentials
    if who == "share":
        return {op.share_denied}  # a share link reads its scope and nothing else
    team_object = rule.kind in (*policy.TEAM_ROLES, "self")
    if who in ("outsider", "staff") and team_object:
        if op.ref:
            return {400}  # the body names an object that does not exist for them
        return {404}  # an object outside the caller's teams does not exist for them
    if rule.kind == "self":
        return {404}  # another user's token does not exist for them
    if rule.kind == "session":
        return {403}  # signed in with a token, not a session
    return {403}  # a role too low, or not staff


def _admits(rule: policy.Rule, who: str) -> bool:
    return who in ALLOWED[rule.kind] or (who == "share" and rule.shared)


def _rule(method: str, template: str) -> policy.Rule:
    """The declared rule of a schema operation, found by the route its path resolves to."""
    path = template.format(id=1, node_id=1, version=1, username="someone")
    return policy.POLICY[(method, resolve(path).url_name)]


@pytest.fixture
def world(people, sim_config, settings) -> dict[str, Any]:
    """Real objects (team, experiment, run with events, rollout, tree with nodes, GPU,
    tokens, share links) and one client per principal."""
    settings.GYRE_WEBHOOK_ALLOW_NETS = ["127.0.0.0/8"]  # its webhooks: a closed loopback port
    users = {k: people[k] for k in ("owner", "admin", "member", "viewer", "outsider")}
    users["staff"] = get_user_model().objects.create_user("staff", is_staff=True)
    exp = services.create_experiment(team=people["team"], name="matrix")
    run = services.create_run(experiment=exp, config=sim_config, launch=False)
    services.append_events(
        run_id=run.pk,
        events=[
            {
                "kind": "rollout_started",
                "t": 0.0,
                "data": {"rollout_id": "r0", "task_id": "t", "group_id": "g", "step": 1},
            },
            {
                "kind": "step_finished",
                "t": 1.0,
                "data": {"step": 1, "version": 1, "metrics": {"loss": 0.5}},
            },
        ],
    )
    record_rollout_events(
        run_id=run.pk,
        events=[{"kind": "rollout_started", "t": 0.0, "data": {"rollout_id": "r0", "step": 1}}],
    )
    tree = create_tree(
        run_id=run.pk,
        group_id="g",
        nodes=[
            {"id": 0, "parent": None, "preview": "root"},
            {"id": 1, "parent": 0, "preview": "leaf"},
        ],
    )
    gpu = register_gpu(node_name="n0", index=0)
    fake_checkpoint(run.pk, 1)
    fake_export(run.pk, 1)  # done: the POST answers it as it stands, queues nothing
    clients = {}
    keys = {}
    for who, user in users.items():
        token, keys[who] = teams.create_api_token(user=user, name="matrix")
        if who == "member":
            member_token = token
        clients[who] = APIClient(HTTP_AUTHORIZATION=f"Token {keys[who]}")
    revoked, keys["revoked_token"] = teams.create_api_token(user=users["member"], name="old")
    teams.revoke_api_token(token=revoked)
    clients["revoked_token"] = APIClient(HTTP_AUTHORIZATION=f"Token {keys['revoked_token']}")
    past = timezone.now() - timedelta(seconds=1)
    _, keys["expired_token"] = teams.create_api_token(
        user=users["member"], name="x", expires_at=past
    )
    clients["expired_token"] = APIClient(HTTP_AUTHORIZATION=f"Token {keys['expired_token']}")
    _, keys["expired_share"] = teams.create_share_link(
        created_by=users["owner"], experiment=exp, expires_at=past
    )
    link, keys["share"] = teams.create_share_link(created_by=users["owner"], experiment=exp)
    old, keys["revoked_share"] = teams.create_share_link(created_by=users["owner"], experiment=exp)
    teams.revoke_share_link(link=old)
    for who in ("share", "revoked_share", "expired_share"):
        clients[who] = APIClient(HTTP_X_GYRE_SHARE=keys[who])
    clients["anonymous"] = APIClient()
    ids = {
        "teams": people["team"].pk,
        "datasets": _dataset_row(people["team"]).pk,
        "experiments": exp.pk,
        "runs": run.pk,
        "rollouts": run.rollouts.get().pk,
        "trees": tree.pk,
        "gpus": gpu.pk,
        "tokens": member_token.pk,
        "share-links": link.pk,
        "webhooks": create_webhook(
            team=people["team"], url="http://127.0.0.1:9/", events=["failed"]
        ).pk,
        "sweeps": create_sweep(
            experiment=exp,
            base_config=sim_config,
            mode="grid",
            params={"seed": [1]},
            max_concurrent=1,
        ).pk,
    }
    node = tree.tree_nodes.order_by("id").last().pk
    return {
        "users": users,
        "team": people["team"],
        "exp": exp,
        "run": run,
        "gpu": gpu,
        "config": sim_config,
        "jsonl": _jsonl(),
        "clients": clients,
        "keys": keys,
        "ids": ids,
        "node": node,
    }


def _call(w: dict[str, Any], method: str, template: str, op: Op, who: str) -> Any:
    params = {"id": w["ids"].get(template.split("/")[2]), "node_id": w["node"], "version": 1}
    if op.fresh is not None:
        params.update(op.fresh(w, who))
    url = template.format(**params)
    if op.query:
        url += "?" + op.query.format(run=w["run"].pk)
    body = op.body(w, who) if op.body is not None else None
    fmt = "multipart" if op.multipart else "json"
    return getattr(w["clients"][who], method.lower())(url, body, format=fmt)


def test_every_operation_as_every_principal(world):
    operations = _schema_operations()
    undeclared = sorted(set(operations) - set(OPS))
    assert not undeclared, f"declare who may call these operations in OPS: {undeclared}"
    assert not set(OPS) - set(operations), "OPS names operations the schema lacks"
    wrong = []
    started = time.monotonic()
    for method, template in operations:
        op, rule = OPS[(method, template)], _rule(method, template)
        for who in PRINCIPALS:
            resp = _call(world, method, template, op, who)
            status = resp.status_code
            if _admits(rule, who):
                ok = 200 <= status < 300
            else:
                ok = status in _denied(rule, op, who)
                if ok and status == 400:
                    ok = op.ref in resp.json()  # the refused reference is named
            if not ok or status >= 500:
                wrong.append((method, template, who, status, resp.content[:200]))
    cells = len(operations) * len(PRINCIPALS)
    print(
        f"permission matrix: {len(operations)} operations x {len(PRINCIPALS)} principals"
        f" = {cells} calls in {time.monotonic() - started:.1f} s"
    )
    assert not wrong, "\n".join(map(str, wrong))


def _api_routes() -> set[tuple[str, str]]:
    """(method, route name) of every DRF view under ``/api/`` (the browsable API's login
    pages are Django's own forms, not the API)."""

    def walk(patterns: list[Any], prefix: str) -> Any:
        for p in patterns:
            if isinstance(p, URLResolver):
                yield from walk(p.url_patterns, prefix + str(p.pattern))
            else:
                yield prefix + str(p.pattern), p

    routes, methods = set(), ("get", "post", "put", "patch", "delete")  # HEAD reads as GET
    for route, pattern in walk(get_resolver().url_patterns, ""):
        cls = getattr(pattern.callback, "cls", None)
        if route.startswith("api/") and cls is not None:
            actions = getattr(pattern.callback, "actions", None) or {m: m for m in methods}
            served = [m for m in methods if m in actions and hasattr(cls, actions[m])]
            routes |= {(m.upper(), pattern.name) for m in served}
    return routes


def _undeclared(routes: set[tuple[str, str]], declared: Any) -> list[tuple[str, str]]:
    return sorted(routes - set(declared))


def test_every_route_of_the_api_has_a_declared_policy(world):
    routes = _api_routes()
    assert len(routes) >= len(_schema_operations())  # the walk sees every operation
    missing = _undeclared(routes, policy.POLICY)
    assert not missing, f"declare who may call these in gyre_web.policy.POLICY: {missing}"
    assert not set(policy.POLICY) - routes, "POLICY names routes the API lacks"
    # a view added without an entry is caught (here: an entry taken away)
    less = {k: v for k, v in policy.POLICY.items() if k != ("POST", "run-cancel")}
    assert _undeclared(routes, less) == [("POST", "run-cancel")]
    # the routes outside the schema (its own pages, the API root) hold their rules too
    for name, path in (("api-root", "/api/"), ("schema", "/api/schema/"), ("docs", "/api/docs/")):
        kind = policy.POLICY[("GET", name)].kind
        assert kind in ("anyone", "signed_in"), name
        anonymous = world["clients"]["anonymous"].get(path).status_code
        assert anonymous == (200 if kind == "anyone" else 401), (name, anonymous)
        assert world["clients"]["viewer"].get(path).status_code == 200, name


def test_a_share_link_reads_only_its_experiment(world, people, sim_config):
    other_exp = services.create_experiment(team=world["team"], name="not shared")
    other_run = services.create_run(experiment=other_exp, config=sim_config, launch=False)
    foreign_exp = services.create_experiment(team=people["other_team"], name="foreign")
    foreign = services.create_run(experiment=foreign_exp, config=sim_config, launch=False)
    share = world["clients"]["share"]
    for url in (
        f"/api/experiments/{other_exp.pk}/",
        f"/api/runs/{other_run.pk}/",
        f"/api/runs/{foreign.pk}/events/",
        f"/api/runs/metrics/?runs={other_run.pk}",
    ):
        assert share.get(url).status_code == 404, url
    other_sweep = create_sweep(
        experiment=other_exp,
        base_config=sim_config,
        mode="grid",
        params={"seed": [1]},
        max_concurrent=1,
    )
    assert share.get(f"/api/sweeps/{other_sweep.pk}/").status_code == 404
    listed = [r["id"] for r in share.get("/api/runs/").json()["results"]]
    shared = Run.objects.filter(experiment=world["exp"]).order_by("-id")  # with its sweep's
    assert listed == list(shared.values_list("pk", flat=True)) and world["run"].pk in listed
    assert [e["id"] for e in share.get("/api/experiments/").json()["results"]] == [world["exp"].pk]
    swept = [s["id"] for s in share.get("/api/sweeps/").json()["results"]]
    assert swept == [world["ids"]["sweeps"]]


def _add(client: APIClient, team_id: int, username: str, role: str) -> Any:
    return client.post(
        f"/api/teams/{team_id}/members/", {"username": username, "role": role}, format="json"
    )


def _roles(team_id: int) -> dict[str, str]:
    from gyre_web.teams.models import Membership

    rows = Membership.objects.filter(team_id=team_id).values_list("user__username", "role")
    return dict(rows)


def test_role_changes_keep_an_owner_and_stay_within_the_actors_rights(world):
    c, team = world["clients"], world["team"].pk
    before = _roles(team)
    refused = [  # (who, username, role, status, field)
        ("admin", "admin", "owner", 403, "role"),  # an admin promotes itself
        ("admin", "member", "owner", 403, "role"),  # an admin grants the owner role
        ("admin", "owner", "viewer", 403, "role"),  # an admin demotes the owner
        ("owner", "owner", "admin", 409, "role"),  # the last owner steps down
        ("member", "member", "admin", 403, None),  # a member manages nobody, not even itself
        ("viewer", "viewer", "owner", 403, None),
    ]
    for who, username, role, status, field_name in refused:
        resp = _add(c[who], team, username, role)
        assert resp.status_code == status, (who, username, role, resp.content)
        assert field_name is None or field_name in resp.json(), resp.content
    gone = [("admin", "owner", 403), ("owner", "owner", 409), ("viewer", "member", 403)]
    for who, username, status in gone:
        resp = c[who].delete(f"/api/teams/{team}/members/{username}/")
        assert resp.status_code == status, (who, username, resp.content)
        assert "username" in resp.json() or status == 403
    assert _roles(team) == before  # nothing changed
    # What an admin may do: manage admins, members and viewers (its own role downward).
    assert _add(c["admin"], team, "outsider", "member").status_code == 201
    assert _add(c["admin"], team, "outsider", "admin").status_code == 201
    assert c["admin"].delete(f"/api/teams/{team}/members/outsider/").status_code == 204
    assert _add(c["admin"], team, "admin", "member").status_code == 201  # steps down
    assert _add(c["admin"], team, "admin", "admin").status_code == 403  # and cannot go back
    # An owner makes another owner; then it may step down, and the new owner may remove it.
    assert _add(c["owner"], team, "member", "owner").status_code == 201
    assert _add(c["owner"], team, "owner", "viewer").status_code == 201
    assert c["member"].delete(f"/api/teams/{team}/members/owner/").status_code == 204
    assert c["member"].delete(f"/api/teams/{team}/members/member/").status_code == 409
    assert _roles(team) == {"admin": "member", "member": "owner", "viewer": "viewer"}
    assert c["viewer"].delete(f"/api/teams/{team}/members/viewer/").status_code == 204  # leaves


async def _handshake(w: dict[str, Any], who: str) -> tuple[WebsocketCommunicator, bool, Any]:
    key = w["keys"].get(who)
    query = "" if key is None else ("share=" if "share" in who else "token=") + key
    comm = WebsocketCommunicator(application, f"/ws/?{query}", headers=ORIGIN)
    connected, code = await comm.connect()
    return comm, connected, code


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_websocket_handshake_and_subscribe_as_every_principal(world):
    run_id, wrong = world["run"].pk, []
    for who in PRINCIPALS:
        comm, connected, code = await _handshake(world, who)
        if who == "anonymous" or who in LAPSED:
            if connected or code != 4401:
                wrong.append((who, "handshake", connected, code))
            continue
        await comm.send_json_to({"type": "subscribe", "run": run_id})
        reply = await comm.receive_json_from(timeout=5)
        if who in ("outsider", "staff"):
            expected = {"type": "error", "run": run_id, "error": "run not found"}
            if reply != expected:
                wrong.append((who, "subscribe", reply))
        else:
            events = await comm.receive_json_from(timeout=5)
            seqs = [e["seq"] for e in events.get("events", [])]
            if reply["type"] != "subscribed" or seqs != [1, 2]:
                wrong.append((who, "subscribe", reply, events))
        await comm.send_json_to({"type": "subscribe", "stream": "cluster"})
        reply = await comm.receive_json_from(timeout=5)
        if reply["type"] != ("error" if who == "share" else "subscribed"):
            wrong.append((who, "cluster", reply))
        await comm.disconnect()
    # The fixture's connection lives in this test's context; a refused handshake leaves
    # it to us to close (else the test database cannot be dropped at the end).
    await sync_to_async(connections.close_all)()
    print(f"websocket matrix: {len(PRINCIPALS)} principals x (handshake, run, cluster)")
    assert not wrong, wrong

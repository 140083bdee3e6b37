"""The API's permission policy, declared once: who may call each operation, as
(HTTP method, URL route name) -> ``Rule``. Views check a team role with ``require``
(which reads the rule of the request's own operation); ``tests/platform/
test_permission_matrix.py`` calls every operation as every kind of caller over HTTP and
expects what this table says, and fails for a route of the API without an entry.

Kinds (``Rule.kind``), from the widest:

- ``anyone``: no credentials needed (refused credentials still get 401);
- ``signed_in``: any signed-in user; a list shows only what the caller may see;
- ``read``, ``write``, ``manage``, ``owner``: an object of a team, by the caller's role in
  it (``TEAM_ROLES``); an object outside the caller's teams does not exist for them (404);
- ``self``: the caller's own object (an API token);
- ``staff``: site administrators (the GPU inventory);
- ``session``: a signed-in browser session only, not an API token.

``Rule.shared``: a share link to the experiment reads it too (share links read, never
write; the views that serve such reads say ``share_link_readable``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gyre_web.access import require_role
from gyre_web.teams.models import MANAGE_ROLES, WRITE_ROLES, Role

KINDS = ("anyone", "signed_in", "read", "write", "manage", "owner", "self", "staff", "session")
TEAM_ROLES: dict[str, frozenset[str]] = {  # the kinds checked by a role in the object's team
    "read": frozenset(Role),
    "write": WRITE_ROLES,
    "manage": MANAGE_ROLES,
    "owner": frozenset({Role.OWNER}),
}


@dataclass(frozen=True)
class Rule:
    kind: str
    shared: bool = False  # a share link to the object's experiment reads it

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown policy kind {self.kind!r}")


ANYONE, SIGNED_IN, READ, WRITE = Rule("anyone"), Rule("signed_in"), Rule("read"), Rule("write")
MANAGE, STAFF, SELF = Rule("manage"), Rule("staff"), Rule("self")
SHARED_LIST, SHARED_READ = Rule("signed_in", shared=True), Rule("read", shared=True)

POLICY: dict[tuple[str, str], Rule] = {
    ("GET", "api-root"): SIGNED_IN,
    ("GET", "schema"): ANYONE,
    ("GET", "docs"): ANYONE,
    ("GET", "session"): ANYONE,
    ("GET", "config-schema"): SIGNED_IN,
    ("GET", "config-presets"): SIGNED_IN,
    ("GET", "team-list"): SIGNED_IN,
    ("POST", "team-list"): SIGNED_IN,
    ("GET", "team-detail"): READ,
    ("PUT", "team-detail"): MANAGE,
    ("PATCH", "team-detail"): MANAGE,
    ("DELETE", "team-detail"): Rule("owner"),
    ("GET", "team-members"): READ,
    ("POST", "team-members"): MANAGE,
    ("DELETE", "team-remove-member"): MANAGE,  # anyone may leave a team themself
    ("GET", "experiment-list"): SHARED_LIST,
    ("POST", "experiment-list"): WRITE,
    ("GET", "experiment-detail"): SHARED_READ,
    ("PUT", "experiment-detail"): WRITE,
    ("PATCH", "experiment-detail"): WRITE,
    ("DELETE", "experiment-detail"): WRITE,
    ("GET", "run-list"): SHARED_LIST,
    ("POST", "run-list"): WRITE,
    ("GET", "run-compare-metrics"): SHARED_READ,
    ("POST", "run-report"): WRITE,
    ("GET", "run-detail"): SHARED_READ,
    ("DELETE", "run-detail"): WRITE,
    ("POST", "run-cancel"): WRITE,
    ("POST", "run-pause"): WRITE,
    ("POST", "run-resume"): WRITE,
    ("POST", "run-fork"): WRITE,
    ("POST", "run-import-trajectories"): WRITE,
    ("POST", "run-report-events"): WRITE,
    ("GET", "run-events"): SHARED_READ,
    ("GET", "run-logs"): SHARED_READ,
    ("GET", "run-metrics"): SHARED_READ,
    ("GET", "run-roles"): SHARED_READ,
    ("GET", "run-checkpoints"): SHARED_READ,  # the list; the weights are for members only
    ("GET", "run-download-checkpoint"): READ,
    ("POST", "run-export-checkpoint"): WRITE,
    ("GET", "run-export-checkpoint"): READ,
    ("GET", "run-download-export"): READ,
    ("GET", "rollout-list"): SHARED_LIST,
    ("GET", "rollout-detail"): SHARED_READ,
    ("GET", "tree-list"): SHARED_LIST,
    ("GET", "tree-detail"): SHARED_READ,
    ("GET", "tree-nodes"): SHARED_READ,
    ("GET", "tree-node-tokens"): SHARED_READ,
    ("GET", "tree-path"): SHARED_READ,
    ("GET", "tree-search"): SHARED_READ,
    ("GET", "gpu-list"): SIGNED_IN,
    ("POST", "gpu-list"): STAFF,
    ("GET", "gpu-detail"): SIGNED_IN,
    ("PUT", "gpu-detail"): STAFF,
    ("PATCH", "gpu-detail"): STAFF,
    ("DELETE", "gpu-detail"): STAFF,
    ("GET", "token-list"): SIGNED_IN,
    ("POST", "token-list"): Rule("session"),  # a token cannot mint tokens
    ("GET", "token-detail"): SELF,
    ("DELETE", "token-detail"): SELF,
    ("GET", "share-link-list"): SIGNED_IN,
    ("POST", "share-link-list"): WRITE,
    ("GET", "share-link-detail"): READ,
    ("DELETE", "share-link-detail"): WRITE,
    ("GET", "webhook-list"): SIGNED_IN,
    ("POST", "webhook-list"): MANAGE,
    ("GET", "webhook-detail"): READ,
    ("DELETE", "webhook-detail"): MANAGE,
    ("GET", "webhook-deliveries"): READ,
    ("GET", "sweep-list"): SHARED_LIST,
    ("POST", "sweep-list"): WRITE,
    ("GET", "sweep-detail"): SHARED_READ,
    ("POST", "sweep-cancel"): WRITE,
    ("GET", "dataset-list"): SIGNED_IN,
    ("POST", "dataset-list"): WRITE,
    ("GET", "dataset-detail"): READ,
    ("DELETE", "dataset-detail"): WRITE,
}


def rule_of(request: Any) -> Rule:
    """The rule of the operation ``request`` calls (HEAD reads like GET)."""
    method = "GET" if request.method == "HEAD" else request.method
    return POLICY[(method, request.resolver_match.url_name)]


def require(request: Any, team_id: int) -> str:
    """Raise 403 unless the caller's role in team ``team_id`` is one the request's own
    operation admits (a share link never passes) -> the role."""
    return require_role(request, team_id, TEAM_ROLES[rule_of(request).kind])

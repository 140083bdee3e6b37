"""What the API shows of server paths. One rule, applied where text that may hold a path
leaves the platform (a run's ``error``, its log lines, a checkpoint export's ``error``):

- no response carries the data folder (``GYRE_DATA_DIR``, where every team's runs,
  uploads and checkpoints live): members of the run's team read it as ``<data>``;
- everyone else who may read the run (a share link, a signed-in outsider on a public
  experiment) reads every absolute path as ``<path>``, and a run's error as one line.

Fields that are nothing but a server path (a run's checkpoint folder, a tree's payload
file) are not part of any response."""

from __future__ import annotations

import re
from typing import Any

from django.conf import settings

from gyre_web.access import share_link_of
from gyre_web.teams.selectors import teams_of

_PATH = re.compile(r"(?<![\w.])(?:[A-Za-z]:)?[/\\][^\s'\"]+")


def hide_data_dir(text: str) -> str:
    """``text`` with the data folder (and anything under it) shown as ``<data>``."""
    root = str(settings.GYRE_DATA_DIR).rstrip("/")
    return text.replace(root, "<data>") if root and root in text else text


def public_text(text: str) -> str:
    """``text`` with every absolute path replaced by ``<path>``."""
    shown = _PATH.sub("<path>", text)
    root = str(settings.GYRE_DATA_DIR).rstrip("/")
    return shown.replace(root, "<path>") if root and root in shown else shown


def public_error(text: str) -> str:
    """A run's error for a reader outside its team: one line (a traceback's last), with
    server paths replaced by ``<path>``."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return ""
    line = lines[-1] if lines[0].startswith("Traceback") else lines[0]
    return public_text(line)[:500]


def is_insider(request: Any, team_id: int, cache: dict[str, Any] | None = None) -> bool:
    """Whether ``request`` reads as a member of team ``team_id`` (a share link never does).
    ``cache`` (a serializer's context) keeps the caller's team ids for one response."""
    if request is None or share_link_of(request) is not None:
        return False
    cache = {} if cache is None else cache
    if "_team_ids" not in cache:
        cache["_team_ids"] = set(teams_of(request.user).values_list("pk", flat=True))
    return team_id in cache["_team_ids"]


def text_for(request: Any, team_id: int, text: str, cache: dict[str, Any] | None = None) -> str:
    """A free text (a log line, an error) as ``request`` may read it (see the module)."""
    if not text:
        return text
    return hide_data_dir(text) if is_insider(request, team_id, cache) else public_text(text)

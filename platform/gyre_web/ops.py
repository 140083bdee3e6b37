"""Operations endpoints: liveness, readiness and Prometheus metrics.

* ``healthz``: the process is up and serving requests (200, no I/O). For liveness probes.
* ``readyz``: the database answers, and in service mode (``REDIS_URL`` set) the Celery
  broker answers too; 503 with the reasons otherwise. For readiness probes and load
  balancers. ``warnings`` says when another deployment shares the broker (its launches
  reached this deployment's workers within the last hour: ``cluster.deployments``). In embedded mode the broker is a folder (kombu's filesystem transport), so
  there is nothing to reach.
* ``metrics``: Prometheus text exposition format 0.0.4, written by hand (no client
  library): runs by status, events written per second over the last minute, the Celery
  queue depth when Redis is the broker, units by role in active runs, nodes and GPUs.

These are plain Django views, outside the REST framework: no authentication, no
pagination. Keep ``/metrics`` off the public Ingress (see ``deploy/README.md``).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta

import redis
from django.conf import settings
from django.db import DatabaseError, connection
from django.db.models import Count, Q
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone
from django.views.decorators.http import require_safe

from gyre_web.cluster.deployments import shared_broker
from gyre_web.cluster.models import Gpu, GpuLease, Node, RoleInterval
from gyre_web.runs.models import ACTIVE, Run, RunEvent, Status

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# The window over which events/s is averaged (seconds).
EVENT_WINDOW_S = 60
# A dead broker must not hang the probe: give up after this long (deploy/ sets the probes'
# timeouts above it).
BROKER_TIMEOUT_S = 2.0
ROLES = ("rollout", "train", "switching", "idle")
# kombu's Redis transport stores a queue with priorities as several lists: the queue name
# itself (priority 0) and the name + this separator + the priority step (3, 6, 9).
_PRIORITY_SEP = "\x06\x16"
_PRIORITY_STEPS = ("3", "6", "9")


@require_safe
def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


def _database_problem() -> str | None:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except DatabaseError as exc:
        return f"database unreachable: {exc}".strip()
    return None


def _redis_client() -> redis.Redis:
    return redis.Redis.from_url(
        settings.REDIS_URL,
        socket_timeout=BROKER_TIMEOUT_S,
        socket_connect_timeout=BROKER_TIMEOUT_S,
    )


def _broker_problem() -> str | None:
    if not settings.REDIS_URL:
        return None  # embedded mode: the broker is a folder on disk
    client = _redis_client()
    try:
        client.ping()
    except redis.RedisError as exc:
        return f"broker unreachable ({_redacted(settings.REDIS_URL)}): {exc}"
    finally:
        client.close()
    return None


def _redacted(url: str) -> str:
    """The URL without its password, for error messages."""
    scheme, sep, rest = url.partition("://")
    if "@" in rest:
        rest = "***@" + rest.rsplit("@", 1)[1]
    return scheme + sep + rest


def _shared_broker() -> str | None:
    seen = shared_broker()
    if seen is None:
        return None
    return (
        f"another deployment ({seen['other_deployment']}) shares this broker: its launch of"
        f" run {seen['run']} reached a worker of this deployment ({seen['deployment']}) at"
        f" {seen['seen_at']}; give each deployment its own Redis database"
    )


@require_safe
def readyz(request: HttpRequest) -> JsonResponse:
    problems = [p for p in (_database_problem(), _broker_problem()) if p]
    if problems:
        return JsonResponse({"status": "unavailable", "problems": problems}, status=503)
    warnings = [w for w in (_shared_broker(),) if w]  # serving still works: not a problem
    return JsonResponse({"status": "ready", "problems": [], "warnings": warnings})


# ---------------------------------------------------------------------- metrics


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _family(
    name: str, help_text: str, samples: Iterable[tuple[dict[str, str], float]]
) -> list[str]:
    """One gauge family: ``# HELP``, ``# TYPE`` and a line per (labels, value)."""
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
    for labels, value in samples:
        inner = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
        lines.append(f"{name}{{{inner}}} {value:g}" if inner else f"{name} {value:g}")
    return lines


def _runs_by_status() -> list[tuple[dict[str, str], float]]:
    counts = dict(Run.objects.values_list("status").annotate(n=Count("id")).order_by())
    return [({"status": s}, float(counts.get(s, 0))) for s in Status.values]


def _events_per_second() -> float:
    """Events whose ``wall`` time falls in the last minute, per second. Only runs that are
    active or finished within the window are scanned, so the cost does not grow with the
    history kept in the event table."""
    since = timezone.now() - timedelta(seconds=EVENT_WINDOW_S)
    recent_runs = Run.objects.filter(Q(status__in=ACTIVE) | Q(finished_at__gte=since))
    n: int = RunEvent.objects.filter(run__in=recent_runs.values("id"), wall__gte=since).count()
    return n / EVENT_WINDOW_S


def _units_by_role() -> list[tuple[dict[str, str], float]]:
    """A unit's current role is its open role interval; only active runs count (a finished
    run's intervals are closed, but a crashed worker may have left some open)."""
    counts = dict(
        RoleInterval.objects.filter(end__isnull=True, run__status__in=ACTIVE)
        .values_list("role")
        .annotate(n=Count("id"))
        .order_by()
    )
    roles = [*ROLES, *sorted(set(counts) - set(ROLES))]
    return [({"role": r}, float(counts.get(r, 0))) for r in roles]


def _queue_depth() -> list[str]:
    if not settings.REDIS_URL:
        return []  # embedded mode: no Redis broker to measure
    queue = str(getattr(settings, "CELERY_TASK_DEFAULT_QUEUE", "celery"))
    keys = [queue, *(f"{queue}{_PRIORITY_SEP}{step}" for step in _PRIORITY_STEPS)]
    client = _redis_client()
    try:
        pipe = client.pipeline(transaction=False)
        for key in keys:
            pipe.llen(key)
        depth = sum(int(n) for n in pipe.execute())
        up = 1.0
    except redis.RedisError:
        depth, up = 0, 0.0
    finally:
        client.close()
    return [
        *_family("gyre_broker_up", "1 when the Redis broker answered this scrape.", [({}, up)]),
        *_family(
            "gyre_celery_queue_depth",
            "Tasks waiting in the Celery queue (not yet taken by a worker).",
            [({"queue": queue}, float(depth))],
        ),
    ]


def _inventory() -> list[str]:
    nodes = dict(Node.objects.values_list("alive").annotate(n=Count("id")).order_by())
    leased = GpuLease.objects.filter(released_at__isnull=True).count()
    return [
        *_family(
            "gyre_nodes",
            "Registered nodes, alive or lost.",
            [({"alive": "true"}, nodes.get(True, 0)), ({"alive": "false"}, nodes.get(False, 0))],
        ),
        *_family("gyre_gpus", "GPUs in the inventory.", [({}, float(Gpu.objects.count()))]),
        *_family("gyre_gpus_leased", "GPUs held by a run's unit.", [({}, float(leased))]),
    ]


def render_metrics() -> str:
    lines = [
        *_family("gyre_runs", "Runs by status.", _runs_by_status()),
        *_family(
            "gyre_events_per_second",
            f"Run events written per second, averaged over the last {EVENT_WINDOW_S} s.",
            [({}, _events_per_second())],
        ),
        *_family("gyre_units", "Units of active runs by current role.", _units_by_role()),
        *_inventory(),
        *_queue_depth(),
        *_family(
            "gyre_shared_broker",
            "1 when another deployment's launch reached this deployment's workers lately.",
            [({}, float(shared_broker() is not None))],
        ),
    ]
    return "\n".join(lines) + "\n"


@require_safe
def metrics(request: HttpRequest) -> HttpResponse:
    try:
        body = render_metrics()
    except DatabaseError as exc:
        # A failed scrape (Prometheus marks the target down) beats a page of wrong zeros.
        return HttpResponse(
            f"# database unreachable: {exc}\n", status=503, content_type=CONTENT_TYPE
        )
    return HttpResponse(body, content_type=CONTENT_TYPE)

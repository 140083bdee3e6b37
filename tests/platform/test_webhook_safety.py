"""Webhooks that cannot reach inside or stall the workers: registration and every attempt
refuse non-public addresses (unless the operator allows a range), the post goes to the
address checked, redirects are not followed, any failure stays on its own delivery, posts
run off the watchdog thread (its heartbeats keep their period), and two deliverers never
post one delivery twice. Real sockets on 127.0.0.1 throughout."""

from __future__ import annotations

import itertools
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.db import connection
from gyre_web.alerts import net
from gyre_web.alerts import services as alerts
from gyre_web.alerts.models import Delivery, Webhook
from gyre_web.runs import services
from gyre_web.runs.models import Run, Status

from tests.receiver import Receiver

LOOPBACK = ["127.0.0.0/8"]


class Hostile:
    """A TCP server on 127.0.0.1 whose every connection gets ``answer(conn)``."""

    def __init__(self, answer: Callable[[socket.socket], None]) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/hook"
        self.answer = answer
        self.stop = threading.Event()
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        self.sock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        try:
            self.answer(conn)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


def _garbage(conn: socket.socket) -> None:  # not HTTP: http.client's BadStatusLine
    conn.recv(65536)
    conn.sendall(b"SSH-2.0-OpenSSH_9.6 secret-banner\r\n\r\n")


def _silent(stop: threading.Event) -> Callable[[socket.socket], None]:
    def answer(conn: socket.socket) -> None:  # accepts, never answers
        stop.wait(30)

    return answer


def _trickle(stop: threading.Event) -> Callable[[socket.socket], None]:
    def answer(conn: socket.socket) -> None:  # a byte at a time, never a whole answer
        conn.recv(65536)
        conn.sendall(b"HTTP/1.1 200 OK\r\n")
        while not stop.wait(0.2):
            conn.sendall(b"X")

    return answer


def _redirect(to: str) -> Callable[[socket.socket], None]:
    def answer(conn: socket.socket) -> None:
        conn.recv(65536)
        conn.sendall(f"HTTP/1.1 302 Found\r\nLocation: {to}\r\nContent-Length: 0\r\n\r\n".encode())

    return answer


def _ended(team: Any, config: dict[str, Any], name: str) -> Run:
    exp = services.create_experiment(team=team, name=f"e-{name}")
    run = services.create_run(experiment=exp, config=config, name=name, launch=False)
    services.transition(run.pk, Status.STARTING)
    services.transition(run.pk, Status.RUNNING)
    return services.transition(run.pk, Status.FAILED, error="boom")


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver([])
    yield r
    r.server.shutdown()


REFUSED = [
    "http://127.0.0.1/h",
    "http://[::1]/h",
    "http://0.0.0.0/h",
    "http://[::]/h",
    "http://10.1.2.3/h",
    "http://192.168.0.1/h",
    "http://172.16.0.1/h",
    "http://100.64.0.1/h",  # shared address space (carrier NAT)
    "http://169.254.169.254/latest/meta-data/",
    "http://[fe80::1]/h",
    "http://[fd00::1]/h",
    "http://224.0.0.1/h",
    "http://240.0.0.1/h",
    "http://[::ffff:127.0.0.1]/h",  # IPv4-mapped loopback
    "http://2130706433/h",  # 127.0.0.1 as one number
    "http://localhost/h",
    "http://metadata.google.internal/computeMetadata/v1/",
    "http://user:pass@127.0.0.1/h",
    "ftp://127.0.0.1/h",
]


@pytest.mark.django_db
@pytest.mark.parametrize("url", REFUSED)
def test_registration_refuses_inside_addresses_by_field(url, people, client_for, settings) -> None:
    settings.GYRE_WEBHOOK_ALLOW_NETS = []
    body = {"team": people["team"].pk, "url": url, "events": ["failed"]}
    resp = client_for(people["owner"]).post("/api/webhooks/", body, format="json")
    assert resp.status_code == 400 and list(resp.json()) == ["url"], resp.content
    with pytest.raises(ValueError):
        alerts.create_webhook(team=people["team"], url=url, events=["failed"])
    assert not Webhook.objects.exists()


@pytest.mark.django_db
def test_the_allow_setting_admits_a_range_but_not_userinfo_or_other_schemes(
    people, client_for, settings
) -> None:
    settings.GYRE_WEBHOOK_ALLOW_NETS = LOOPBACK
    owner = client_for(people["owner"])
    body = {"team": people["team"].pk, "events": ["failed"]}
    ok = owner.post("/api/webhooks/", {**body, "url": "http://127.0.0.1:9/h"}, format="json")
    assert ok.status_code == 201, ok.content
    for url in ("http://user:pass@127.0.0.1:9/h", "ftp://127.0.0.1/h", "http://[::1]:9/h"):
        resp = owner.post("/api/webhooks/", {**body, "url": url}, format="json")
        assert resp.status_code == 400 and "url" in resp.json(), url  # ::1 is not in 127/8


@pytest.mark.django_db
def test_a_host_resolving_to_loopback_is_refused_at_delivery(
    people, sim_config, receiver, settings
) -> None:
    """A webhook stored before the rules (or whose name resolves elsewhere since): each
    attempt checks again, and nothing is sent."""
    settings.GYRE_WEBHOOK_ALLOW_NETS = []
    port = receiver.server.server_port
    for url in (f"http://localhost:{port}/h", receiver.url):
        Webhook.objects.create(team=people["team"], url=url, events=["failed"])
    _ended(people["team"], sim_config, "r")
    assert alerts.deliver_due() == 0
    assert receiver.posts == []
    rows = Delivery.objects.values_list("state", "last_result", "last_error")
    assert list(rows) == [("pending", "failed", "refused address")] * 2


@pytest.mark.django_db
def test_the_post_goes_to_the_address_checked(people, sim_config, receiver, settings, monkeypatch):
    """A name that resolves to an allowed address when checked and to another a moment
    later (DNS rebinding) is posted to the first, with its own name as Host."""
    settings.GYRE_WEBHOOK_ALLOW_NETS = ["127.0.0.1/32"]
    real, calls = socket.getaddrinfo, []

    def rebinding(host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        if host != "hook.example":
            return real(host, port, *args, **kwargs)
        calls.append(host)
        return real("127.0.0.1" if len(calls) == 1 else "127.0.0.2", port, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", rebinding)
    port = receiver.server.server_port
    assert net.post(f"http://hook.example:{port}/h", {"x": 1}, timeout=3) == ("2xx", "")
    assert receiver.posts == [{"x": 1}] and receiver.hosts == [f"hook.example:{port}"]
    assert net.post(f"http://hook.example:{port}/h", {"x": 2}, timeout=3) == (
        "failed",
        "refused address",  # 127.0.0.2 is not in the allowed range
    )


@pytest.mark.django_db
def test_a_webhook_at_a_non_http_port_fails_alone(people, sim_config, receiver, settings) -> None:
    """A server that answers garbage (http.client's BadStatusLine): its delivery records
    the failure and the others, queued after it, are delivered in the same pass."""
    settings.GYRE_WEBHOOK_ALLOW_NETS = LOOPBACK
    garbage = Hostile(_garbage)
    try:
        alerts.create_webhook(team=people["team"], url=garbage.url, events=["failed"])
        alerts.create_webhook(team=people["other_team"], url=receiver.url, events=["failed"])
        _ended(people["team"], sim_config, "a")
        b_run = _ended(people["other_team"], sim_config, "b")
        assert alerts.deliver_due() == 1
    finally:
        garbage.close()
    assert [p["run"]["id"] for p in receiver.posts] == [b_run.pk]
    rows = Delivery.objects.order_by("pk").values_list("state", "attempts", "last_result",
                                                       "last_error")  # fmt: skip
    assert list(rows) == [
        ("pending", 1, "failed", "not an HTTP answer"),  # no banner text in the log
        ("delivered", 1, "2xx", ""),
    ]


def _heartbeats(run_id: int, seconds: float) -> list[float]:
    seen: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        at = Run.objects.filter(pk=run_id).values_list("heartbeat_at", flat=True).get()
        if at is not None and (not seen or at.timestamp() != seen[-1]):
            seen.append(at.timestamp())
        time.sleep(0.05)
    return seen


@pytest.mark.django_db(transaction=True)
def test_hostile_webhooks_delay_neither_another_team_nor_the_heartbeats(
    people, sim_config, receiver, settings
) -> None:
    """Team A's webhooks: two that never answer, one that trickles, one at a non-HTTP
    port and a 302 to loopback, more than the two posts at once allowed. Team B's alert
    arrives within one tick, the watchdog's heartbeats keep their period, and A's log
    shows classes, not the targets' words."""
    from workers.watchdog import Watchdog

    other_team = people["other_team"]
    settings.GYRE_WEBHOOK_ALLOW_NETS = LOOPBACK
    settings.GYRE_HEARTBEAT_SECONDS, settings.GYRE_REAPER_SECONDS = 0.25, 2.0
    settings.GYRE_WEBHOOK_TIMEOUT_SECONDS, settings.GYRE_WEBHOOK_WORKERS = 3.0, 2
    stop = threading.Event()
    inner = Receiver([])  # what the 302 points at: must get nothing
    hostile = [
        Hostile(_silent(stop)),
        Hostile(_silent(stop)),
        Hostile(_trickle(stop)),
        Hostile(_garbage),
        Hostile(_redirect(inner.url)),
    ]
    for h in hostile:  # registered first: the oldest deliveries
        alerts.create_webhook(team=people["team"], url=h.url, events=["failed"])
    alerts.create_webhook(team=other_team, url=receiver.url, events=["failed"])
    held = services.create_run(
        experiment=services.create_experiment(team=other_team, name="held"),
        config=sim_config,
        launch=False,
    )
    services.transition(held.pk, Status.STARTING)
    services.transition(held.pk, Status.RUNNING)
    Run.objects.filter(pk=held.pk).update(celery_task_id="task-held")
    _ended(people["team"], sim_config, "a")
    b_run = _ended(other_team, sim_config, "b")
    dog = Watchdog()
    started = time.monotonic()
    try:
        dog.hold("task-held", held.pk)
        beats = _heartbeats(held.pk, 5.0)
        while not receiver.posts and time.monotonic() - started < 10:
            time.sleep(0.05)
        arrived = receiver.arrived_at - started if receiver.posts else None
    finally:
        dog.stop()
        stop.set()
        for h in hostile:
            h.close()
        inner.server.shutdown()
    assert [p["run"]["id"] for p in receiver.posts] == [b_run.pk]
    assert arrived is not None and arrived < settings.GYRE_REAPER_SECONDS, arrived
    gaps = [b - a for a, b in itertools.pairwise(beats)]
    assert len(beats) >= 12 and max(gaps) < 1.0, gaps  # a beat every 0.25 s
    assert inner.posts == []  # the redirect was not followed
    log = {
        d.webhook.url: (d.last_result, d.last_error)
        for d in Delivery.objects.select_related("webhook").filter(webhook__team=people["team"])
    }
    assert log == {
        hostile[0].url: ("failed", "timeout"),
        hostile[1].url: ("failed", "timeout"),
        hostile[2].url: ("failed", "timeout"),
        hostile[3].url: ("failed", "not an HTTP answer"),
        hostile[4].url: ("3xx", ""),
    }


@pytest.mark.django_db(transaction=True)
def test_two_deliverers_never_post_one_delivery_twice(people, sim_config, settings) -> None:
    """Every post answers 500, the first one slowly: two deliverers run at once, and
    every delivery gets one attempt (the old code's slow deliverer went on to re-post the
    deliveries the other had just tried)."""
    settings.GYRE_WEBHOOK_ALLOW_NETS = LOOPBACK
    settings.GYRE_WEBHOOK_WORKERS = 2
    slow = Receiver([500] * 100, delays=[1.5] + [0.1] * 20)
    try:
        for i in range(8):  # eight webhooks: eight deliveries of one ending
            alerts.create_webhook(team=people["team"], url=f"{slow.url}/{i}", events=["failed"])
        run = _ended(people["team"], sim_config, "r")
        go = threading.Barrier(2)

        def deliverer() -> None:
            try:
                go.wait()
                alerts.deliver_due()
            finally:
                connection.close()

        threads = [threading.Thread(target=deliverer) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        slow.server.shutdown()
    assert sorted(slow.paths) == sorted(f"/hook/{i}" for i in range(8))  # each once
    assert all(p["run"]["id"] == run.pk for p in slow.posts)
    assert set(Delivery.objects.values_list("attempts", "last_result")) == {(1, "5xx")}

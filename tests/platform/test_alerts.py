"""Webhooks: registered by a team's owners and admins, called when one of its runs ends
(the endings each subscribes to), Slack-compatible, retried with backoff, every attempt in
the delivery log."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from django.utils import timezone
from gyre_web.alerts import services as alerts
from gyre_web.alerts.models import Delivery
from gyre_web.runs import services
from gyre_web.runs.models import Status

from tests.receiver import Receiver

pytestmark = pytest.mark.django_db


@pytest.fixture
def loopback_allowed(settings: Any) -> None:
    settings.GYRE_WEBHOOK_ALLOW_NETS = ["127.0.0.0/8"]  # these receivers listen on loopback


@pytest.fixture
def receiver(loopback_allowed: None) -> Iterator[Receiver]:
    r = Receiver([500])  # the first post fails
    yield r
    r.server.shutdown()


def _ended(people: Any, config: dict[str, Any], status: str, name: str = "r") -> Any:
    exp = services.create_experiment(team=people["team"], name=f"e-{name}")
    run = services.create_run(experiment=exp, config=config, name=name, launch=False)
    services.transition(run.pk, Status.STARTING)
    services.transition(run.pk, Status.RUNNING)
    return services.transition(run.pk, status, error="boom" if status == "failed" else "")


def test_a_run_that_ends_calls_its_team_s_webhook_with_retries(
    people, sim_config, client_for, receiver
) -> None:
    owner = client_for(people["owner"])
    body = {"team": people["team"].pk, "url": receiver.url, "events": ["succeeded", "failed"]}
    made = owner.post("/api/webhooks/", body, format="json")
    assert made.status_code == 201, made.json()
    hook = made.json()["id"]
    run = _ended(people, sim_config, Status.SUCCEEDED, name="nightly")
    _ended(people, sim_config, Status.CANCELLED, name="stopped")  # not subscribed
    assert Delivery.objects.count() == 1
    assert alerts.deliver_due() == 0  # the receiver answers 500 first
    d = Delivery.objects.get()
    assert (d.state, d.attempts, d.last_result, d.last_error) == ("pending", 1, "5xx", "")
    assert d.next_attempt_at > timezone.now()  # backoff
    assert alerts.deliver_due() == 0  # not due yet
    Delivery.objects.update(next_attempt_at=timezone.now())
    assert alerts.deliver_due() == 1
    assert len(receiver.posts) == 2 and receiver.posts[0] == receiver.posts[1]
    post = receiver.posts[-1]
    assert "nightly" in post["text"] and "succeeded" in post["text"]  # what Slack shows
    assert post["run"]["id"] == run.pk and post["run"]["status"] == "succeeded"
    log = client_for(people["viewer"]).get(f"/api/webhooks/{hook}/deliveries/").json()
    assert [(x["state"], x["attempts"], x["last_result"]) for x in log] == [("delivered", 2, "2xx")]
    assert receiver.hosts[-1] == receiver.url.split("/")[2]  # the URL's host, as given


def test_an_unreachable_webhook_fails_after_its_attempts(
    people, sim_config, loopback_allowed
) -> None:
    alerts.create_webhook(team=people["team"], url="http://127.0.0.1:9/", events=["failed"])
    _ended(people, sim_config, Status.FAILED)
    for _ in range(alerts.MAX_ATTEMPTS):
        Delivery.objects.update(next_attempt_at=timezone.now())
        alerts.deliver_due()
    d = Delivery.objects.get()
    assert (d.state, d.attempts) == ("failed", alerts.MAX_ATTEMPTS)
    # a reason class, not the socket's words ("Connection refused" would map a port)
    assert (d.last_result, d.last_error) == ("failed", "connection error")
    assert "boom" in d.body["text"]  # a failed run's message is in the alert


def test_only_managers_register_and_bad_input_names_the_field(people, client_for) -> None:
    body = {"team": people["team"].pk, "url": "http://example.test/h", "events": ["failed"]}
    assert (
        client_for(people["member"]).post("/api/webhooks/", body, format="json").status_code == 403
    )
    admin = client_for(people["admin"])
    bad = admin.post("/api/webhooks/", {**body, "events": ["exploded"]}, format="json")
    assert bad.status_code == 400 and "events" in bad.json()
    ftp = admin.post("/api/webhooks/", {**body, "url": "ftp://example.test/"}, format="json")
    assert ftp.status_code == 400 and "url" in ftp.json()

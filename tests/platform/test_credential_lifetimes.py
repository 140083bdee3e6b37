"""API tokens and share links expire: at an expiry asked at creation (in the future, within
the operator's lifetime) or after the operator's default lifetime (GYRE_TOKEN_TTL_DAYS,
GYRE_SHARE_TTL_DAYS; 0 = never); an expired one is refused like a revoked one (401), on a
request and on an open websocket's re-check. A token cannot create tokens, so revoking it
leaves no credential behind."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from gyre_web.runs import services
from gyre_web.teams import selectors
from gyre_web.teams.models import ApiToken, ShareLink
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db


@pytest.fixture
def run(people, sim_config):
    exp = services.create_experiment(team=people["team"], name="lifetimes")
    return services.create_run(experiment=exp, config=sim_config, launch=False)


def _expire(model, pk: int) -> None:
    model.objects.filter(pk=pk).update(expires_at=timezone.now() - timedelta(seconds=1))


def test_an_expired_token_and_share_link_are_refused(people, run, client_for):
    me = client_for(people["member"])
    token = me.post("/api/tokens/", {"name": "ci"}, format="json").json()
    link = me.post("/api/share-links/", {"run": run.pk}, format="json").json()
    assert token["expires_at"] is None and link["expires_at"] is None  # default lifetime 0
    script, anon = APIClient(), APIClient()
    auth = {"HTTP_AUTHORIZATION": f"Token {token['key']}"}
    share = {"HTTP_X_GYRE_SHARE": link["key"]}
    assert script.get(f"/api/runs/{run.pk}/", **auth).status_code == 200
    assert anon.get(f"/api/runs/{run.pk}/", **share).status_code == 200
    _expire(ApiToken, token["id"])
    _expire(ShareLink, link["id"])
    resp = script.get(f"/api/runs/{run.pk}/", **auth)
    assert resp.status_code == 401 and "expired" in resp.json()["detail"]
    assert anon.get(f"/api/runs/{run.pk}/", **share).status_code == 401
    lost = selectors.credentials_lost  # what an open websocket re-checks
    assert lost(token_id=token["id"], link_id=None, user_id=people["member"].pk, session_key=None)
    assert lost(token_id=None, link_id=link["id"], user_id=None, session_key=None)


def test_the_operator_lifetime_is_the_default_and_the_bound(people, run, client_for, settings):
    settings.GYRE_TOKEN_TTL_DAYS, settings.GYRE_SHARE_TTL_DAYS = 30, 7
    me = client_for(people["member"])
    before = timezone.now()
    token = ApiToken.objects.get(
        pk=me.post("/api/tokens/", {"name": "a"}, format="json").json()["id"]
    )
    assert timedelta(days=30) <= token.expires_at - before < timedelta(days=30, minutes=1)
    link_id = me.post("/api/share-links/", {"run": run.pk}, format="json").json()["id"]
    link = ShareLink.objects.get(pk=link_id)
    assert timedelta(days=7) <= link.expires_at - before < timedelta(days=7, minutes=1)
    soon = (timezone.now() + timedelta(days=2)).isoformat()
    resp = me.post("/api/share-links/", {"run": run.pk, "expires_at": soon}, format="json")
    assert resp.status_code == 201, resp.content
    assert ShareLink.objects.get(pk=resp.json()["id"]).expires_at < before + timedelta(days=3)
    for when, words in [(timezone.now() + timedelta(days=8), "at most 7 days"),
                        (timezone.now() - timedelta(hours=1), "in the future")]:  # fmt: skip
        body = {"run": run.pk, "expires_at": when.isoformat()}
        resp = me.post("/api/share-links/", body, format="json")
        assert resp.status_code == 400 and words in resp.json()["expires_at"][0], resp.content
    late = (timezone.now() + timedelta(days=31)).isoformat()
    resp = me.post("/api/tokens/", {"name": "b", "expires_at": late}, format="json")
    assert resp.status_code == 400 and "GYRE_TOKEN_TTL_DAYS" in resp.json()["expires_at"][0]


def test_a_token_cannot_mint_tokens(people, client_for):
    me = client_for(people["member"])
    parent = me.post("/api/tokens/", {"name": "parent"}, format="json").json()
    script = APIClient()
    script.credentials(HTTP_AUTHORIZATION=f"Token {parent['key']}")
    resp = script.post("/api/tokens/", {"name": "child"}, format="json")
    assert resp.status_code == 403 and "sign in" in resp.json()["detail"]
    assert ApiToken.objects.filter(user=people["member"]).count() == 1
    assert me.delete(f"/api/tokens/{parent['id']}/").status_code == 204
    assert script.get("/api/teams/").status_code == 401
    assert not ApiToken.objects.filter(user=people["member"], revoked_at__isnull=True).exists()

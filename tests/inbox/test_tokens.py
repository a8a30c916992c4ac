"""Inbox tokens: issued by the tenant API for one subscriber, accepted only on /inbox/v1/; expired,
revoked, forged or foreign tokens are 401, and a token never opens the tenant API."""

from __future__ import annotations

import base64

import pytest

from inbox import tokens
from tests.conftest import client_for
from tests.inbox.support import subscriber

pytestmark = pytest.mark.django_db


def issue(api, external_id: str = "jane", **body: object) -> dict:  # noqa: ANN001
    made = api.post(f"/api/v1/subscribers/{external_id}/inbox-token", body, format="json")
    assert made.status_code == 201, made.content
    return made.json()


def inbox(token: str):  # noqa: ANN201
    return client_for(None), {"HTTP_AUTHORIZATION": f"Bearer {token}"}


def counts(token: str) -> int:
    client, headers = inbox(token)
    return client.get("/inbox/v1/counts", **headers).status_code


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    moved = Clock(1_800_000_000.0)
    monkeypatch.setattr(tokens, "clock", moved)
    return moved


def test_a_token_opens_the_subscribers_inbox_and_expires(api_a, clock):
    subscriber(api_a)
    made = issue(api_a)
    assert made["token"].startswith("ibx_")
    assert made["expires_at"] == "2027-01-16T08:00:00Z"  # 1,800,000,000 + 86,400 s
    assert counts(made["token"]) == 200
    short = issue(api_a, ttl_seconds=60)["token"]
    clock.now += 59
    assert counts(short) == 200
    clock.now += 1
    assert counts(short) == 401
    assert counts(made["token"]) == 200
    clock.now += 86400
    assert counts(made["token"]) == 401


@pytest.mark.parametrize("ttl", [0, -1, 604801, "60", 1.5, True])
def test_a_bad_ttl_is_400(api_a, ttl):
    subscriber(api_a)
    made = api_a.post("/api/v1/subscribers/jane/inbox-token", {"ttl_seconds": ttl}, format="json")
    assert made.status_code == 400
    assert "ttl_seconds" in made.json()["error"]["details"]


def test_the_longest_ttl_is_a_week(api_a, clock):
    subscriber(api_a)
    token = issue(api_a, ttl_seconds=604800)["token"]
    clock.now += 604799
    assert counts(token) == 200


def test_revoke_refuses_every_token_issued_until_then(api_a, clock):
    subscriber(api_a)
    subscriber(api_a, "joe")
    old, other = issue(api_a)["token"], issue(api_a, "joe")["token"]
    assert api_a.post("/api/v1/subscribers/jane/inbox-token/revoke").status_code == 204
    assert counts(old) == 401
    assert counts(other) == 200  # another subscriber's tokens stay good
    fresh = issue(api_a)["token"]  # issued after the revocation, at the same clock reading
    assert counts(fresh) == 200
    assert api_a.post("/api/v1/subscribers/jane/inbox-token/revoke").status_code == 204
    assert counts(fresh) == 401 and counts(old) == 401


def test_a_deleted_subscribers_tokens_are_401(api_a):
    subscriber(api_a)
    token = issue(api_a)["token"]
    assert counts(token) == 200
    assert api_a.delete("/api/v1/subscribers/jane").status_code == 204
    assert counts(token) == 401


def test_unknown_or_foreign_subscribers_get_no_token(api_a, api_b):
    subscriber(api_b)
    assert api_a.post("/api/v1/subscribers/jane/inbox-token", {}, format="json").status_code == 404
    assert api_a.post("/api/v1/subscribers/jane/inbox-token/revoke").status_code == 404
    assert client_for(None).post("/api/v1/subscribers/jane/inbox-token", {}, format="json").status_code == 401


def test_forged_and_tampered_tokens_are_401(api_a, tenant_b):
    subscriber(api_a)
    token = issue(api_a)["token"]
    body, signature = token[4:].split(".")
    payload = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)).decode()
    other = payload.rsplit(":", 1)[0] + ":joe"
    tampered = "ibx_" + base64.urlsafe_b64encode(other.encode()).rstrip(b"=").decode() + "." + signature
    foreign_tenant = payload.replace(payload.split(":")[0], tenant_b.pk.hex)
    moved = "ibx_" + base64.urlsafe_b64encode(foreign_tenant.encode()).rstrip(b"=").decode() + "." + signature
    for bad in (tampered, moved, token[:-2], "ibx_", "ibx_x.y", "op_abcdefgh_" + "a" * 40, token + "x" * 2000):
        assert counts(bad) == 401, bad
    client = client_for(None)
    assert client.get("/inbox/v1/counts").status_code == 401
    assert client.get("/inbox/v1/counts", HTTP_AUTHORIZATION="Basic abc").status_code == 401


def test_a_token_never_opens_the_tenant_api(api_a):
    subscriber(api_a)
    token = issue(api_a)["token"]
    for path in ("/api/v1/notifications", "/api/v1/subscribers", "/api/v1/subscribers/jane"):
        assert client_for(None).get(path, HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 401
    assert client_for(None).post("/api/v1/subscribers/jane/inbox-token", {}, format="json",
                                 HTTP_AUTHORIZATION=f"Bearer {token}").status_code == 401  # fmt: skip

"""Unsubscribe tokens revoked one by one: `POST unsubscribe-tokens/revoke` with one email's token (or its
link) makes that link a 400 that changes nothing, while every other email's link keeps working; a
tenant cannot revoke (or learn anything of) another tenant's tokens."""

from __future__ import annotations

import pytest
from django.test import Client

from core.models import AuditEvent
from recipients import unsubscribe
from recipients.models import RevokedUnsubscribeToken, Suppression

pytestmark = pytest.mark.django_db

EMAIL = "Jane.Doe@example.org"
REVOKE = "/api/v1/unsubscribe-tokens/revoke"


def one_click(token: str) -> int:
    return Client().post(f"/unsubscribe/{token}", {"List-Unsubscribe": "One-Click"}).status_code


def test_a_revoked_token_stops_working_and_the_others_do_not(api_a, tenant_a, settings):
    settings.OMNIPOST_PUBLIC_URL = "https://notify.example.com"
    leaked, other = (unsubscribe.make_token(tenant_a.pk, EMAIL, "news") for _ in range(2))
    assert leaked != other  # each email's token is its own

    response = api_a.post(REVOKE, {"token": unsubscribe.url(leaked)}, format="json")  # the whole link works too
    assert response.status_code == 200, response.content
    assert response.json() == {"revoked": True, "already_revoked": False, "category": "news",
                               "recipient_masked": "j***@example.org"}  # fmt: skip
    assert EMAIL.lower() not in response.content.decode().lower()
    assert AuditEvent.objects.filter(action="unsubscribe_token.revoked", tenant_id=tenant_a.pk).count() == 1
    again = api_a.post(REVOKE, {"token": leaked}, format="json")
    assert again.status_code == 200 and again.json()["already_revoked"] is True
    assert RevokedUnsubscribeToken.objects.count() == 1

    assert Client().get(f"/unsubscribe/{leaked}").status_code == 400
    assert one_click(leaked) == 400 and one_click(leaked + "==") == 400
    with pytest.raises(unsubscribe.BadToken):
        unsubscribe.unsubscribe(leaked)  # the bounce listener's mailto path
    assert not Suppression.objects.exists()

    assert one_click(other) == 200
    assert Suppression.objects.get().category == "news"


def test_another_tenants_or_a_forged_token_is_400_and_revokes_nothing(api_a, api_b, tenant_a):
    token = unsubscribe.make_token(tenant_a.pk, EMAIL, "news")
    flipped = token[:40] + ("A" if token[40] != "A" else "B") + token[41:]
    for client, value in ((api_b, token), (api_a, flipped), (api_a, "not-a-token"), (api_a, f"unsubscribe {token}x")):
        response = client.post(REVOKE, {"token": value}, format="json")
        assert response.status_code == 400 and "token" in response.json()["error"]["details"]
    assert not RevokedUnsubscribeToken.objects.exists()
    assert api_a.post(REVOKE, {"token": f"unsubscribe {token}"}, format="json").status_code == 200  # the mailto's
    assert api_a.post(REVOKE, {}, format="json").status_code == 400
    assert Client().post(REVOKE, {"token": token}, content_type="application/json").status_code == 401

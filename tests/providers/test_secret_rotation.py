"""A rotated webhook signing secret: the next send signs with it, and with the old one beside it
for OMNIPOST_SECRET_ROTATION_GRACE_SECONDS (not after), verified with the `standardwebhooks` package."""

from __future__ import annotations

import base64
import uuid
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.db import connection
from standardwebhooks import Webhook, WebhookVerificationError

from dispatch.dispatcher import Dispatcher, DispatcherConfig
from dispatch.providers import instantiate
from providers.kinds.base import OutboundMessage
from providers.models import Provider
from tests import factories
from tests.support.receivers import TEST_SIGNING_SECRET, HttpReceiver

PROVIDERS = "/api/v1/providers"
OLD = TEST_SIGNING_SECRET
NEW = "whsec_" + base64.b64encode(bytes(range(101, 133))).decode()
NEWER = "whsec_" + base64.b64encode(bytes(range(201, 233))).decode()


def create_hook(api, url: str = "http://127.0.0.1:9/hook", secret: str = OLD) -> None:
    response = api.post(PROVIDERS, {"name": "hook", "channel": "webhook", "kind": "webhook", "config": {"url": url},
                                    "secrets": {"signing_secret": secret}}, format="json")  # fmt: skip
    assert response.status_code == 201, response.json()


def rotate(api, secret: str) -> None:
    response = api.patch(f"{PROVIDERS}/hook", {"secrets": {"signing_secret": secret}}, format="json")
    assert response.status_code == 200, response.json()


def verifies(secret: str, head: bytes, body: bytes) -> bool:
    lines = head.decode().split("\r\n")[1:]
    headers = dict(line.split(": ", 1) for line in lines if ": " in line)
    try:
        Webhook(secret).verify(body, {k.lower(): v for k, v in headers.items()})
    except WebhookVerificationError:
        return False
    return True


def signed(row: Provider) -> tuple[bytes, bytes]:
    """The head and body the dispatcher's instance of `row` sends now."""
    message = OutboundMessage(notification_id=str(uuid.uuid4()), tenant_id="t", channel="webhook",
                              recipient="r", subject="s", body="b")  # fmt: skip
    return instantiate(row)._request(message)  # type: ignore[union-attr,return-value]


@pytest.mark.django_db
def test_a_rotation_keeps_the_old_secret_encrypted_with_its_time(tenant_a, api_a):
    create_hook(api_a)
    row = Provider.objects.get(name="hook")
    assert (row.previous_secrets, row.secrets_rotated_at) == (None, None)
    before = datetime.now(UTC)
    rotate(api_a, NEW)
    row.refresh_from_db()
    assert row.secrets == {"signing_secret": NEW}
    assert row.previous_secrets == {"signing_secret": OLD}
    assert before <= row.secrets_rotated_at <= datetime.now(UTC)
    with connection.cursor() as cursor:
        cursor.execute("SELECT previous_secrets FROM providers WHERE id = %s", [row.pk])
        stored = cursor.fetchone()[0]
    assert OLD not in stored and OLD[6:] not in stored, "stored encrypted, like the secrets"
    body = api_a.get(f"{PROVIDERS}/hook").json()
    assert OLD not in str(body) and NEW not in str(body) and "previous_secrets" not in body

    # Saving the same secret again, or only the config, is no rotation.
    rotated_at = row.secrets_rotated_at
    rotate(api_a, NEW)
    assert api_a.patch(f"{PROVIDERS}/hook", {"config": {"url": "http://127.0.0.1:9/other"}},
                       format="json").status_code == 200  # fmt: skip
    row.refresh_from_db()
    assert (row.previous_secrets, row.secrets_rotated_at) == ({"signing_secret": OLD}, rotated_at)

    # A second rotation keeps the secret it replaced.
    rotate(api_a, NEWER)
    row.refresh_from_db()
    assert row.previous_secrets == {"signing_secret": NEW} and row.secrets_rotated_at > rotated_at


@pytest.mark.django_db
def test_both_signatures_during_the_grace_and_only_the_new_one_after(tenant_a, api_a, settings):
    settings.OMNIPOST_SECRET_ROTATION_GRACE_SECONDS = 86400  # the default
    create_hook(api_a)
    head, body = signed(Provider.objects.get(name="hook"))
    assert b"webhook-signature: v1," in head and head.count(b"v1,") == 1
    assert verifies(OLD, head, body) and not verifies(NEW, head, body)

    rotate(api_a, NEW)
    row = Provider.objects.get(name="hook")
    head, body = signed(row)
    assert head.count(b"v1,") == 2  # `v1,<new> v1,<old>`
    assert verifies(NEW, head, body) and verifies(OLD, head, body)

    with time_machine.travel(row.secrets_rotated_at + timedelta(seconds=86400 - 5), tick=False):
        head, body = signed(row)
        assert verifies(NEW, head, body) and verifies(OLD, head, body)
    with time_machine.travel(row.secrets_rotated_at + timedelta(seconds=86400 + 1), tick=False):
        head, body = signed(row)
        assert verifies(NEW, head, body) and not verifies(OLD, head, body)
        assert head.count(b"v1,") == 1


@pytest.mark.django_db
def test_an_instance_built_during_the_grace_stops_signing_with_the_old_secret_once_it_ends(tenant_a, api_a, settings):
    """The dispatcher keeps an instance while its row is unchanged: the grace is checked at each send."""
    settings.OMNIPOST_SECRET_ROTATION_GRACE_SECONDS = 60
    create_hook(api_a)
    rotate(api_a, NEW)
    row = Provider.objects.get(name="hook")
    instance = instantiate(row)
    message = OutboundMessage(notification_id=str(uuid.uuid4()), tenant_id="t", channel="webhook",
                              recipient="r", subject="s", body="b")  # fmt: skip
    with time_machine.travel(row.secrets_rotated_at + timedelta(seconds=59), tick=False):
        assert verifies(OLD, *instance._request(message))
    with time_machine.travel(row.secrets_rotated_at + timedelta(seconds=61), tick=False):
        head, body = instance._request(message)
        assert verifies(NEW, head, body) and not verifies(OLD, head, body)


@pytest.mark.django_db
def test_the_old_secret_is_scrubbed_from_error_texts_too(tenant_a, api_a):
    create_hook(api_a)
    rotate(api_a, NEW)
    instance = instantiate(Provider.objects.get(name="hook"))
    assert OLD in instance._secret_values() and NEW in instance._secret_values()


@pytest.mark.django_db(transaction=True)
def test_the_next_send_after_a_rotation_verifies_with_the_new_secret_and_the_old(tenant_a, api_a):
    with HttpReceiver(secret=NEW, max_seconds=60) as receiver:
        create_hook(api_a, url=receiver.url)
        rotate(api_a, NEW)
        prov = Provider.objects.get(name="hook")
        [note] = factories.queued(tenant_a, prov, 1)
        assert Dispatcher(DispatcherConfig(once=True, jitter=False)).run() == 0
        assert receiver.wait_for(1)
        [request] = receiver.requests
    assert request.verified and request.status == 200 and request.webhook_id == str(note.id)
    assert request.headers["webhook-signature"].count("v1,") == 2
    Webhook(OLD).verify(request.body, request.headers)  # a receiver that has not switched yet
    Webhook(NEW).verify(request.body, request.headers)

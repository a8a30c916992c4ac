"""Providers of the native push kinds through the API: config and secrets exactly as documented,
checked at creation with a 400 that names the field; secrets read back masked."""

from __future__ import annotations

import json

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from tests.push.standins import b64url

pytestmark = pytest.mark.django_db

PROVIDERS = "/api/v1/providers"
EC_KEY = ec.generate_private_key(ec.SECP256R1())
EC_PEM = EC_KEY.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()).decode()  # fmt: skip
VAPID_PUBLIC = b64url(EC_KEY.public_key().public_bytes(serialization.Encoding.X962,
                                                       serialization.PublicFormat.UncompressedPoint))  # fmt: skip
VAPID_RAW = b64url(EC_KEY.private_numbers().private_value.to_bytes(32, "big"))
RSA_PEM = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
    serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()  # fmt: skip
ACCOUNT = json.dumps({"type": "service_account", "client_email": "a@p.iam.gserviceaccount.com", "private_key": RSA_PEM})


def apns(**config: object) -> dict:
    return {"name": "ios", "channel": "push", "kind": "apns",
            "config": {"team_id": "TEAM123456", "key_id": "KEY1234567", "topic": "com.example.app", **config},
            "secrets": {"private_key": EC_PEM}}  # fmt: skip


def fcm(**config: object) -> dict:
    return {"name": "android", "channel": "push", "kind": "fcm", "config": {"project_id": "my-app-1234", **config},
            "secrets": {"service_account_json": ACCOUNT}}  # fmt: skip


def webpush(**config: object) -> dict:
    return {"name": "browsers", "channel": "push", "kind": "webpush",
            "config": {"subject": "mailto:ops@example.com", "vapid_public_key": VAPID_PUBLIC, **config},
            "secrets": {"vapid_private_key": VAPID_RAW}}  # fmt: skip


def test_each_kind_is_created_with_defaults_and_masked_secrets(api_a):
    made = api_a.post(PROVIDERS, apns(), format="json")
    assert made.status_code == 201, made.content
    assert made.json()["config"]["base_url"] == "https://api.push.apple.com"
    assert EC_PEM[40:80] not in made.content.decode()
    made = api_a.post(PROVIDERS, fcm(), format="json")
    assert made.status_code == 201, made.content
    assert made.json()["config"] == {"project_id": "my-app-1234", "base_url": "https://fcm.googleapis.com",
                                     "token_url": "https://oauth2.googleapis.com/token"}  # fmt: skip
    assert RSA_PEM[40:80] not in made.content.decode()
    made = api_a.post(PROVIDERS, webpush(), format="json")
    assert made.status_code == 201, made.content
    assert VAPID_RAW not in made.content.decode()
    pem = dict(webpush(), name="browsers-pem", secrets={"vapid_private_key": EC_PEM})
    assert api_a.post(PROVIDERS, pem, format="json").status_code == 201


OTHER_KEY = b64url(ec.generate_private_key(ec.SECP256R1()).private_numbers().private_value.to_bytes(32, "big"))


@pytest.mark.parametrize(
    ("body", "section", "field"),
    [
        (apns(team_id="short"), "config", "team_id"),
        (apns(key_id=None), "config", "key_id"),
        (apns(topic=""), "config", "topic"),
        (apns(base_url="http://api.push.apple.com"), "config", "base_url"),
        (apns(base_url="https://api.push.apple.com/3/device"), "config", "base_url"),
        (apns(ca_file="/nonexistent/ca.pem"), "config", "ca_file"),
        (apns(extra=1), "config", "extra"),
        (dict(apns(), secrets={"private_key": "-----BEGIN PRIVATE KEY-----\nxx\n-----END PRIVATE KEY-----"}),
         "secrets", "private_key"),
        (dict(apns(), secrets={"private_key": RSA_PEM}), "secrets", "private_key"),
        (dict(apns(), secrets={}), "secrets", "private_key"),
        (fcm(project_id="Bad Id"), "config", "project_id"),
        (fcm(base_url="ftp://x"), "config", "base_url"),
        (fcm(token_url="https://x.example/t?x=1"), "config", "token_url"),
        (dict(fcm(), secrets={"service_account_json": "{"}), "secrets", "service_account_json"),
        (dict(fcm(), secrets={"service_account_json": json.dumps({"client_email": "a@b", "private_key": EC_PEM})}),
         "secrets", "service_account_json"),
        (webpush(subject="ops@example.com"), "config", "subject"),
        (webpush(vapid_public_key="AAAA"), "config", "vapid_public_key"),
        (dict(webpush(), secrets={"vapid_private_key": OTHER_KEY}), "secrets", "vapid_private_key"),
        (dict(webpush(), secrets={"vapid_private_key": "c2hvcnQ"}), "secrets", "vapid_private_key"),
        (dict(webpush(), channel="email"), "channel", None),
    ],
)  # fmt: skip
def test_bad_config_is_400_naming_the_field(api_a, body, section, field):
    response = api_a.post(PROVIDERS, body, format="json")
    assert response.status_code == 400, response.content
    details = response.json()["error"]["details"]
    assert section in details, details
    if field is not None:
        assert field in details[section], details


def test_a_push_service_on_a_private_address_is_refused_at_creation(api_a, settings):
    settings.OMNIPOST_ALLOW_PRIVATE_DESTINATIONS = False
    response = api_a.post(PROVIDERS, apns(base_url="https://127.0.0.1:8443"), format="json")
    assert response.status_code == 400 and "base_url" in response.json()["error"]["details"]["config"]
    response = api_a.post(PROVIDERS, fcm(base_url="https://8.8.8.8", token_url="https://10.0.0.1/token"), format="json")
    assert response.status_code == 400 and "token_url" in response.json()["error"]["details"]["config"]

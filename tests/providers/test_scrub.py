"""scrub(): the recipient and the provider's secrets, in every form a provider echoes, replaced by masks."""

from __future__ import annotations

import json
from urllib.parse import quote, quote_plus

import pytest

from providers.scrub import forms, scrub, secret_values

EMAIL = "Jane.Doe+orders@Example.com"
TOKEN = "cust_8Kq2ZpL0xV7w/Ab+c=="  # a webhook recipient: no pattern would recognise it
PHONE = "+15551234567"
WHSEC = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
KEY = WHSEC.removeprefix("whsec_")
SMTP_PASSWORD = "correct horse battery staple"
TWILIO_TOKEN = "9f3c1e8a7b6d5c4e3f2a1b0c9d8e7f6a"
SECRETS = secret_values({"signing_secret": WHSEC, "password": SMTP_PASSWORD, "auth_token": TWILIO_TOKEN})

CASES = [
    # (recipient, channel, text) — the recipient or a secret in each form a provider might echo
    (EMAIL, "email", f"550 no such user {EMAIL}"),
    (EMAIL, "email", f"550 no such user {EMAIL.lower()}"),
    (EMAIL, "email", f"550 NO SUCH USER {EMAIL.upper()}"),
    (EMAIL, "email", f"GET /check?to={quote(EMAIL)}"),
    (EMAIL, "email", f"GET /check?to={quote(EMAIL, safe='')}"),
    (EMAIL, "email", f"GET /check?to={quote_plus(EMAIL)}"),
    (EMAIL, "email", f"GET /check?to={quote_plus(EMAIL).lower()}"),  # lower-case hex escapes
    (EMAIL, "email", json.dumps({"error": "bad", "to": EMAIL})),
    (TOKEN, "webhook", json.dumps({"error": "unknown customer", "recipient": TOKEN})),
    (TOKEN, "webhook", json.dumps({"recipient": TOKEN}).replace("/", "\\/")),
    (TOKEN, "webhook", f"unknown customer {quote(TOKEN, safe='')}"),
    (TOKEN, "webhook", f"<p>unknown {TOKEN.replace('+', '&#43;')}</p>".replace("&#43;", "+")),
    (PHONE, "sms", f"21211: invalid 'To' number {PHONE}"),
    (PHONE, "sms", f"21211: invalid 'To' number {quote_plus(PHONE)}"),
    (PHONE, "sms", json.dumps({"to": PHONE, "msg": "ünïcode"}, ensure_ascii=True)),
    (TOKEN, "webhook", f"HTTP 400: secret {WHSEC} rejected"),
    (TOKEN, "webhook", f"HTTP 400: key {KEY} rejected"),
    (TOKEN, "webhook", f"HTTP 400: key {quote(KEY, safe='')} rejected"),
    (TOKEN, "webhook", f"535 authentication failed for password {SMTP_PASSWORD!r}"),
    (TOKEN, "webhook", f"535 authentication failed: {quote_plus(SMTP_PASSWORD)}"),
    (TOKEN, "webhook", f"20003 authenticate: token={TWILIO_TOKEN.upper()}"),
    # cut off by a length bound (the webhook provider keeps 200 bytes of the body)
    (TOKEN, "webhook", f"HTTP 400 Bad Request: {{\"recipient\": \"{TOKEN[:12]}"),
    (TOKEN, "webhook", f"HTTP 400 Bad Request: secret {WHSEC[:20]}…"),
]


@pytest.mark.parametrize(("recipient", "channel", "text"), CASES)
def test_no_form_of_the_recipient_or_a_secret_survives(recipient, channel, text):
    out = scrub(text, recipient, SECRETS, channel=channel)
    lowered = out.lower()
    for value in (recipient, *SECRETS):
        for form in forms(value):
            assert form.lower() not in lowered, (form, out)
        assert value[:12].lower() not in lowered, out
    assert "***" in out


def test_masks_replace_values_and_the_rest_of_the_text_stays():
    assert scrub(f"550 no such user {EMAIL}", EMAIL, (), channel="email") == "550 no such user J***@Example.com"
    assert scrub(f"bad {TOKEN}!", TOKEN, ()) == "bad cust_****+c==!"
    assert scrub(f"key {WHSEC} / {KEY}", None, SECRETS) == "key ****LaSw / ****LaSw"
    assert scrub("HTTP 503 Service Unavailable", EMAIL, SECRETS) == "HTTP 503 Service Unavailable"
    assert scrub("", EMAIL, SECRETS) == ""


def test_short_values_and_secret_shapes():
    # Too short to be a secret: masking "abc" would eat ordinary words.
    assert secret_values({"password": "abc", "n": 3}) == ()
    assert secret_values({"signing_secret": WHSEC, "nested": {"api_key": "SG.abcdefgh"}, "list": ["tok123456"],
                          "enabled": True}) == (WHSEC, KEY, "SG.abcdefgh", "tok123456")  # fmt: skip
    assert secret_values(None) == ()
    assert scrub("a pa", "pa", ()) == "a pa"  # a recipient shorter than 3 characters is left alone

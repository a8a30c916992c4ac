"""Twilio status callbacks: signed with the `twilio` package, parsed by receipts.vendors.twilio.

The adapter's verdicts are held to the vendor's own signer (`RequestValidator.compute_signature`),
and a real send's `StatusCallback` (taken from the form the Twilio stand-in received) is the URL the
callback is signed over, so the notification id Twilio echoes is the one the send put in.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest
from twilio.request_validator import RequestValidator

from providers.kinds import build_provider
from receipts.inbound import ADAPTERS, InboundRequest, ProviderView, Rejected
from receipts.vendors import twilio as twilio_adapter
from tests.providers.test_twilio import FROM, SID, TOKEN, message
from tests.support.receivers import HttpReceiver

PUBLIC = "https://notify.example.com"
OTHER_TOKEN = "other-auth-token-fedcba9876543210"
MESSAGE_SID = "SM" + "0123456789abcdef" * 2
AT = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def view(provider_id: int = 7, token: str = TOKEN, previous: tuple[dict, ...] = ()) -> ProviderView:
    return ProviderView(
        id=provider_id,
        tenant_id=str(uuid.uuid4()),
        kind="twilio",
        config={"account_sid": SID, "from_number": FROM, "base_url": "https://api.twilio.com"},
        secrets={"auth_token": token},
        previous_secrets=previous,
    )


def callback_form(status: str = "delivered", **extra: str) -> dict[str, str]:
    form = {
        "AccountSid": SID,
        "ApiVersion": "2010-04-01",
        "From": FROM,
        "MessageSid": MESSAGE_SID,
        "MessageStatus": status,
        "SmsSid": MESSAGE_SID,
        "SmsStatus": status,
        "To": "+15551234567",
    }
    form.update(extra)
    return form


def signed(url: str, form: dict[str, str], token: str = TOKEN, *, post_to: str | None = None) -> InboundRequest:
    """The request as Twilio posts it: form-encoded, signed over `url` with `token`."""
    signature = RequestValidator(token).compute_signature(url, form)
    body = urlencode(form).encode()
    return InboundRequest(url=post_to or url, headers={"X-Twilio-Signature": signature}, body=body, form=form)


def url_for(notification_id: str, provider_id: int = 7) -> str:
    return f"{PUBLIC}/hooks/providers/{provider_id}?n={notification_id}"


def parse(request: InboundRequest, provider: ProviderView):
    return twilio_adapter.parse(request, provider, now=lambda: AT)


def test_registered_for_the_twilio_kind():
    assert ADAPTERS["twilio"] is twilio_adapter.parse


@pytest.mark.parametrize(
    ("status", "receipt"),
    [
        ("delivered", "delivered"),
        ("undelivered", "undelivered"),
        ("failed", "failed"),
        ("queued", None),
        ("accepted", None),
        ("sending", None),
        ("sent", None),
        ("read", None),
    ],
)
def test_message_status_maps_to_receipt(status, receipt):
    nid = str(uuid.uuid4())
    [r] = parse(signed(url_for(nid), callback_form(status)), view())
    assert (r.notification_id, r.type, r.receipt, r.bounce_type) == (nid, status, receipt, None)
    assert r.event_id == f"{MESSAGE_SID}:{status}"
    assert r.occurred_at == AT
    assert r.details == {"message_sid": MESSAGE_SID}


def test_error_code_goes_into_details_without_the_recipient():
    nid = str(uuid.uuid4())
    [r] = parse(signed(url_for(nid), callback_form("undelivered", ErrorCode="30003")), view())
    assert r.receipt == "undelivered"
    assert r.details == {
        "message_sid": MESSAGE_SID, "error_code": 30003, "error_message": "unreachable destination handset"
    }  # fmt: skip
    assert "5551234567" not in str(r.details)


def test_states_of_one_message_are_distinct_events_and_a_repeat_is_the_same_event():
    nid = str(uuid.uuid4())
    sent = parse(signed(url_for(nid), callback_form("sent")), view())[0]
    delivered = parse(signed(url_for(nid), callback_form("delivered")), view())[0]
    again = parse(signed(url_for(nid), callback_form("delivered")), view())[0]
    assert sent.dedup_key != delivered.dedup_key
    assert delivered.dedup_key == again.dedup_key == f"id:{MESSAGE_SID}:delivered"


def test_bad_or_missing_signature_is_rejected():
    request = signed(url_for(str(uuid.uuid4())), callback_form())
    forged = InboundRequest(request.url, {"X-Twilio-Signature": "AAAA" + request.headers["X-Twilio-Signature"][4:]},
                            request.body, request.form)  # fmt: skip
    with pytest.raises(Rejected):
        parse(forged, view())
    with pytest.raises(Rejected):
        parse(InboundRequest(request.url, {}, request.body, request.form), view())


def test_another_providers_auth_token_is_rejected():
    request = signed(url_for(str(uuid.uuid4())), callback_form(), token=OTHER_TOKEN)
    with pytest.raises(Rejected):
        parse(request, view())
    assert parse(request, view(token=OTHER_TOKEN))  # the same request is fine for the provider it was signed for


def test_posted_to_another_providers_url_is_rejected():
    nid = str(uuid.uuid4())
    request = signed(url_for(nid, provider_id=7), callback_form(), post_to=url_for(nid, provider_id=8))
    with pytest.raises(Rejected):
        parse(request, view(provider_id=8))


def test_an_altered_notification_id_or_field_is_rejected():
    nid = str(uuid.uuid4())
    request = signed(url_for(nid), callback_form("undelivered"))
    with pytest.raises(Rejected):
        parse(InboundRequest(url_for(str(uuid.uuid4())), request.headers, request.body, request.form), view())
    altered = {**request.form, "MessageStatus": "delivered", "SmsStatus": "delivered"}
    with pytest.raises(Rejected):
        parse(InboundRequest(request.url, request.headers, request.body, altered), view())


def test_a_callback_signed_for_another_account_is_rejected():
    form = callback_form(AccountSid="AC" + "f" * 32)
    with pytest.raises(Rejected):
        parse(signed(url_for(str(uuid.uuid4())), form), view())


def test_a_signed_request_that_is_no_status_callback_is_rejected():
    form = {"AccountSid": SID, "Body": "hello", "From": "+15551234567"}
    with pytest.raises(Rejected):
        parse(signed(url_for(str(uuid.uuid4())), form), view())


def test_the_previous_auth_token_still_verifies_during_a_rotation():
    request = signed(url_for(str(uuid.uuid4())), callback_form(), token=OTHER_TOKEN)
    assert parse(request, view(token=TOKEN, previous=({"auth_token": OTHER_TOKEN},)))


def test_url_with_explicit_default_port_verifies_as_twilio_signs_either_form():
    nid = str(uuid.uuid4())
    signed_over = f"https://notify.example.com:443/hooks/providers/7?n={nid}"
    request = signed(signed_over, callback_form(), post_to=url_for(nid))
    assert parse(request, view())[0].notification_id == nid


# --- the send side: StatusCallback ----------------------------------------------------------------


def sent_form(receiver: HttpReceiver, msg, **options) -> dict[str, list[str]]:
    async def run():
        provider = build_provider(
            "twilio",
            {"account_sid": SID, "from_number": FROM, "base_url": f"http://127.0.0.1:{receiver.port}"},
            {"auth_token": TOKEN},
            **options,
        )
        try:
            return await provider.send(msg)
        finally:
            await provider.aclose()

    result = asyncio.run(run())
    assert result.delivered, result
    return parse_qs(receiver.requests[-1].body.decode())


@pytest.fixture
def twilio_api():
    with HttpReceiver(status=201, body=b'{"sid": "SM0123456789abcdef0123456789abcdef", "status": "queued"}') as rx:
        yield rx


def test_every_send_sets_status_callback_to_the_events_url_with_the_notification(twilio_api, settings):
    settings.OMNIPOST_PUBLIC_URL = PUBLIC
    msg = message()
    form = sent_form(twilio_api, msg, provider_id=42)
    assert form["StatusCallback"] == [f"{PUBLIC}/hooks/providers/42?n={msg.notification_id}"]
    assert form["To"] == ["+15551234567"] and form["Body"] == ["Your code is 123456"]


def test_no_status_callback_without_a_public_url_or_provider_id(twilio_api, settings):
    settings.OMNIPOST_PUBLIC_URL = ""
    assert "StatusCallback" not in sent_form(twilio_api, message(), provider_id=42)
    settings.OMNIPOST_PUBLIC_URL = PUBLIC
    assert "StatusCallback" not in sent_form(twilio_api, message())


def test_a_callback_to_the_url_a_send_handed_out_names_that_notification(twilio_api, settings):
    settings.OMNIPOST_PUBLIC_URL = PUBLIC
    msg = message()
    [callback] = sent_form(twilio_api, msg, provider_id=7)["StatusCallback"]
    assert urlsplit(callback).path == "/hooks/providers/7"
    [r] = parse(signed(callback, callback_form("delivered")), view(provider_id=7))
    assert (r.notification_id, r.receipt) == (msg.notification_id, "delivered")


@pytest.mark.django_db
def test_the_dispatcher_builds_twilio_providers_with_their_id(tenant_a, settings):
    from dispatch.providers import instantiate
    from providers.models import Provider

    settings.OMNIPOST_PUBLIC_URL = PUBLIC
    row = Provider.objects.create(
        tenant=tenant_a, name="sms", channel="sms", kind="twilio",
        config={"account_sid": SID, "from_number": FROM, "base_url": "http://127.0.0.1:9"},
        secrets={"auth_token": TOKEN},
    )  # fmt: skip
    instance = instantiate(row)
    assert instance._status_callback == f"{PUBLIC}/hooks/providers/{row.pk}?n="
    asyncio.run(instance.aclose())


@pytest.mark.django_db
def test_changing_the_auth_token_keeps_the_old_one_for_callbacks(api_a):
    from providers.models import Provider

    body = {"name": "sms", "channel": "sms", "kind": "twilio", "secrets": {"auth_token": TOKEN},
            "config": {"account_sid": SID, "from_number": FROM, "base_url": "http://127.0.0.1:9"}}  # fmt: skip
    assert api_a.post("/api/v1/providers", body, format="json").status_code == 201
    response = api_a.patch("/api/v1/providers/sms", {"secrets": {"auth_token": OTHER_TOKEN}}, format="json")
    assert response.status_code == 200, response.content
    row = Provider.objects.get(name="sms")
    assert (row.secrets, row.previous_secrets) == ({"auth_token": OTHER_TOKEN}, {"auth_token": TOKEN})
    still_old = signed(url_for(str(uuid.uuid4()), row.pk), callback_form(), token=TOKEN)
    assert parse(still_old, view(row.pk, token=OTHER_TOKEN, previous=(row.previous_secrets,)))


@pytest.mark.parametrize(("sent", "kept"), [("30008", 30008), ("\u00b2\u00b2", "\u00b2\u00b2"), ("X1", "X1")])
def test_error_codes_that_are_no_number_are_kept_as_text(sent, kept):
    [r] = parse(signed(url_for(str(uuid.uuid4())), callback_form("failed", ErrorCode=sent)), view())
    assert r.details["error_code"] == kept

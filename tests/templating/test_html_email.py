"""HTML email end to end: a template with `html_body` created through the API, notifications created
through the API and sent by the real dispatcher (`--once`) to a real SMTP server (aiosmtpd), the SES v2
stand-in (which checks every SigV4 signature) and a SendGrid Mail Send stand-in, all on loopback.

The SMTP message is multipart/alternative: its text part is the rendered `body` (no markup, the
context unescaped), its HTML part escapes the context's `<script>`. SES gets Body.Text and Body.Html,
SendGrid text/plain then text/html. A notification is sent as the version it rendered, even when the
template changed before the dispatcher got to it."""

from __future__ import annotations

import pytest

from dispatch.dispatcher import Dispatcher, DispatcherConfig
from tests import factories
from tests.support.aws import SesStandIn
from tests.support.receivers import HttpReceiver

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

TO = "jane.doe@example.com"
FROM = "shop@omnipost.test"
SCRIPT = "<script>alert('x')</script>"
KEY_ID = "AKIAIOSFODNN7EXAMPLE"
SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
SENDGRID_KEY = "SG.abcdefghijklmnopqrstuv.0123456789abcdefghijklmnopqrstuvwxyzABCDE"
TEMPLATE = {
    "key": "order", "channel": "email", "subject": "Order {{ number }}",
    "body": "Hello {{ name }},\nyour order {{ number }} shipped.",
    "html_body": "<html><body><p>Hello <b>{{ name }}</b>,</p><p>order {{ number }} shipped.</p></body></html>",
}  # fmt: skip
CONTEXT = {"name": SCRIPT, "number": 42}
ESCAPED = "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;"


def smtp_provider(tenant, sink) -> None:  # noqa: ANN001
    config = {"host": "127.0.0.1", "port": sink.port, "from_email": FROM}
    factories.provider(tenant, "smtp", kind="smtp", channel="email", config=config)


def dispatch() -> None:
    assert Dispatcher(DispatcherConfig(once=True, jitter=False)).run() == 0


def send(api, provider: str, **fields) -> str:  # noqa: ANN001
    body = {"channel": "email", "recipient": TO, "provider": provider, "template": "order", "context": CONTEXT}
    response = api.post("/api/v1/notifications", {**body, **fields}, format="json")
    assert response.status_code == 201, response.content
    return response.json()["id"]


@pytest.fixture
def ses():
    with SesStandIn(access_key_id=KEY_ID, secret_access_key=SECRET, region="eu-west-1") as standin:
        yield standin


@pytest.fixture
def sendgrid():
    with HttpReceiver(status=202, body=b"", headers={"X-Message-Id": "W9yQ2v1dSmq3nuNqbkW8Ow"}) as rx:
        yield rx


def test_html_email_through_smtp_ses_and_sendgrid(api_a, tenant_a, smtp_sink, ses, sendgrid):
    smtp_provider(tenant_a, smtp_sink)
    factories.provider(tenant_a, "ses", kind="ses", channel="email", secrets={"secret_access_key": SECRET},
                       config={"region": "eu-west-1", "base_url": ses.base_url, "from_email": FROM,
                               "access_key_id": KEY_ID})  # fmt: skip
    factories.provider(tenant_a, "sendgrid", kind="sendgrid", channel="email", secrets={"api_key": SENDGRID_KEY},
                       config={"base_url": f"http://127.0.0.1:{sendgrid.port}", "from_email": FROM})  # fmt: skip
    assert api_a.post("/api/v1/templates", TEMPLATE, format="json").status_code == 201
    ids = [send(api_a, name) for name in ("smtp", "ses", "sendgrid")]
    dispatch()
    for note_id in ids:
        assert api_a.get(f"/api/v1/notifications/{note_id}").json()["status"] == "delivered"

    assert smtp_sink.wait_for(1)
    (mail,) = smtp_sink.messages
    message = mail.message
    assert message.get_content_type() == "multipart/alternative"
    text, html = list(message.iter_parts())
    assert (text.get_content_type(), html.get_content_type()) == ("text/plain", "text/html")
    assert text.get_content().rstrip("\n") == f"Hello {SCRIPT},\nyour order 42 shipped."
    assert "<b>" not in text.get_content() and "<p>" not in text.get_content()  # the text part has no markup
    assert f"<b>{ESCAPED}</b>" in html.get_content() and SCRIPT not in html.get_content()
    assert message["Subject"] == "Order 42"

    (request,) = ses.accepted
    body = request.payload["Content"]["Simple"]["Body"]
    assert body["Text"] == {"Data": f"Hello {SCRIPT},\nyour order 42 shipped.", "Charset": "UTF-8"}
    assert body["Html"]["Charset"] == "UTF-8" and f"<b>{ESCAPED}</b>" in body["Html"]["Data"]

    (posted,) = sendgrid.requests
    content = posted.payload["content"]
    assert [part["type"] for part in content] == ["text/plain", "text/html"]
    assert content[0]["value"] == f"Hello {SCRIPT},\nyour order 42 shipped."
    assert f"<b>{ESCAPED}</b>" in content[1]["value"] and SCRIPT not in content[1]["value"]


def test_a_text_only_template_sends_a_single_text_part(api_a, tenant_a, smtp_sink):
    smtp_provider(tenant_a, smtp_sink)
    assert api_a.post("/api/v1/templates", {**TEMPLATE, "html_body": ""}, format="json").status_code == 201
    send(api_a, "smtp")
    dispatch()
    assert smtp_sink.wait_for(1)
    assert smtp_sink.messages[0].message.get_content_type() == "text/plain"


def test_the_send_is_the_version_rendered_even_if_the_template_changed_before_dispatch(api_a, tenant_a, smtp_sink):
    smtp_provider(tenant_a, smtp_sink)
    assert api_a.post("/api/v1/templates", TEMPLATE, format="json").status_code == 201
    first = send(api_a, "smtp")
    changed = {"subject": "New order {{ number }}", "html_body": "<p>v2 {{ name }}</p>", "body": "v2 {{ name }}"}
    assert api_a.patch("/api/v1/templates/order", changed, format="json").json()["version"] == 2
    second = send(api_a, "smtp")
    dispatch()
    assert smtp_sink.wait_for(2)
    by_subject = {m.message["Subject"]: m.message for m in smtp_sink.messages}
    assert set(by_subject) == {"Order 42", "New order 42"}
    assert "order 42 shipped" in by_subject["Order 42"].get_body(("html",)).get_content()
    assert "v2 " in by_subject["New order 42"].get_body(("html",)).get_content()
    versions = [api_a.get(f"/api/v1/notifications/{i}").json()["template_version"] for i in (first, second)]
    assert versions == [1, 2]

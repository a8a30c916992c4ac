"""Template versions, locale variants and previews through the API: every change makes an immutable
version and a notification records the one it rendered; the variant used follows the notification's
locale, the subscriber's, then their base languages; syntax errors name their line; a preview renders
as a send would, errors and budget included."""

from __future__ import annotations

import pytest

from core.validation import check_locale
from notifications.models import Notification
from templating import rendering
from templating.models import Template, TemplateVersion
from tests.support.setups import EMAIL

pytestmark = pytest.mark.django_db

TEMPLATES = "/api/v1/templates"
NOTIFICATIONS = "/api/v1/notifications"
RECEIPT = {"key": "receipt", "channel": "email", "subject": "Receipt {{ n }}", "body": "Thanks, {{ name }}."}
VARIANTS = {
    "fr": {"subject": "Reçu {{ n }}", "body": "Merci, {{ name }}."},
    "de-AT": {"subject": "Beleg {{ n }}", "body": "Danke, {{ name }}."},
    "pt": {"subject": "Recibo {{ n }}", "body": "Obrigado, {{ name }}."},
}


def make(api, **fields) -> dict:  # noqa: ANN001
    response = api.post(TEMPLATES, {**RECEIPT, **fields}, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def send(api, **fields) -> dict:  # noqa: ANN001
    body = {"channel": "email", "template": "receipt", "context": {"n": 7, "name": "Jo"}, **fields}
    if "subscriber" not in body:
        body["recipient"] = EMAIL
    response = api.post(NOTIFICATIONS, body, format="json")
    assert response.status_code == 201, response.content
    return api.get(f"{NOTIFICATIONS}/{response.json()['id']}").json()


def test_an_edit_between_two_sends_shows_version_1_then_2_both_readable(api_a, setup_a):
    assert make(api_a)["version"] == 1
    first = send(api_a)
    edited = api_a.patch(f"{TEMPLATES}/receipt", {"body": "Thank you, {{ name }}!"}, format="json")
    assert edited.status_code == 200 and edited.json()["version"] == 2
    second = send(api_a)
    assert (first["template_version"], first["body"]) == (1, "Thanks, Jo.")
    assert (second["template_version"], second["body"]) == (2, "Thank you, Jo!")
    assert first["locale"] is None and second["locale"] is None  # the template's own fields

    listed = api_a.get(f"{TEMPLATES}/receipt/versions").json()["results"]
    assert [(v["version"], v["body"]) for v in listed] == [(2, "Thank you, {{ name }}!"), (1, "Thanks, {{ name }}.")]
    page = api_a.get(f"{TEMPLATES}/receipt/versions?limit=1").json()
    assert [v["version"] for v in page["results"]] == [2]
    assert [v["version"] for v in api_a.get(page["next"]).json()["results"]] == [1]
    assert api_a.get(f"{TEMPLATES}/receipt/versions?sort=1").status_code == 400
    one = api_a.get(f"{TEMPLATES}/receipt/versions/1").json()
    assert (one["version"], one["subject"], one["body"]) == (1, "Receipt {{ n }}", "Thanks, {{ name }}.")
    assert api_a.get(f"{TEMPLATES}/receipt/versions/3").status_code == 404

    # A save that changes nothing makes no version; a refused one neither.
    assert api_a.patch(f"{TEMPLATES}/receipt", {"body": "Thank you, {{ name }}!"}, format="json").json()["version"] == 2
    assert api_a.patch(f"{TEMPLATES}/receipt", {"body": "{% if x %}"}, format="json").status_code == 400
    assert TemplateVersion.objects.filter(template__key="receipt").count() == 2
    # Versions never change: the stored row of version 1 is what it was.
    assert TemplateVersion.objects.get(template__key="receipt", version=1).body == "Thanks, {{ name }}."


def test_versions_are_the_tenants_own(api_a, api_b, setup_a):
    make(api_a)
    assert api_b.get(f"{TEMPLATES}/receipt/versions").status_code == 404
    assert api_b.get(f"{TEMPLATES}/receipt/versions/1").status_code == 404
    assert api_b.post(f"{TEMPLATES}/receipt/preview", {"context": {}}, format="json").status_code == 404


def test_a_fr_ca_subscriber_gets_the_fr_variant_and_the_detail_says_fr(api_a, setup_a):
    make(api_a, variants=VARIANTS)
    put = api_a.put("/api/v1/subscribers/jo", {"email": EMAIL, "locale": "fr-ca"}, format="json")
    assert put.status_code == 201, put.content
    assert api_a.get("/api/v1/subscribers/jo").json()["locale"] == "fr-CA"  # stored in its conventional case
    detail = send(api_a, subscriber="jo")
    assert (detail["locale"], detail["subject"], detail["body"]) == ("fr", "Reçu 7", "Merci, Jo.")
    assert detail["template_version"] == 1


@pytest.mark.parametrize(
    ("notification", "subscriber", "used"),
    [
        ("de-AT", "fr-CA", "de-AT"),  # the notification's own tag first
        ("fr-CA", "de-AT", "de-AT"),  # then the subscriber's tag, before any base language
        ("de-CH", "fr-CA", "fr"),  # no de-CH, fr-CA nor de: the subscriber's base language
        ("fr-CA", "pt-BR", "fr"),  # the notification's base language before the subscriber's
        ("es-MX", "pt-BR", "pt"),
        (None, "pt-BR", "pt"),
        ("ja", "ko", None),  # nothing matches: the template's own fields
        (None, None, None),
    ],
)
def test_the_fallback_chain(api_a, setup_a, notification, subscriber, used):
    make(api_a, variants=VARIANTS)
    fields = {"email": EMAIL, "locale": subscriber} if subscriber else {"email": EMAIL}
    assert api_a.put("/api/v1/subscribers/jo", fields, format="json").status_code == 201
    detail = send(api_a, subscriber="jo", **({"locale": notification} if notification else {}))
    assert detail["locale"] == used
    expected = {None: "Thanks, Jo.", "fr": "Merci, Jo.", "de-AT": "Danke, Jo.", "pt": "Obrigado, Jo."}[used]
    assert detail["body"] == expected


def test_the_candidates_are_literal():
    assert rendering.candidates("fr-CA", "de-AT") == ["fr-CA", "de-AT", "fr", "de"]
    assert rendering.candidates(None, "zh-Hant-TW") == ["zh-Hant-TW", "zh"]
    assert rendering.candidates("fr", "fr-CA") == ["fr", "fr-CA"]
    assert [check_locale(t) for t in ("FR-ca", "zh-hant-tw", "es-419", "x-klingon")] == [
        "fr-CA", "zh-Hant-TW", "es-419", "x-klingon"
    ]  # fmt: skip


def test_bad_tags_are_400_with_the_field_named(api_a, setup_a):
    bad = api_a.post(TEMPLATES, {**RECEIPT, "variants": {"french!": {"body": "x"}}}, format="json")
    assert bad.status_code == 400 and "french!" in bad.json()["error"]["details"]["variants"]
    twice = api_a.post(TEMPLATES, {**RECEIPT, "variants": {"fr": {"body": "a"}, "FR": {"body": "b"}}}, format="json")
    assert twice.status_code == 400
    no_body = api_a.post(TEMPLATES, {**RECEIPT, "variants": {"fr": {"subject": "a"}}}, format="json")
    assert no_body.status_code == 400 and "body" in no_body.json()["error"]["details"]["variants"]["fr"]
    sms_html = api_a.post(TEMPLATES, {**RECEIPT, "key": "t", "channel": "sms", "html_body": "<b>x</b>"}, format="json")
    assert sms_html.status_code == 400 and "html_body" in sms_html.json()["error"]["details"]
    subscriber = api_a.put("/api/v1/subscribers/jo", {"email": EMAIL, "locale": "english please"}, format="json")
    assert subscriber.status_code == 400 and "locale" in subscriber.json()["error"]["details"]
    make(api_a)
    note = api_a.post(NOTIFICATIONS, {"channel": "email", "recipient": EMAIL, "template": "receipt", "locale": "1"},
                      format="json")  # fmt: skip
    assert note.status_code == 400 and "locale" in note.json()["error"]["details"]
    plain = api_a.post(NOTIFICATIONS, {"channel": "email", "recipient": EMAIL, "body": "x", "locale": "fr"},
                       format="json")  # fmt: skip
    assert plain.status_code == 400 and "locale" in plain.json()["error"]["details"]


@pytest.mark.parametrize(
    ("field", "source", "line"),
    [
        ("body", "Hello\n{{ name }}\n{% if x %}never closed", "line 3"),
        ("body", "a\nb\nc\n{{ x|no_such_filter }}", "line 4"),
        ("html_body", "<p>\n{% load static %}\n</p>", "line 2"),
        ("subject", "{{ }}", "line 1"),
    ],
)
def test_syntax_errors_are_400_at_save_with_their_line(api_a, setup_a, field, source, line):
    response = api_a.post(TEMPLATES, {**RECEIPT, field: source}, format="json")
    assert response.status_code == 400
    (message,) = response.json()["error"]["details"][field]
    assert line in message, message
    assert not Template.objects.filter(key="receipt").exists()


def test_a_variants_syntax_error_names_its_tag_field_and_line(api_a, setup_a):
    make(api_a)
    response = api_a.patch(f"{TEMPLATES}/receipt", {"variants": {"fr": {"body": "Merci\n{% for %}"}}}, format="json")
    assert response.status_code == 400
    (message,) = response.json()["error"]["details"]["variants"]["fr"]["body"]
    assert "line 2" in message
    assert api_a.get(f"{TEMPLATES}/receipt").json()["version"] == 1


def test_preview_renders_the_current_version_and_its_variant(api_a, setup_a):
    make(api_a, html_body="<p>Hi {{ name }}</p>", variants=VARIANTS)
    api_a.patch(f"{TEMPLATES}/receipt", {"html_body": "<p>Hello {{ name }}</p>"}, format="json")
    context = {"n": 3, "name": "<script>alert(1)</script>"}
    response = api_a.post(f"{TEMPLATES}/receipt/preview", {"context": context}, format="json")
    assert response.status_code == 200, response.content
    assert response.json() == {
        "subject": "Receipt 3", "body": "Thanks, <script>alert(1)</script>.",
        "html_body": "<p>Hello &lt;script&gt;alert(1)&lt;/script&gt;</p>", "locale": None, "version": 2,
    }  # fmt: skip
    french = api_a.post(f"{TEMPLATES}/receipt/preview", {"context": context, "locale": "fr-CA"}, format="json").json()
    assert (french["locale"], french["subject"], french["html_body"]) == ("fr", "Reçu 3", "")
    assert not Notification.objects.exists()  # a preview sends nothing


def test_preview_errors_are_400_with_the_rendering_error(api_a, setup_a):
    make(api_a, body="{{ n|divisibleby:0 }}")
    failed = api_a.post(f"{TEMPLATES}/receipt/preview", {"context": {"n": 4}}, format="json")
    assert failed.status_code == 400
    assert "body: " in str(failed.json()["error"]["details"]["template"])
    assert "ZeroDivisionError" in str(failed.json()["error"]["details"]["template"])
    bad_locale = api_a.post(f"{TEMPLATES}/receipt/preview", {"context": {}, "locale": "!!"}, format="json")
    assert bad_locale.status_code == 400 and "locale" in bad_locale.json()["error"]["details"]
    not_object = api_a.post(f"{TEMPLATES}/receipt/preview", {"context": [1, 2]}, format="json")
    assert not_object.status_code == 400 and "context" in not_object.json()["error"]["details"]
    unknown = api_a.post(f"{TEMPLATES}/receipt/preview", {"context": {}, "sandbox": False}, format="json")
    assert unknown.status_code == 400
    assert api_a.post(f"{TEMPLATES}/nope/preview", {"context": {}}, format="json").status_code == 404


def test_a_preview_runs_no_more_than_a_send(api_a, setup_a):
    """The same budget: a loop bomb stops at the loop budget in a preview and in a send alike, and the
    sandbox's refusals (methods of context values, settings) hold in both."""
    bomb = "{% for a in l %}{% for b in l %}{% for c in l %}.{% endfor %}{% endfor %}{% endfor %}"
    make(api_a, html_body=bomb)
    context = {"n": 1, "name": "Jo", "l": list(range(40))}
    preview = api_a.post(f"{TEMPLATES}/receipt/preview", {"context": context}, format="json")
    assert preview.status_code == 400
    assert "loops more than" in str(preview.json()["error"]["details"]["template"])
    sent = api_a.post(NOTIFICATIONS, {"channel": "email", "recipient": EMAIL, "template": "receipt",
                                      "context": context}, format="json")  # fmt: skip
    assert sent.status_code == 400 and "loops more than" in str(sent.json()["error"]["details"]["template"])
    api_a.patch(f"{TEMPLATES}/receipt", {"html_body": "{{ name.upper }}|{{ settings.SECRET_KEY }}|{{ l.pop }}"},
                format="json")  # fmt: skip
    shown = api_a.post(f"{TEMPLATES}/receipt/preview", {"context": context}, format="json").json()
    assert shown["html_body"] == "||"

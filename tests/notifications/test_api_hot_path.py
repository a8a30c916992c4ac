"""The hot path (notifications.api.hot): plain single creates and detail reads are answered before
URL routing and DRF, with the views' own functions; every other request is handed to the views
untouched, which answer it exactly as before, and a request is never counted twice by the rate limit."""

from __future__ import annotations

import json

import pytest
from django.test import override_settings

from core.api.throttling import TenantRateThrottle
from notifications.api import views
from notifications.api.hot import _render
from notifications.models import IdempotencyRecord, Notification
from tests.support.setups import email

URL = "/api/v1/notifications"
pytestmark = pytest.mark.django_db
SAME_HEADERS = ("Content-Type", "Allow", "X-Frame-Options", "X-Content-Type-Options", "Referrer-Policy",
                "Cross-Origin-Opener-Policy")  # fmt: skip


@pytest.fixture
def views_refuse(monkeypatch):  # noqa: ANN001, ANN201
    """Make the views' create and retrieve fail: a 201/200 then can only come from the hot path."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the view was called")

    monkeypatch.setattr(views.NotificationViewSet, "create", refuse)
    monkeypatch.setattr(views.NotificationViewSet, "retrieve", refuse)


def test_plain_creates_and_reads_are_answered_as_the_views_answer_them(api_a, setup_a, monkeypatch):
    # Through the views first (an Accept the hot path leaves alone), then through the hot path.
    by_views = api_a.post(URL, email(subject="one"), format="json", HTTP_ACCEPT="application/json; q=1")
    read_by_views = api_a.get(f"{URL}/{by_views.json()['id']}", HTTP_ACCEPT="application/json; q=1")
    assert by_views.status_code == 201 and read_by_views.status_code == 200

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the view was called")

    monkeypatch.setattr(views.NotificationViewSet, "create", refuse)
    monkeypatch.setattr(views.NotificationViewSet, "retrieve", refuse)
    hot = api_a.post(URL, email(subject="two"), format="json")
    assert hot.status_code == 201, hot.content
    read_hot = api_a.get(f"{URL}/{hot.json()['id']}")
    assert read_hot.status_code == 200
    for fast, slow in ((hot, by_views), (read_hot, read_by_views)):
        assert {h: fast.get(h) for h in SAME_HEADERS} == {h: slow.get(h) for h in SAME_HEADERS}
        assert int(fast["Content-Length"]) == len(fast.content)
        a, b = fast.json(), slow.json()
        assert a.keys() == b.keys()
        differ = {k for k in a if a[k] != b[k]}
        assert differ <= {"id", "subject", "created_at", "updated_at", "enqueued_at"}, differ
    stored = Notification.objects.for_tenant(setup_a.tenant).get(pk=hot.json()["id"])
    assert stored.subject == "two" and stored.recipient == "jane.doe@example.com"
    assert hot.json()["recipient_masked"] == "j***@example.com"


@pytest.mark.parametrize(
    ("kwargs", "status", "code"),
    [
        ({"data": "{not json", "content_type": "application/json"}, 400, "parse_error"),
        ({"data": json.dumps({**email(), "priority": 11}), "content_type": "application/json"}, 400,
         "validation_error"),
        ({"data": json.dumps({**email(), "status": "delivered"}), "content_type": "application/json"}, 400,
         "validation_error"),
        ({"data": json.dumps(email(provider="nope")), "content_type": "application/json"}, 400, "validation_error"),
        ({"data": json.dumps(email()), "content_type": "text/plain"}, 415, "unsupported_media_type"),
        ({"data": json.dumps(email()), "content_type": "application/json", "HTTP_ACCEPT": "text/html"}, 406,
         "not_acceptable"),
        ({"data": json.dumps(email()), "content_type": "application/json", "QUERY_STRING": "x=1"}, 400,
         "validation_error"),
        ({"data": json.dumps(email()), "content_type": "application/json", "HTTP_AUTHORIZATION": "Bearer op_x_y"},
         401, "unauthenticated"),
        ({"data": json.dumps(email()), "content_type": "application/json", "HTTP_AUTHORIZATION": "Basic abc"}, 401,
         "unauthenticated"),
    ],
)  # fmt: skip
def test_every_other_create_is_answered_by_the_views(anonymous, key_a, setup_a, kwargs, status, code):
    response = anonymous.generic("POST", URL, **{"HTTP_AUTHORIZATION": f"Bearer {key_a}", **kwargs})
    assert response.status_code == status, response.content
    assert response.json()["error"]["code"] == code
    assert not Notification.objects.exists()


def test_field_errors_name_the_field(api_a, setup_a):
    response = api_a.post(URL, {**email(), "priority": 11, "recipient": "not an address"}, format="json")
    assert response.status_code == 400
    assert set(response.json()["error"]["details"]) == {"priority", "recipient"}


def keyed(client, body: dict, key: str, *, views: bool):  # noqa: ANN001, ANN201
    """A keyed create through the views (an Accept the hot path leaves alone) or the hot path."""
    extra = {"HTTP_ACCEPT": "application/json; q=1"} if views else {}
    return client.post(URL, body, format="json", HTTP_IDEMPOTENCY_KEY=key, **extra)


def test_creates_with_an_idempotency_key_are_answered_as_the_views_answer_them(api_a, setup_a, monkeypatch):
    """The same sequence through the views, then through the hot path (the views refusing): a
    first create, its replay, another body (422), a request in progress (409)."""

    def sequence(key: str, *, views: bool) -> list:  # noqa: ANN001
        first = keyed(api_a, email(subject=key), key, views=views)
        replay = keyed(api_a, email(subject=key), key, views=views)
        reused = keyed(api_a, email(subject="another body"), key, views=views)
        IdempotencyRecord.objects.filter(key=key).update(state="in_flight")
        in_progress = keyed(api_a, email(subject=key), key, views=views)
        IdempotencyRecord.objects.filter(key=key).update(state="completed")
        return [first, replay, reused, in_progress]

    slow = sequence("k-views", views=True)
    monkeypatch.setattr(views.NotificationViewSet, "create", _refuse)
    fast = sequence("k-hot", views=False)
    assert [r.status_code for r in fast] == [r.status_code for r in slow] == [201, 201, 422, 409]
    for f, s in zip(fast, slow, strict=True):
        assert {h: f.get(h) for h in (*SAME_HEADERS, "Idempotent-Replayed")} == {
            h: s.get(h) for h in (*SAME_HEADERS, "Idempotent-Replayed")}  # fmt: skip
        assert int(f["Content-Length"]) == len(f.content)
    assert fast[1]["Idempotent-Replayed"] == "true" and "Idempotent-Replayed" not in fast[0]
    assert fast[1].content == fast[0].content, "the replay is the stored bytes"
    assert fast[2].content == slow[2].content and fast[3].content == slow[3].content  # byte for byte
    assert fast[2].json()["error"]["code"] == "idempotency_key_reused"
    assert fast[3].json()["error"]["code"] == "idempotency_request_in_progress"
    # the first answers differ only in the notification's own fields
    a, b = json.loads(fast[0].content), json.loads(slow[0].content)
    assert a.keys() == b.keys() and {k for k in a if a[k] != b[k]} <= {"id", "subject", "created_at", "updated_at",
                                                                      "enqueued_at"}  # fmt: skip
    assert fast[0].content == _render({**b, **{k: a[k] for k in a if a[k] != b[k]}}), "the views' rendering"
    record = IdempotencyRecord.objects.get(key="k-hot")
    assert record.response_status == 201 and record.response_body.encode() == fast[0].content
    assert Notification.objects.count() == 2


@override_settings(OMNIPOST_RATE_LIMIT_API=3)
def test_a_keyed_create_counts_once_against_the_rate_limit(api_a, setup_a):
    TenantRateThrottle._local.clear()
    statuses = [
        keyed(api_a, email(), "k-1", views=False).status_code,
        keyed(api_a, email(), "k-1", views=False).status_code,  # its replay
        keyed(api_a, email(subject="other"), "k-1", views=False).status_code,  # 422, answered by the hot path
        keyed(api_a, email(), "k-2", views=False).status_code,  # the 4th request of 3 a minute
    ]
    assert statuses == [201, 201, 422, 429]
    assert Notification.objects.count() == 1


@pytest.mark.parametrize("key", ["", "x" * 256, "caf\u00e9"])
def test_a_malformed_key_is_the_views_400(api_a, setup_a, key):
    response = keyed(api_a, email(), key, views=False)
    assert response.status_code == 400 and "Idempotency-Key" in response.json()["error"]["details"]
    assert not Notification.objects.exists()


def _refuse(*args: object, **kwargs: object) -> None:
    raise AssertionError("the view was called")


def test_reads_of_unknown_or_foreign_ids_are_the_views_404(api_a, api_b, setup_a, setup_b, views_refuse):
    created = api_b.post(URL, email(), format="json")
    assert created.status_code == 201  # tenant B's, through the hot path (the views refuse)
    for path in (f"{URL}/{created.json()['id']}", f"{URL}/00000000-0000-0000-0000-000000000000"):
        with pytest.raises(AssertionError, match="the view was called"):
            api_a.get(path)  # handed to the views (which this test made refuse)


@override_settings(OMNIPOST_RATE_LIMIT_API=3)
def test_the_rate_limit_counts_each_request_once_and_answers_429_with_retry_after(api_a, setup_a):
    TenantRateThrottle._local.clear()
    statuses = [
        api_a.post(URL, {**email(), "priority": 11}, format="json").status_code,  # handed over: counted by the views
        api_a.post(URL, email(), format="json").status_code,  # hot path
        api_a.get(f"{URL}/00000000-0000-0000-0000-000000000000").status_code,  # 404 handed over
        api_a.post(URL, email(), format="json").status_code,  # the 4th request of 3 a minute
    ]
    assert statuses == [400, 201, 404, 429]
    throttled = api_a.get(f"{URL}/{Notification.objects.get().pk}")
    assert throttled.status_code == 429 and int(throttled["Retry-After"]) >= 1
    assert throttled.json()["error"]["code"] == "rate_limited"
    assert Notification.objects.count() == 1


def test_a_body_over_the_limit_is_413_before_the_hot_path(api_a, setup_a, settings):
    settings.OMNIPOST_MAX_REQUEST_BYTES = 100
    response = api_a.post(URL, email(body="x" * 200), format="json")
    assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"
    assert not Notification.objects.exists()


@pytest.mark.parametrize(
    "data",
    [
        {"subject": "line\u2028sep\u2029para", "body": "Grüße ✓ 😀", "n": None, "ok": True},
        {"metadata": {"big": 2**70, "neg": -(2**64)}},  # beyond orjson's 64 bits: DRF's renderer
        {"metadata": {"f": 0.1, "e": 1e-7, "nested": [1, [2, {"k": "v"}]]}},
    ],
)
def test_the_hot_paths_json_reads_back_as_drfs(data):
    from rest_framework.renderers import JSONRenderer

    from notifications.api.hot import _render

    ours, drfs = _render(data), JSONRenderer().render(data)
    assert json.loads(ours) == json.loads(drfs) == data
    assert (b"\xe2\x80\xa8" in ours, b"\\u2028" in ours) == (b"\xe2\x80\xa8" in drfs, b"\\u2028" in drfs)
    if "metadata" not in data:  # no numbers whose spelling may differ (1e-07 / 1e-7): the same bytes
        assert ours == drfs

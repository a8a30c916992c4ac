"""receipts.wsgi.EnvironHeaders reads a request's headers as Django's HttpHeaders does."""

from __future__ import annotations

from django.http.request import HttpHeaders

from receipts.wsgi import EnvironHeaders

ENVIRON = {
    "REQUEST_METHOD": "POST", "PATH_INFO": "/hooks/providers/1", "CONTENT_TYPE": "application/json",
    "CONTENT_LENGTH": "12", "HTTP_WEBHOOK_ID": "msg_1", "HTTP_WEBHOOK_SIGNATURE": "v1,abc",
    "HTTP_X_TWILIO_SIGNATURE": "sig=", "SERVER_NAME": "127.0.0.1", "wsgi.url_scheme": "http",
}  # fmt: skip


def test_lookups_match_django_headers() -> None:
    ours, django = EnvironHeaders(ENVIRON), HttpHeaders(ENVIRON)
    for name in ("webhook-id", "Webhook-Signature", "X-Twilio-Signature", "content-type", "Content-Length",
                 "webhook-timestamp", "server-name", "path-info"):  # fmt: skip
        assert ours.get(name, "") == django.get(name, ""), name
        assert (name in ours) == (name in django), name
    assert ours["webhook-id"] == "msg_1"
    assert sorted(ours) == sorted(django)
    assert len(ours) == len(django) == 5
    assert dict(ours) == dict(django)

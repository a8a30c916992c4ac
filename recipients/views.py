"""The page behind an email's `List-Unsubscribe` URL (no auth, no cookies, no CSRF: RFC 8058).

`GET` shows what would be unsubscribed and a button, and changes nothing (mail scanners follow
links); `POST` with the form field `List-Unsubscribe=One-Click` (what mail clients send, and what the
button posts) unsubscribes. A forged or altered token is `400` and changes nothing."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.shortcuts import render
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods

from core.masking import mask_email
from recipients import unsubscribe


def _bad(message: str) -> HttpResponse:
    return HttpResponseBadRequest(message, content_type="text/plain; charset=utf-8")


@csrf_exempt
@never_cache
@require_http_methods(["GET", "HEAD", "POST"])
def one_click(request: HttpRequest, token: str) -> HttpResponse:
    try:
        _, category, address = unsubscribe.read_token(token)
    except unsubscribe.BadToken:
        return _bad("This unsubscribe link is not valid.")
    context = {"category": category, "masked": mask_email(address), "done": False}
    if request.method == "POST":
        if request.POST.get("List-Unsubscribe") != "One-Click":
            return _bad("Expected the form field List-Unsubscribe=One-Click.")
        unsubscribe.unsubscribe(token)
        context["done"] = True
    response = render(request, "recipients/unsubscribe.html", context)
    response["Referrer-Policy"] = "no-referrer"
    return response

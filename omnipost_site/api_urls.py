"""Everything under /api/v1/. Each app contributes its own routes; add new includes above the
catch-all, which keeps unknown API paths a JSON 404 (csrf-exempt, so a DELETE or POST to a
wrong path is a 404 too, not Django's HTML CSRF page)."""

from django.urls import include, path, re_path
from django.views.decorators.csrf import csrf_exempt

from core.api.views import api_not_found

urlpatterns = [
    path("", include("notifications.api.urls")),
    path("", include("providers.api.urls")),
    path("", include("recipients.api.urls")),
    path("", include("templating.api.urls")),
    path("", include("dlq.api.urls")),
    path("", include("events.api.urls")),
    path("", include("inbox.api.urls")),
    path("", include("workflows.api.urls")),
    path("", include("bulk.api.urls")),
    re_path(r"^", csrf_exempt(api_not_found)),
]

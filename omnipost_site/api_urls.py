"""Everything under /api/v1/. Each app contributes its own routes."""

from django.urls import include, path

urlpatterns = [
    path("", include("notifications.api.urls")),
]

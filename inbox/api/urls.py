"""The tenant API's inbox routes (under /api/v1/)."""

from django.urls import path

from inbox.api import tenant_views

urlpatterns = [
    path("settings", tenant_views.SettingsView.as_view(), name="tenant-settings"),
    path("subscribers/<str:external_id>/inbox-token", tenant_views.InboxTokenView.as_view(), name="inbox-token"),
    path(
        "subscribers/<str:external_id>/inbox-token/revoke",
        tenant_views.InboxTokenRevokeView.as_view(),
        name="inbox-token-revoke",
    ),  # fmt: skip
]

"""The subscriber's API, /inbox/v1/ (inbox tokens only)."""

from django.urls import path, re_path
from django.views.decorators.csrf import csrf_exempt

from core.api.views import api_not_found
from inbox.api import views
from inbox.api.widget import widget_js

urlpatterns = [
    path("feed", views.FeedView.as_view(), name="inbox-feed"),
    path("feed/mark-all", views.MarkAllView.as_view(), name="inbox-mark-all"),
    path("feed/<str:item_id>/<str:action>", views.ItemActionView.as_view(), name="inbox-item-action"),
    path("counts", views.CountsView.as_view(), name="inbox-counts"),
    path("preferences", views.PreferencesView.as_view(), name="inbox-preferences"),
    path("widget.js", widget_js, name="inbox-widget"),
    path("stream", views.StreamRedirectView.as_view(), name="inbox-stream"),
    re_path(r"^", csrf_exempt(api_not_found)),
]

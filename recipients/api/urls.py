"""Routes under /api/v1/ (no trailing slashes)."""

from __future__ import annotations

from django.urls import path
from rest_framework.routers import SimpleRouter

from recipients.api import topics, views

router = SimpleRouter(trailing_slash=False)
router.register("suppressions", views.SuppressionViewSet, basename="suppression")
router.register("categories", views.CategoryViewSet, basename="category")

subscribers = views.SubscriberViewSet.as_view({"get": "list", "put": "bulk"})
subscriber = views.SubscriberViewSet.as_view(
    {"get": "retrieve", "put": "update", "patch": "partial_update", "delete": "destroy"}
)

devices = views.DeviceViewSet.as_view({"get": "list", "post": "create"})
device = views.DeviceViewSet.as_view({"delete": "destroy"})

urlpatterns = [
    path("subscribers/<str:external_id>/devices", devices, name="subscriber-devices"),
    path("subscribers/<str:external_id>/devices/<str:device_id>", device, name="subscriber-device"),
    path("unsubscribe-tokens/revoke", views.UnsubscribeTokenRevokeView.as_view({"post": "create"}),
         name="unsubscribe-token-revoke"),
    path("topics", topics.topic_list, name="topic-list"),
    path("topics/<str:key>", topics.topic_detail, name="topic-detail"),
    path("topics/<str:key>/subscribers", topics.topic_members, name="topic-subscribers"),
    path("subscribers", subscribers, name="subscriber-list"),
    path("subscribers/<str:external_id>", subscriber, name="subscriber-detail"),
    *router.urls,
]

"""Routes under /api/v1/ (no trailing slashes)."""

from __future__ import annotations

from django.urls import path
from rest_framework.routers import SimpleRouter

from notifications.api import views

router = SimpleRouter(trailing_slash=False)
router.register("notifications", views.NotificationViewSet, basename="notification")
router.register("scheduled-jobs", views.ScheduledJobViewSet, basename="scheduled-job")

urlpatterns = [
    path("tenant", views.CurrentTenantView.as_view(), name="tenant-current"),
    path("queues", views.QueueStatsView.as_view(), name="queue-stats"),
    *router.urls,
]

"""Routes under /api/v1/ (no trailing slashes)."""

from __future__ import annotations

from django.urls import path
from rest_framework.routers import SimpleRouter

from notifications.api import recipient_views, sequence_views, views

router = SimpleRouter(trailing_slash=False)
router.register("notifications", views.NotificationViewSet, basename="notification")
router.register("scheduled-jobs", views.ScheduledJobViewSet, basename="scheduled-job")
router.register("sequences", sequence_views.SequenceViewSet, basename="sequence")
router.register("suppressions", recipient_views.SuppressionViewSet, basename="suppression")
router.register("categories", recipient_views.CategoryViewSet, basename="category")

subscribers = recipient_views.SubscriberViewSet.as_view({"get": "list", "put": "bulk"})
subscriber = recipient_views.SubscriberViewSet.as_view(
    {"get": "retrieve", "put": "update", "patch": "partial_update", "delete": "destroy"}
)

enrollments = sequence_views.EnrollmentViewSet.as_view({"get": "list", "post": "create"})
enrollment = sequence_views.EnrollmentViewSet.as_view({"get": "retrieve", "delete": "destroy"})

urlpatterns = [
    path("tenant", views.CurrentTenantView.as_view(), name="tenant-current"),
    path("queues", views.QueueStatsView.as_view(), name="queue-stats"),
    path("sequences/<slug:key>/enrollments", enrollments, name="enrollment-list"),
    path("subscribers", subscribers, name="subscriber-list"),
    path("subscribers/<str:external_id>", subscriber, name="subscriber-detail"),
    path("sequences/<slug:key>/enrollments/<uuid:enrollment_id>", enrollment, name="enrollment-detail"),
    *router.urls,
]

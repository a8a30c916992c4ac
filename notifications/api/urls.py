"""Routes under /api/v1/ (no trailing slashes)."""

from __future__ import annotations

from django.urls import path
from rest_framework.routers import SimpleRouter

from notifications.api import sequence_views, views

router = SimpleRouter(trailing_slash=False)
router.register("notifications", views.NotificationViewSet, basename="notification")
router.register("scheduled-jobs", views.ScheduledJobViewSet, basename="scheduled-job")
router.register("sequences", sequence_views.SequenceViewSet, basename="sequence")

enrollments = sequence_views.EnrollmentViewSet.as_view({"get": "list", "post": "create"})
enrollment = sequence_views.EnrollmentViewSet.as_view({"get": "retrieve", "delete": "destroy"})

urlpatterns = [
    path("tenant", views.CurrentTenantView.as_view(), name="tenant-current"),
    path("queues", views.QueueStatsView.as_view(), name="queue-stats"),
    path("sequences/<slug:key>/enrollments", enrollments, name="enrollment-list"),
    path("sequences/<slug:key>/enrollments/<uuid:enrollment_id>", enrollment, name="enrollment-detail"),
    *router.urls,
]

"""Routes under /api/v1/ (no trailing slashes)."""

from __future__ import annotations

from django.urls import path
from rest_framework.routers import SimpleRouter

from workflows.api import sequence_views, views

router = SimpleRouter(trailing_slash=False)
router.register("workflows", views.WorkflowViewSet, basename="workflow")
router.register("workflow-runs", views.WorkflowRunViewSet, basename="workflow-run")
router.register("sequences", sequence_views.SequenceViewSet, basename="sequence")

enrollments = sequence_views.EnrollmentViewSet.as_view({"get": "list", "post": "create"})
enrollment = sequence_views.EnrollmentViewSet.as_view({"get": "retrieve", "delete": "destroy"})

urlpatterns = [
    path("sequences/<slug:key>/enrollments", enrollments, name="enrollment-list"),
    path("sequences/<slug:key>/enrollments/<uuid:enrollment_id>", enrollment, name="enrollment-detail"),
    *router.urls,
]

"""Routes under /api/v1/ (no trailing slashes)."""

from __future__ import annotations

from rest_framework.routers import SimpleRouter

from workflows.api import views

router = SimpleRouter(trailing_slash=False)
router.register("workflows", views.WorkflowViewSet, basename="workflow")
router.register("workflow-runs", views.WorkflowRunViewSet, basename="workflow-run")

urlpatterns = router.urls

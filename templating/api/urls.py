"""Routes under /api/v1/ (no trailing slashes)."""

from __future__ import annotations

from rest_framework.routers import SimpleRouter

from templating.api import views

router = SimpleRouter(trailing_slash=False)
router.register("templates", views.TemplateViewSet, basename="template")

urlpatterns = router.urls

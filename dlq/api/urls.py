"""Routes under /api/v1/dlq (no trailing slashes)."""

from __future__ import annotations

from rest_framework.routers import SimpleRouter

from dlq.api import views

router = SimpleRouter(trailing_slash=False)
router.register("dlq", views.DeadLetterViewSet, basename="dead-letter")

urlpatterns = router.urls

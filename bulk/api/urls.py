"""Routes under /api/v1/ (no trailing slashes)."""

from __future__ import annotations

from rest_framework.routers import SimpleRouter

from bulk.api import views

router = SimpleRouter(trailing_slash=False)
router.register("bulk-sends", views.BulkSendViewSet, basename="bulk-send")

urlpatterns = router.urls

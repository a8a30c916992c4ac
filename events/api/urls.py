"""Routes under /api/v1/event-endpoints (no trailing slashes)."""

from __future__ import annotations

from rest_framework.routers import SimpleRouter

from events.api import views

router = SimpleRouter(trailing_slash=False)
router.register("event-endpoints", views.EventEndpointViewSet, basename="event-endpoint")

urlpatterns = router.urls

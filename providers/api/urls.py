"""Routes under /api/v1/ (no trailing slashes)."""

from __future__ import annotations

from rest_framework.routers import SimpleRouter

from providers.api import views

router = SimpleRouter(trailing_slash=False)
router.register("providers", views.ProviderViewSet, basename="provider")

urlpatterns = router.urls

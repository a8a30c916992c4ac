from django.contrib import admin
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from core.api import views as api_views
from omnipost_site.ops import health
from receipts import views as receipt_views
from recipients import views as recipient_views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", include("omnipost_site.api_urls")),
    path("api/schema/", SpectacularAPIView.as_view(authentication_classes=[], permission_classes=[]), name="schema"),
    path(
        "api/docs/",
        SpectacularSwaggerView.as_view(url_name="schema", authentication_classes=[], permission_classes=[]),
        name="swagger-ui",
    ),
    # Last under /api/: any path no API route matched is a JSON 404 in the API's error shape.
    re_path(r"^api/", api_views.api_not_found),
    path("inbox/v1/", include("inbox.api.subscriber_urls")),
    path("unsubscribe/<str:token>", recipient_views.one_click, name="unsubscribe"),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", health.metrics, name="metrics"),
    # Vendors' receipts (delivery status callbacks), authenticated by the vendor's signature.
    path("hooks/providers/<int:provider_id>", receipt_views.provider_receipts, name="provider-receipts"),
]

handler404 = "core.api.views.handler404"
handler500 = "core.api.views.handler500"

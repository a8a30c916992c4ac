from django.urls import path

from notifications.api import views

urlpatterns = [
    path("tenant", views.CurrentTenantView.as_view(), name="tenant-current"),
]

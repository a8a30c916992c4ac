"""Fixtures of the notification API's tests."""

from __future__ import annotations

import pytest
from rest_framework.exceptions import APIException

from notifications.api import views


@pytest.fixture
def keyed_creates_on_the_hot_path(monkeypatch):  # noqa: ANN001, ANN201
    """Fails the test if the views (DRF) answered a single create with an `Idempotency-Key` that the
    hot path (notifications.api.hot) should have answered: a 201, a replay or a 409. The views still
    answer what the hot path hands over (a malformed key, a body that fails its checks, and the 422
    or replay a key bound to such a body gets, a missing credential); batches are the views' own."""
    original = views.NotificationViewSet.create
    answered: list[tuple[str, int]] = []

    def create(self, request, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        key = request.headers.get("Idempotency-Key")
        try:
            response = original(self, request, *args, **kwargs)
        except APIException as exc:  # DRF renders it outside the view's method
            if key is not None and exc.status_code == 409:
                answered.append((key, 409))
            raise
        if key is not None and response.status_code == 201:
            answered.append((key, 201))
        return response

    monkeypatch.setattr(views.NotificationViewSet, "create", create)
    yield answered
    assert answered == [], "keyed single creates answered by the views instead of the hot path"

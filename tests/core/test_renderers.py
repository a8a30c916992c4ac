"""core.api.renderers: the API's JSON renderer writes DRF's bytes, by orjson where alike."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.utils.translation import gettext_lazy
from rest_framework import renderers as drf
from rest_framework.exceptions import ErrorDetail

from core.api import renderers
from core.plain_json import plain_json

PLAIN = {"results": [{"id": "0190", "n": 1, "f": 2.5, "ok": True, "none": None, "s": "Zoë ✓ \u2028 \u2029 \"q\" \\",
                      "nested": {"list": [1, [2, {"x": ""}]], "empty": {}}}], "next": None}  # fmt: skip
OTHERS = [
    {"at": datetime(2026, 12, 5, 7, 52, 6, 123456, tzinfo=UTC)},
    {"id": uuid.UUID(int=7)},
    {"amount": Decimal("1.10")},
    {"error": {"details": {"recipient": [ErrorDetail("bad", code="invalid")]}}},
    {"message": gettext_lazy("This field is required.")},
    {1: "an int key"},
    {"huge": 2**70},
    [],
    "text",
]


@pytest.mark.parametrize("data", [PLAIN, *OTHERS], ids=["plain", *[f"other-{i}" for i in range(len(OTHERS))]])
def test_the_same_bytes_as_drfs_renderer(data):
    assert renderers.JSONRenderer().render(data) == drf.JSONRenderer().render(data)


def test_plain_values_go_through_orjson_and_the_rest_through_drf():
    assert plain_json(PLAIN) == drf.JSONRenderer().render(PLAIN)
    assert plain_json(OTHERS[1]) == drf.JSONRenderer().render(OTHERS[1]), "a UUID is written alike"
    assert all(plain_json(data) is None for data in [OTHERS[0], *OTHERS[2:7]])


def test_an_indent_asked_for_and_no_data_are_drfs():
    media = "application/json; indent=4"
    assert renderers.JSONRenderer().render(PLAIN, media) == drf.JSONRenderer().render(PLAIN, media)
    assert b"\n    " in renderers.JSONRenderer().render(PLAIN, media)
    assert renderers.JSONRenderer().render(None) == b""

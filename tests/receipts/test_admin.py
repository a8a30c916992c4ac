"""The console: a notification's receipt events inline (masked), the receipt column and filter."""

from __future__ import annotations

import io
import sys

import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client

from receipts.models import NotificationEvent
from receipts.services import apply_receipts
from tests.receipts.conftest import receipt

pytestmark = pytest.mark.django_db


def staff_of(tenant_name: str, monkeypatch: pytest.MonkeyPatch) -> Client:
    monkeypatch.setattr(sys, "stdin", io.StringIO("console-Pa55word-42\n"))
    call_command("create_staff_user", f"ops-{tenant_name}", "--tenant", tenant_name, "--password-stdin",
                 stdout=io.StringIO())  # fmt: skip
    client = Client()
    client.force_login(get_user_model().objects.get(username=f"ops-{tenant_name}"))
    return client


def test_events_inline_masked_and_the_receipt_filter(side_a, side_b, monkeypatch):
    note, other = side_a.notes[0], side_a.notes[1]
    apply_receipts(side_a.view, [
        receipt(note, "bounced", bounce_type="hard", details={"diagnostic": "550 jane.doe@example.com unknown"}),
        receipt(other, "delivered"),
    ])  # fmt: skip
    assert NotificationEvent.objects.get(notification=note).details["diagnostic"] == "550 j***@example.com unknown"
    staff = staff_of("tenant-a", monkeypatch)
    page = staff.get(f"/admin/notifications/notification/{note.pk}/change/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "Receipt events" in html and "j***@example.com" in html and "jane.doe@example.com" not in html
    assert "Bounced" in html and "Hard" in html
    listed = staff.get("/admin/notifications/notification/?receipt=bounced").context["cl"].result_list
    assert [n.pk for n in listed] == [note.pk]
    # Another tenant's staff do not reach the page.
    theirs = staff_of("tenant-b", monkeypatch).get(f"/admin/notifications/notification/{note.pk}/change/")
    assert theirs.status_code == 302

"""Key rotation (`operations.key_rotation`, run by `manage.py rotate_encryption_keys`): every encrypted
column re-encrypted under the newest key only, in batches, re-runnable, and a clear stop with nothing
changed when an old key is missing."""

from __future__ import annotations

import io
import uuid

import pytest
from cryptography.fernet import Fernet
from django.conf import settings
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import override_settings

from core import crypto
from core.fields import encrypted_fields
from notifications.models import IdempotencyRecord, Notification
from operations import key_rotation
from providers.models import Provider
from tests.core.conftest import PHONE, WHSEC
from workflows.models import WorkflowRun

pytestmark = pytest.mark.django_db

OLD = settings.OMNIPOST_ENCRYPTION_KEYS[0]


def test_every_encrypted_column_is_covered_by_rotation():
    names = {f"{m._meta.label}.{f.name}" for m, f in encrypted_fields()}
    assert {
        "notifications.Notification.recipient",
        "providers.Provider.secrets",
        "notifications.IdempotencyRecord.response_body",
        "workflows.WorkflowRun.recipient",
    } <= names


def _tokens() -> dict[str, str]:
    out = {}
    for model, field in encrypted_fields():
        for pk, token in model._default_manager.exclude(**{f"{field.attname}__isnull": True}).values_list(
            "pk", field.attname
        ):
            out[f"{model._meta.label}.{field.name}:{pk}"] = token
    return out


def test_rotation_re_encrypts_everything_under_the_newest_key_only(secrets_everywhere):
    rows, record, enrollment = secrets_everywhere
    new = Fernet.generate_key().decode()
    before = _tokens()
    assert len(before) == 4
    with override_settings(OMNIPOST_ENCRYPTION_KEYS=[new, OLD]):
        err, out = io.StringIO(), io.StringIO()
        call_command("rotate_encryption_keys", stdout=out, stderr=err)
        assert "re-encrypted 4 value(s)" in out.getvalue()
        # the progress bar goes to stderr, one per encrypted column
        progress = err.getvalue()
        assert "notifications.Notification.recipient" in progress and "100%" in progress
        after = _tokens()
        assert after.keys() == before.keys()
        assert all(after[k] != before[k] for k in before)

        # Re-running is safe: nothing left to do, nothing changes.
        out = io.StringIO()
        call_command("rotate_encryption_keys", stdout=out, stderr=io.StringIO())
        assert "re-encrypted 0 value(s)" in out.getvalue()
        assert _tokens() == after

    with override_settings(OMNIPOST_ENCRYPTION_KEYS=[new]):  # the old key is gone
        old_only = Fernet(OLD.encode())
        for token in _tokens().values():
            assert Fernet(new.encode()).decrypt(token.encode())
            with pytest.raises(Exception):  # noqa: B017 - InvalidToken: no longer readable by the old key
                old_only.decrypt(token.encode())
        assert Notification.objects.get(pk=rows.notification.pk).recipient == "alice@example.com"
        assert Provider.objects.get(pk=rows.provider.pk).secrets == {"signing_secret": WHSEC}
        assert IdempotencyRecord.objects.get(pk=record.pk).response_body == '{"recipient": "alice@example.com"}'
        assert WorkflowRun.objects.get(pk=enrollment.pk).recipient == PHONE


def test_rotation_processes_in_batches(rows_a):
    for i in range(5):
        Notification.objects.create(
            id=uuid.uuid4(),
            tenant=rows_a.tenant,
            channel="sms",
            recipient=f"+1555000000{i}",
            recipient_masked="x",
            provider=rows_a.provider,
        )
    new = Fernet.generate_key().decode()
    with override_settings(OMNIPOST_ENCRYPTION_KEYS=[new, OLD]):
        out = io.StringIO()
        call_command("rotate_encryption_keys", "--batch-size", "2", stdout=out, stderr=io.StringIO())
        assert "re-encrypted 7 value(s)" in out.getvalue()  # 6 recipients + 1 provider secret
        assert all(crypto.is_current(t) for t in _tokens().values())


def test_rotation_without_the_old_key_stops_with_a_clear_error_and_changes_nothing(rows_a):
    before = _tokens()
    with override_settings(OMNIPOST_ENCRYPTION_KEYS=[Fernet.generate_key().decode()]):
        with pytest.raises(CommandError, match=r"of row"):
            call_command("rotate_encryption_keys", stdout=io.StringIO(), stderr=io.StringIO())
    assert _tokens() == before




# --- the service, without the command ------------------------------------------------------------


def test_the_service_reports_progress_per_column_and_returns_the_count(secrets_everywhere):
    new = Fernet.generate_key().decode()
    seen: dict[str, list[int]] = {}

    def progress(label: str, total: int):  # noqa: ANN202
        seen[label] = [total, 0]
        return lambda n: seen[label].__setitem__(1, seen[label][1] + n)

    with override_settings(OMNIPOST_ENCRYPTION_KEYS=[new, OLD]):
        assert key_rotation.rotate(batch_size=1, progress=progress) == 4
        assert key_rotation.rotate() == 0
    assert seen["notifications.Notification.recipient"] == [1, 1]
    assert {label for label, (total, done) in seen.items() if total} == {
        "notifications.Notification.recipient",
        "providers.Provider.secrets",
        "notifications.IdempotencyRecord.response_body",
        "workflows.WorkflowRun.recipient",
    }
    assert all(total == done for total, done in seen.values())


def test_a_value_written_concurrently_is_not_overwritten(rows_a, monkeypatch):
    """Each write is a compare-and-set on the token read: a writer that changed the row between the
    read and the write keeps its value."""
    new = Fernet.generate_key().decode()
    real_rotate = crypto.rotate
    pk = rows_a.notification.pk

    def rotate_while_someone_writes(token: str, *, where: str) -> str:
        if where == f"notifications.Notification.recipient of row {pk}":
            Notification.objects.filter(pk=pk).update(recipient="carol@example.com")  # under the newest key
        return real_rotate(token, where=where)

    monkeypatch.setattr(crypto, "rotate", rotate_while_someone_writes)
    with override_settings(OMNIPOST_ENCRYPTION_KEYS=[new, OLD]):
        assert key_rotation.rotate() == 1  # the provider's secret; the recipient's write lost its compare-and-set
        assert Notification.objects.get(pk=pk).recipient == "carol@example.com"
        assert Provider.objects.get(pk=rows_a.provider.pk).secrets == {"signing_secret": WHSEC}
        assert all(crypto.is_current(t) for t in _tokens().values())

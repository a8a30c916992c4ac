"""Encryption at rest: nothing readable in the columns, rotation to the newest key, clear failures."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.fernet import Fernet
from django.core.exceptions import ImproperlyConfigured
from django.db import connection
from django.test import override_settings

from core import crypto
from notifications.models import Notification
from omnipost_site.keys import load_encryption_keys, parse_keys
from providers.models import Provider
from tests.core.conftest import PHONE, WHSEC, clean_env, run_manage
from workflows.models import WorkflowRun

REPO = Path(__file__).resolve().parents[2]
# A valid key spelled the same in every process: parameter ids must be equal across xdist workers.
GOOD_KEY = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="

pytestmark = pytest.mark.django_db

def raw_column(table: str, column: str, pk: object) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {column} FROM {table} WHERE id = %s", [pk])  # noqa: S608 - fixed names
        return cursor.fetchone()[0]


def test_stored_values_are_not_plain_text(secrets_everywhere):
    rows, record, enrollment = secrets_everywhere
    stored = {
        "recipient": raw_column("notifications", "recipient", rows.notification.pk),
        "secrets": raw_column("providers", "secrets", rows.provider.pk),
        "response": raw_column("idempotency_records", "response_body", record.pk),
        "enrollment": raw_column("workflow_runs", "recipient", enrollment.pk),
    }
    for plain in ("alice@example.com", "alice", WHSEC, "whsec_", PHONE, "5551234567"):
        for column, value in stored.items():
            assert plain not in value, column
    for value in stored.values():
        assert value.startswith("gAAAAA")  # a Fernet token
    with connection.cursor() as cursor:
        cursor.execute("SELECT key_hash FROM api_keys WHERE id = %s", [rows.api_key.pk])
        (key_hash,) = cursor.fetchone()
    assert rows.raw_key not in key_hash and rows.raw_key.split("_")[2] not in key_hash
    # ...and the model still reads them back.
    assert Notification.objects.get(pk=rows.notification.pk).recipient == "alice@example.com"
    assert Provider.objects.get(pk=rows.provider.pk).secrets == {"signing_secret": WHSEC}
    assert WorkflowRun.objects.get(pk=enrollment.pk).recipient == PHONE


def test_orm_update_with_plain_text_encrypts_it(rows_a):
    Notification.objects.filter(pk=rows_a.notification.pk).update(recipient="carol@example.com")
    assert "carol" not in raw_column("notifications", "recipient", rows_a.notification.pk)
    assert Notification.objects.get(pk=rows_a.notification.pk).recipient == "carol@example.com"


def test_values_and_raw_sql_see_only_tokens(rows_a):
    token = Notification.objects.filter(pk=rows_a.notification.pk).values_list("recipient", flat=True).get()
    assert "alice" not in token and crypto.decrypt(token) == "alice@example.com"


def test_saving_a_loaded_row_without_touching_the_field_keeps_the_token(rows_a):
    before = raw_column("notifications", "recipient", rows_a.notification.pk)
    row = Notification.objects.get(pk=rows_a.notification.pk)
    row.subject = "changed"
    row.save()
    assert raw_column("notifications", "recipient", rows_a.notification.pk) == before


# --- decrypting with a missing key ----------------------------------------------------------------


def test_value_under_a_removed_key_raises_naming_model_field_and_row(rows_a):
    with override_settings(OMNIPOST_ENCRYPTION_KEYS=[Fernet.generate_key().decode()]):
        row = Notification.objects.get(pk=rows_a.notification.pk)  # loading does not decrypt
        with pytest.raises(crypto.DecryptionError) as info:
            row.recipient  # noqa: B018
        message = str(info.value)
        assert "Notification.recipient" in message and str(rows_a.notification.pk) in message
        assert "alice" not in message
        provider = Provider.objects.get(pk=rows_a.provider.pk)
        with pytest.raises(crypto.DecryptionError, match=rf"Provider\.secrets of row {rows_a.provider.pk}"):
            provider.secrets  # noqa: B018


def test_garbage_in_the_column_raises_instead_of_returning_garbage(rows_a):
    with connection.cursor() as cursor:
        cursor.execute("UPDATE notifications SET recipient = 'not-a-token' WHERE id = %s", [rows_a.notification.pk])
    with pytest.raises(crypto.DecryptionError):
        Notification.objects.get(pk=rows_a.notification.pk).recipient  # noqa: B018


# --- configuration ------------------------------------------------------------------------------


def test_parse_keys_accepts_a_list_newest_first():
    k1, k2 = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    assert parse_keys(f" {k1} , {k2} ,") == [k1, k2]


@pytest.mark.parametrize(("raw", "index"), [("nope", 1), (f"{GOOD_KEY},short", 2)])
def test_parse_keys_names_the_bad_key(raw, index):
    with pytest.raises(ImproperlyConfigured, match=rf"key #{index} is not a valid Fernet key"):
        parse_keys(raw)


def test_dev_key_is_generated_once_private_and_reused(tmp_path):
    path = tmp_path / "var" / "encryption.key"
    first = load_encryption_keys("", debug=True, dev_key_file=path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert load_encryption_keys("", debug=True, dev_key_file=path) == first
    with pytest.raises(ImproperlyConfigured, match="OMNIPOST_ENCRYPTION_KEYS is required when DEBUG is off"):
        load_encryption_keys("", debug=False, dev_key_file=path)


def test_processes_starting_together_all_get_the_one_dev_key(tmp_path):
    """Eight processes load the key at once, as `make run`'s do on a fresh checkout: none fails on
    the file another one is creating, none reads it empty, all get the same key."""
    path = tmp_path / "var" / "encryption.key"
    code = (
        "import sys; from pathlib import Path; from omnipost_site.keys import load_encryption_keys; "
        "print(load_encryption_keys('', debug=True, dev_key_file=Path(sys.argv[1]))[0])"
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,  # noqa: S603
                         text=True, cwd=REPO)  # fmt: skip
        for _ in range(8)
    ]
    results = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0] * 8, [err for _, err in results]
    assert len({out.strip() for out, _ in results}) == 1
    assert [p.name for p in path.parent.iterdir()] == ["encryption.key"]  # no draft left behind


def _check(**env: str):  # noqa: ANN202
    base = {
        "DJANGO_SETTINGS_MODULE": "omnipost_site.settings",
        "DEBUG": "false",
        "SECRET_KEY": "a-production-like-secret",
        "DATABASE_URL": os.environ["DATABASE_URL"],  # the suite's (settings_test sets it); check does not connect
    }
    return run_manage("check", env=clean_env(**{**base, **env}))


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ("not-a-key", "OMNIPOST_ENCRYPTION_KEYS: key #1 is not a valid Fernet key"),
        (f"{GOOD_KEY},also-bad", "OMNIPOST_ENCRYPTION_KEYS: key #2 is not a valid Fernet key"),
        ("", "OMNIPOST_ENCRYPTION_KEYS is required when DEBUG is off"),
    ],
)
def test_bad_or_missing_keys_fail_start_up_with_one_line(keys, message):
    result = _check(**({"OMNIPOST_ENCRYPTION_KEYS": keys} if keys else {}))
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert message in lines[0]
    assert "Traceback" not in result.stderr


def test_good_configuration_passes_the_check():
    result = _check(OMNIPOST_ENCRYPTION_KEYS=Fernet.generate_key().decode())
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SECRET_KEY": ""}, "SECRET_KEY is required when DEBUG is off"),
        ({"OMNIPOST_LEASE_SECONDS": "soon"}, "OMNIPOST_LEASE_SECONDS"),
        ({"OMNIPOST_MAX_ATTEMPTS": "many"}, "OMNIPOST_MAX_ATTEMPTS"),
        ({"OMNIPOST_LOG_FORMAT": "xml"}, "OMNIPOST_LOG_FORMAT"),
    ],
)
def test_other_bad_settings_fail_with_one_line_naming_the_variable(env, message):
    result = _check(OMNIPOST_ENCRYPTION_KEYS=Fernet.generate_key().decode(), **env)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert message in lines[0]

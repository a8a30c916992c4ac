"""The migration that makes sequences workflows: a sequence with its steps and two enrollments (one
removed) stored by the old tables become a workflow of kind `sequence` and two runs with the same ids,
their recipients still readable, and the API serves them as before."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from core.fields import EncryptedTextField
from templating.models import Template
from tests.support.setups import EMAIL

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

BEFORE = [("workflows", "0001_initial"), ("notifications", "0027_attempt_lean_indexes")]


def migrate(targets: list[tuple[str, str]]) -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)


def test_sequences_and_enrollments_become_a_workflow_and_its_runs(api_a, setup_a):
    tenant = setup_a.tenant
    for i in range(2):
        Template.objects.create(tenant=tenant, key=f"t{i}", channel="email", body=f"step {i}")
    leaves = [(app, name) for app, name in MigrationExecutor(connection).loader.graph.leaf_nodes()]
    migrate(BEFORE)
    try:
        cipher = EncryptedTextField().get_prep_value(EMAIL)
        starts = datetime(2030, 1, 1, 9, tzinfo=UTC)
        kept, removed = uuid.uuid4(), uuid.uuid4()
        notes: dict[uuid.UUID, list[uuid.UUID]] = {kept: [uuid.uuid4(), uuid.uuid4()], removed: [uuid.uuid4()]}
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO sequences (tenant_id, key, name, created_at) VALUES (%s, 'drip', 'Drip', now()) "
                "RETURNING id",
                [tenant.pk],
            )
            (sequence_id,) = cursor.fetchone()
            for position, offset in enumerate((0, 3600)):
                cursor.execute(
                    "INSERT INTO sequence_steps (tenant_id, sequence_id, position, offset_seconds, channel, "
                    "template_id) SELECT %s, %s, %s, %s, 'email', id FROM templates WHERE key = %s",
                    [tenant.pk, sequence_id, position, offset, f"t{position}"],
                )
            for enrollment, state in ((kept, "active"), (removed, "cancelled")):
                cursor.execute(
                    "INSERT INTO sequence_enrollments (id, tenant_id, sequence_id, recipient, recipient_masked, "
                    "context, starts_at, state, created_at, cancelled_at) VALUES (%s, %s, %s, %s, 'j***@example.com', "
                    "'{\"name\": \"Jane\"}', %s, %s, now(), CASE WHEN %s = 'cancelled' THEN now() END)",
                    [enrollment, tenant.pk, sequence_id, cipher, starts, state, state],
                )
                for step, note in enumerate(notes[enrollment]):
                    cursor.execute(
                        "INSERT INTO notifications (id, tenant_id, channel, recipient, recipient_masked, provider_id, "
                        "context, subject, body, priority, queue, category, status, scheduled_for, metadata, "
                        "attempt_count, attempt_offset, last_error_code, enrollment_id, created_at, updated_at) "
                        "VALUES (%s, %s, 'email', %s, 'j***@example.com', %s, '{}', '', 'b', 5, 'default', 'general', "
                        "'scheduled', %s, %s, 0, 0, '', %s, now(), now())",
                        [note, tenant.pk, cipher, setup_a.mail.pk, starts,
                         f'{{"sequence": "drip", "enrollment_id": "{enrollment}", "step": {step}}}', enrollment],
                    )  # fmt: skip
    finally:
        migrate(leaves)

    sequence = api_a.get("/api/v1/sequences/drip").json()
    assert sequence["name"] == "Drip" and sequence["steps"] == [
        {"position": 0, "offset_seconds": 0, "channel": "email", "template": "t0"},
        {"position": 1, "offset_seconds": 3600, "channel": "email", "template": "t1"},
    ]
    detail = api_a.get(f"/api/v1/sequences/drip/enrollments/{kept}").json()
    assert detail["state"] == "active" and detail["recipient_masked"] == "j***@example.com"
    assert detail["context"] == {"name": "Jane"} and detail["starts_at"] == "2030-01-01T09:00:00Z"
    assert [(s["position"], s["notification_id"]) for s in detail["steps"]] == [
        (0, str(notes[kept][0])), (1, str(notes[kept][1]))]  # fmt: skip
    gone = api_a.get(f"/api/v1/sequences/drip/enrollments/{removed}").json()
    assert gone["state"] == "cancelled" and gone["cancelled_at"] is not None

    from workflows.models import WorkflowRun

    run = WorkflowRun.objects.get(pk=kept)
    assert run.recipient == EMAIL and run.workflow.kind == "sequence"
    assert [s["type"] for s in run.definition] == ["send", "delay", "send"]
    assert run.definition[0]["provider"] == setup_a.mail.name
    # removing the migrated enrollment cancels its scheduled steps, as before
    assert api_a.delete(f"/api/v1/sequences/drip/enrollments/{kept}").status_code == 204
    statuses = [s["status"] for s in api_a.get(f"/api/v1/sequences/drip/enrollments/{kept}").json()["steps"]]
    assert statuses == ["cancelled", "cancelled"]

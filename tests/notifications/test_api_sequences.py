"""Sequences and enrollments through the API: shapes, validation, cancellation, tenant isolation,
audit and constant query counts."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from core.models import AuditEvent
from notifications.models import Notification
from queueing.models import QueueItem, ScheduledJob
from templating.models import Template
from tests.support.setups import EMAIL, PHONE, TOKEN
from workflows.models import Workflow, WorkflowRun

# A sequence is a workflow of its kind; an enrollment, a run of it.
Sequence = Workflow.objects.filter(kind="sequence")
Enrollment = WorkflowRun.objects.filter(workflow__kind="sequence")

pytestmark = pytest.mark.django_db

SEQUENCES = "/api/v1/sequences"


def enrollments_url(key: str = "onboarding") -> str:
    return f"{SEQUENCES}/{key}/enrollments"


def templates(tenant, channel: str = "email", count: int = 3, prefix: str = "t") -> list[str]:  # noqa: ANN001
    keys = [f"{prefix}{i}" for i in range(count)]
    Template.objects.bulk_create(
        Template(tenant=tenant, key=k, channel=channel, subject=f"{k}: {{{{ name }}}}", body=f"{k} for {{{{ name }}}}")
        for k in keys
    )
    return keys


def steps(keys: list[str], channel: str = "email", spacing: int = 3600) -> list[dict]:
    return [{"offset_seconds": i * spacing, "channel": channel, "template": k} for i, k in enumerate(keys)]


def define(client, key: str = "onboarding", step_list: list[dict] | None = None, **extra):  # noqa: ANN001, ANN201
    return client.post(SEQUENCES, {"key": key, "steps": step_list, **extra}, format="json")


@pytest.fixture
def onboarding(api_a, setup_a) -> str:
    """Tenant A's 3-step email sequence `onboarding` (offsets 0 s, 1 h, 2 h)."""
    response = define(api_a, step_list=steps(templates(setup_a.tenant)), name="Onboarding")
    assert response.status_code == 201, response.content
    return "onboarding"


def enroll(client, key: str = "onboarding", **body):  # noqa: ANN001, ANN201
    return client.post(enrollments_url(key), {"recipient": EMAIL, "context": {"name": "Jane"}, **body}, format="json")


def error_details(response) -> dict:  # noqa: ANN001
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "validation_error"
    return error["details"]


# --- defining -------------------------------------------------------------------------------------


def test_define_a_sequence_then_read_it(api_a, setup_a):
    keys = templates(setup_a.tenant)
    response = define(api_a, step_list=steps(keys), name="Onboarding")
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["key"] == "onboarding" and data["name"] == "Onboarding" and data["created_at"]
    assert data["steps"] == [
        {"position": 0, "offset_seconds": 0, "channel": "email", "template": "t0"},
        {"position": 1, "offset_seconds": 3600, "channel": "email", "template": "t1"},
        {"position": 2, "offset_seconds": 7200, "channel": "email", "template": "t2"},
    ]
    assert api_a.get(f"{SEQUENCES}/onboarding").json() == data
    listing = api_a.get(SEQUENCES).json()
    assert listing["results"] == [data] and listing["next"] is None
    event = AuditEvent.objects.get(action="sequence.created")
    assert event.tenant_id == setup_a.tenant.pk and event.details == {"key": "onboarding", "steps": 3}


def test_push_and_webhook_steps_share_a_recipient_format(api_a, setup_a):
    push = templates(setup_a.tenant, "push", 1, prefix="p")
    hook = templates(setup_a.tenant, "webhook", 1, prefix="w")
    response = define(api_a, step_list=[*steps(push, "push"), {"offset_seconds": 60, "channel": "webhook",
                                                                "template": hook[0]}])  # fmt: skip
    assert response.status_code == 201, response.content


def test_duplicate_key_is_409(api_a, onboarding, setup_a):
    response = define(api_a, step_list=steps(["t0"]))
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "already_exists"
    assert [len(s) for s in Sequence.values_list("steps", flat=True)] == [5]  # 3 sends, 2 delays


def _many(n: int) -> list[dict]:
    return [{"offset_seconds": 0, "channel": "email", "template": "t0"}] * n


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"key": "s", "steps": []}, {"steps"}),
        ({"key": "s", "steps": _many(51)}, {"steps"}),
        ({"key": "s"}, {"steps"}),
        ({"key": "has space", "steps": _many(1)}, {"key"}),
        ({"key": "s", "steps": _many(1), "colour": "red"}, {"colour"}),
        ({"key": "s", "steps": _many(1), "name": 5}, {"name"}),
    ],
)
def test_invalid_sequence_fields_are_400(api_a, setup_a, body, expected):
    templates(setup_a.tenant, count=1)
    assert set(error_details(api_a.post(SEQUENCES, body, format="json"))) == expected
    assert not Sequence.exists()


@pytest.mark.parametrize(
    ("bad_step", "field"),
    [
        ({"offset_seconds": -1, "channel": "email", "template": "t1"}, "offset_seconds"),
        ({"offset_seconds": "60", "channel": "email", "template": "t1"}, "offset_seconds"),
        ({"offset_seconds": 60, "channel": "pigeon", "template": "t1"}, "channel"),
        ({"offset_seconds": 60, "channel": "email", "template": "no such"}, "template"),
        ({"offset_seconds": 60, "channel": "email", "template": "t1", "position": 3}, "position"),
        ({"offset_seconds": 60, "channel": "email"}, "template"),
    ],
)
def test_a_bad_step_is_named_by_its_index(api_a, setup_a, bad_step, field):
    templates(setup_a.tenant, count=2)
    body = {"key": "s", "steps": [{"offset_seconds": 0, "channel": "email", "template": "t0"}, bad_step]}
    details = error_details(api_a.post(SEQUENCES, body, format="json"))
    assert set(details) == {"steps"} and set(details["steps"]) == {"1"}
    assert field in details["steps"]["1"]
    assert not Sequence.exists()


def test_unknown_template_or_one_of_another_channel_is_400_naming_the_step(api_a, setup_a):
    templates(setup_a.tenant, count=1)
    body = steps(["t0", "missing", "welcome"])
    body[2]["channel"] = "email"
    Template.objects.create(tenant=setup_a.tenant, key="texty", channel="sms", body="x")
    body.append({"offset_seconds": 99999, "channel": "email", "template": "texty"})
    details = error_details(define(api_a, step_list=body))["steps"]
    assert set(details) == {"1", "3"}
    assert details["1"] == {"template": ["no template with key 'missing'; create it first (POST templates)"]}
    assert details["3"] == {"template": ["template 'texty' is for channel 'sms', not 'email'"]}


def test_another_tenants_template_is_unknown(api_b, setup_a, setup_b):
    templates(setup_a.tenant, count=1, prefix="a")
    details = error_details(define(api_b, step_list=steps(["a0"])))
    assert "template" in details["steps"]["0"]


def test_steps_must_share_a_recipient_format_and_keep_their_order(api_a, setup_a):
    templates(setup_a.tenant, count=2)
    templates(setup_a.tenant, "sms", 1, prefix="s")
    body = [*steps(["t0", "t1"], spacing=600), {"offset_seconds": 60, "channel": "sms", "template": "s0"}]
    details = error_details(define(api_a, step_list=body))["steps"]
    assert set(details) == {"2"} and set(details["2"]) == {"channel", "offset_seconds"}
    assert "same recipient" in details["2"]["channel"][0]


def test_a_template_used_by_a_step_cannot_be_deleted(api_a, onboarding):
    response = api_a.delete("/api/v1/templates/t1")
    assert response.status_code == 409 and response.json()["error"]["code"] == "template_in_use"


# --- enrolling ------------------------------------------------------------------------------------


def test_enroll_schedules_every_step_and_queues_the_due_one(api_a, setup_a, onboarding):
    before = timezone.now()
    response = enroll(api_a)
    assert response.status_code == 201, response.content
    data = response.json()
    assert EMAIL not in response.content.decode()
    assert data["sequence"] == "onboarding" and data["recipient_masked"] == "j***@example.com"
    assert data["state"] == "active" and data["cancelled_at"] is None and data["context"] == {"name": "Jane"}
    assert [(s["position"], s["channel"], s["status"]) for s in data["steps"]] == [
        (0, "email", "queued"), (1, "email", "scheduled"), (2, "email", "scheduled")]  # fmt: skip

    enrollment = Enrollment.get(pk=data["id"])
    assert enrollment.recipient == EMAIL and before <= enrollment.starts_at <= timezone.now()
    notes = {str(n.id): n for n in Notification.objects.filter(metadata__enrollment_id=data["id"])}
    assert set(notes) == {s["notification_id"] for s in data["steps"]}
    for step in data["steps"]:
        note = notes[step["notification_id"]]
        assert note.recipient == EMAIL and note.provider_id == setup_a.mail.pk
        assert note.subject == f"t{step['position']}: Jane" and note.body == f"t{step['position']} for Jane"
        assert note.scheduled_for == enrollment.starts_at + timedelta(hours=step["position"])
        assert note.metadata == {"sequence": "onboarding", "enrollment_id": data["id"], "step": step["position"]}
    first, *later = (notes[s["notification_id"]] for s in data["steps"])
    assert QueueItem.objects.filter(notification_id=first.pk).exists()
    jobs = ScheduledJob.objects.filter(notification_id__in=[n.pk for n in later])
    assert sorted((j.run_at, j.status) for j in jobs) == [(n.scheduled_for, "pending") for n in later]
    assert not QueueItem.objects.filter(notification_id__in=[n.pk for n in later]).exists()

    assert api_a.get(f"{enrollments_url()}/{data['id']}").json() == data
    assert api_a.get(enrollments_url()).json()["results"] == [data]
    event = AuditEvent.objects.get(action="sequence.enrolled")
    assert event.target_id == data["id"] and EMAIL not in str(event.details)
    assert event.details["recipient_masked"] == "j***@example.com"


def test_starts_at_in_the_future_schedules_every_step(api_a, setup_a, onboarding):
    response = enroll(api_a, starts_at="2035-01-01T09:00:00+01:00")
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["starts_at"] == "2035-01-01T08:00:00Z"
    assert [s["scheduled_for"] for s in data["steps"]] == [
        "2035-01-01T08:00:00Z", "2035-01-01T09:00:00Z", "2035-01-01T10:00:00Z"]  # fmt: skip
    assert {s["status"] for s in data["steps"]} == {"scheduled"}
    assert ScheduledJob.objects.filter(status="pending").count() == 3 and not QueueItem.objects.exists()


def test_a_past_start_queues_the_steps_already_due(api_a, setup_a, onboarding):
    starts = (timezone.now() - timedelta(minutes=90)).isoformat()
    data = enroll(api_a, starts_at=starts).json()
    assert [s["status"] for s in data["steps"]] == ["queued", "queued", "scheduled"]
    assert QueueItem.objects.count() == 2 and ScheduledJob.objects.count() == 1


def test_provider_by_name_or_per_channel(api_a, setup_a):
    spare = setup_a.mail.__class__.objects.create(tenant=setup_a.tenant, name="spare", kind="console",
                                                  channel="email")  # fmt: skip
    define(api_a, step_list=steps(templates(setup_a.tenant)))
    one = enroll(api_a, provider="spare").json()
    per_channel = enroll(api_a, provider={"email": "spare"}).json()
    other_channel_only = enroll(api_a, provider={"sms": "text"}).json()
    for data, expected in ((one, spare.pk), (per_channel, spare.pk), (other_channel_only, setup_a.mail.pk)):
        ids = [s["notification_id"] for s in data["steps"]]
        assert set(Notification.objects.filter(pk__in=ids).values_list("provider_id", flat=True)) == {expected}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"recipient": PHONE}, "recipient"),
        ({"recipient": ""}, "recipient"),
        ({"recipient": 5}, "recipient"),
        ({"recipient": None}, "recipient"),
        ({"context": {"blob": "x" * 5000}}, "context"),
        ({"context": [1]}, "context"),
        ({"starts_at": "2030-01-01T09:00:00"}, "starts_at"),
        ({"starts_at": "tomorrow"}, "starts_at"),
        ({"starts_at": "9999-01-01T00:00:00Z"}, "starts_at"),
        ({"provider": "has space"}, "provider"),
        ({"provider": {"carrier-pigeon": "x"}}, "provider"),
        ({"provider": 7}, "provider"),
        ({"priority": 9}, "priority"),
    ],
)
def test_invalid_enrollment_fields_are_400(api_a, setup_a, onboarding, body, field):
    assert field in error_details(enroll(api_a, **body))
    assert not Enrollment.exists() and not Notification.objects.exists()


@pytest.mark.parametrize(
    ("provider", "message"),
    [
        ("nope", "no provider named 'nope'"),
        ("text", "provider 'text' serves channel 'sms'"),
        ({"email": "nope"}, "no provider named 'nope'"),
    ],
)
def test_provider_problems_are_named_per_step(api_a, setup_a, onboarding, provider, message):
    details = error_details(enroll(api_a, provider=provider))
    assert set(details["steps"]) == {"0", "1", "2"}
    assert details["steps"]["0"] == {"provider": [message]}
    assert not Enrollment.exists() and not Notification.objects.exists()


def test_a_channel_without_a_default_provider_is_400(api_a, setup_a, onboarding):
    setup_a.mail.__class__.objects.filter(pk=setup_a.mail.pk).update(is_default=False)
    details = error_details(enroll(api_a))
    assert "no default provider for channel 'email'" in details["steps"]["0"]["provider"][0]


def test_sms_and_token_sequences_check_their_recipients(api_a, setup_a):
    define(api_a, "texts", steps(templates(setup_a.tenant, "sms", 2, prefix="s"), "sms"))
    assert "recipient" in error_details(enroll(api_a, "texts"))
    data = enroll(api_a, "texts", recipient=PHONE).json()
    assert data["recipient_masked"] == "+1******4567"
    define(api_a, "pushes", steps(templates(setup_a.tenant, "push", 1, prefix="p"), "push"))
    assert enroll(api_a, "pushes", recipient=TOKEN).json()["recipient_masked"] == "tok_****9f2c"
    assert "recipient" in error_details(enroll(api_a, "pushes", recipient="bad\x07token"))


def test_unknown_sequence_is_404(api_a, setup_a):
    for response in (enroll(api_a, "nope"), api_a.get(enrollments_url("nope")), api_a.get(f"{SEQUENCES}/nope")):
        assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"


def test_idempotency_key_makes_an_enrollment_safe_to_retry(api_a, setup_a, onboarding):
    body = {"recipient": EMAIL, "context": {"name": "Jane"}}
    first = api_a.post(enrollments_url(), body, format="json", HTTP_IDEMPOTENCY_KEY="enroll-jane-1")
    again = api_a.post(enrollments_url(), body, format="json", HTTP_IDEMPOTENCY_KEY="enroll-jane-1")
    assert first.status_code == again.status_code == 201
    assert again.json() == first.json() and again.headers["Idempotent-Replayed"] == "true"
    assert Enrollment.count() == 1 and Notification.objects.count() == 3
    other = api_a.post(enrollments_url(), {**body, "context": {}}, format="json", HTTP_IDEMPOTENCY_KEY="enroll-jane-1")
    assert other.status_code == 422


# --- removing -------------------------------------------------------------------------------------


def test_remove_cancels_the_steps_not_yet_sent(api_a, setup_a, onboarding):
    data = enroll(api_a).json()
    first, second, third = (s["notification_id"] for s in data["steps"])
    Notification.objects.filter(pk=first).update(status="delivered")  # step 0 went out already
    QueueItem.objects.filter(notification_id=first).delete()
    response = api_a.delete(f"{enrollments_url()}/{data['id']}")
    assert response.status_code == 204 and response.content == b""

    statuses = dict(Notification.objects.values_list("id", "status"))
    assert {str(k): v for k, v in statuses.items()} == {first: "delivered", second: "cancelled", third: "cancelled"}
    assert set(ScheduledJob.objects.values_list("status", flat=True)) == {"cancelled"}
    detail = api_a.get(f"{enrollments_url()}/{data['id']}").json()
    assert detail["state"] == "cancelled" and detail["cancelled_at"] is not None
    assert [s["status"] for s in detail["steps"]] == ["delivered", "cancelled", "cancelled"]
    event = AuditEvent.objects.get(action="sequence.unenrolled")
    assert event.target_id == data["id"] and event.tenant_id == setup_a.tenant.pk
    assert event.details == {"sequence": "onboarding", "steps_cancelled": 2, "jobs_cancelled": 2}

    again = api_a.delete(f"{enrollments_url()}/{data['id']}")
    assert again.status_code == 409 and again.json()["error"]["code"] == "already_cancelled"


def test_remove_deletes_the_queue_item_of_a_due_step(api_a, setup_a, onboarding):
    data = enroll(api_a).json()
    assert QueueItem.objects.count() == 1
    assert api_a.delete(f"{enrollments_url()}/{data['id']}").status_code == 204
    assert not QueueItem.objects.exists()
    assert set(Notification.objects.values_list("status", flat=True)) == {"cancelled"}


def test_remove_leaves_other_enrollments_alone(api_a, setup_a, onboarding):
    kept = enroll(api_a).json()
    removed = enroll(api_a).json()
    assert api_a.delete(f"{enrollments_url()}/{removed['id']}").status_code == 204
    assert [s["status"] for s in api_a.get(f"{enrollments_url()}/{kept['id']}").json()["steps"]] == [
        "queued", "scheduled", "scheduled"]  # fmt: skip
    assert QueueItem.objects.count() == 1 and ScheduledJob.objects.filter(status="pending").count() == 2


def test_unknown_enrollment_or_one_under_another_key_is_404(api_a, setup_a, onboarding):
    data = enroll(api_a).json()
    define(api_a, "other", steps(["t0"]))
    for path in (f"{enrollments_url()}/00000000-0000-0000-0000-000000000000",
                 f"{enrollments_url('other')}/{data['id']}", f"{enrollments_url()}/not-a-uuid"):  # fmt: skip
        assert api_a.get(path).status_code == 404
        assert api_a.delete(path).status_code == 404
    assert Enrollment.get().status != "cancelled"


# --- tenants --------------------------------------------------------------------------------------


def snapshot() -> dict:
    return {
        "sequences": sorted(Sequence.values_list("id", "key", "name")),
        "enrollments": sorted(Enrollment.values_list("id", "status", "updated_at")),
        "notifications": sorted(Notification.objects.values_list("id", "status", "updated_at")),
        "jobs": sorted(ScheduledJob.objects.values_list("job_id", "status")),
        "items": sorted(QueueItem.objects.values_list("item_id", flat=True)),
        "audit": AuditEvent.objects.count(),
    }


def test_another_tenants_sequences_and_enrollments_are_404_and_unchanged(api_a, api_b, setup_a, setup_b, onboarding):
    templates(setup_b.tenant, count=3)  # B has templates with the same keys, not the sequence
    data = enroll(api_a).json()
    before = snapshot()
    enrollment = f"{enrollments_url()}/{data['id']}"
    for response in (
        api_b.get(f"{SEQUENCES}/onboarding"),
        api_b.get(enrollments_url()),
        enroll(api_b),
        api_b.get(enrollment),
        api_b.delete(enrollment),
    ):
        assert response.status_code == 404, response.content
        assert response.json()["error"]["code"] == "not_found"
    assert api_b.get(SEQUENCES).json()["results"] == []
    assert snapshot() == before
    # Keys are per tenant: B may define its own `onboarding`, and A's enrollment stays out of its reach.
    assert define(api_b, step_list=steps(["t0"])).status_code == 201
    assert api_b.delete(enrollment).status_code == 404
    assert Enrollment.get(pk=data["id"]).status != "cancelled"


def test_endpoints_need_a_key(anonymous, setup_a):
    for response in (anonymous.get(SEQUENCES), anonymous.post(SEQUENCES, {}, format="json"),
                     anonymous.post(enrollments_url(), {}, format="json")):  # fmt: skip
        assert response.status_code == 401


# --- statements -----------------------------------------------------------------------------------


def _enroll_queries(client, tenant, n: int) -> list[str]:  # noqa: ANN001
    key = f"seq{n}"
    assert define(client, key, steps(templates(tenant, count=n, prefix=key), spacing=60)).status_code == 201
    with CaptureQueriesContext(connection) as queries:
        response = enroll(client, key)
    assert response.status_code == 201 and len(response.json()["steps"]) == n
    return [q["sql"] for q in queries.captured_queries]


def test_enrollment_statements_do_not_grow_with_the_steps(api_a, setup_a):
    two = _enroll_queries(api_a, setup_a.tenant, 2)
    twenty = _enroll_queries(api_a, setup_a.tenant, 20)
    assert len(two) == len(twenty), "\n".join(twenty)
    assert Notification.objects.count() == 22 and ScheduledJob.objects.count() == 20


def test_remove_statements_do_not_grow_with_the_steps(api_a, setup_a):
    counts = []
    for n in (2, 20):
        key = f"seq{n}"
        define(api_a, key, steps(templates(setup_a.tenant, count=n, prefix=key), spacing=60))
        data = enroll(api_a, key).json()
        with CaptureQueriesContext(connection) as queries:
            assert api_a.delete(f"{enrollments_url(key)}/{data['id']}").status_code == 204
        counts.append(len(queries.captured_queries))
    assert counts[0] == counts[1]
    assert set(Notification.objects.values_list("status", flat=True)) == {"cancelled"}


# --- schema ---------------------------------------------------------------------------------------


def test_the_schema_documents_the_sequence_operations():
    spec = Client().get("/api/schema/?format=json").json()
    ops = {
        ("/api/v1/sequences", "get"), ("/api/v1/sequences", "post"), ("/api/v1/sequences/{key}", "get"),
        ("/api/v1/sequences/{key}/enrollments", "get"), ("/api/v1/sequences/{key}/enrollments", "post"),
        ("/api/v1/sequences/{key}/enrollments/{enrollment_id}", "get"),
        ("/api/v1/sequences/{key}/enrollments/{enrollment_id}", "delete"),
    }  # fmt: skip
    for path, method in ops:
        responses = spec["paths"][path][method]["responses"]
        assert {"401", "429"} <= set(responses), (path, method)
    assert {"201", "400", "409"} <= set(spec["paths"]["/api/v1/sequences"]["post"]["responses"])
    assert {"204", "404", "409"} <= set(
        spec["paths"]["/api/v1/sequences/{key}/enrollments/{enrollment_id}"]["delete"]["responses"]
    )
    for name in ("SequenceRequest", "SequenceStepRequest", "EnrollmentCreateRequest"):
        assert spec["components"]["schemas"][name]["additionalProperties"] is False, name

from __future__ import annotations

import sys

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from core.management.tenants import resolve_tenant
from core.models import AuditEvent, TenantMembership

OPERATORS_GROUP = "OmniPost operators"
# What tenant staff may do in the console: look at everything of their tenants, redrive/discard.
OPERATOR_PERMISSIONS = [
    ("core", "view_tenant"),
    ("core", "view_apikey"),
    ("core", "view_auditevent"),
    ("notifications", "view_notification"),
    ("notifications", "view_deliveryattempt"),
    ("providers", "view_provider"),
    ("templating", "view_template"),
    ("templating", "view_templateversion"),
    ("queueing", "view_scheduledjob"),
    ("queueing", "view_queueitem"),
    ("queueing", "view_worker"),
    ("dlq", "view_deadletter"),
    ("dlq", "redrive_deadletter"),
    ("receipts", "view_notificationevent"),
    ("workflows", "view_workflow"),
    ("workflows", "view_workflowrun"),
    ("workflows", "view_fanout"),
    ("workflows", "cancel_fanout"),
    ("recipients", "view_topic"),
    ("recipients", "view_topicsubscriber"),
    ("bulk", "view_bulksend"),
    ("bulk", "cancel_bulksend"),
    ("inbox", "view_inboxitem"),
]


def operators_group() -> Group:
    group, _ = Group.objects.get_or_create(name=OPERATORS_GROUP)
    perms = [
        p
        for p in Permission.objects.select_related("content_type")
        if (p.content_type.app_label, p.codename) in set(OPERATOR_PERMISSIONS)
    ]
    group.permissions.set(perms)
    return group


class Command(BaseCommand):
    help = "Create (or update) a staff login for the admin that sees only the given tenant(s)."

    def add_arguments(self, parser) -> None:  # noqa: ANN001
        parser.add_argument("username")
        parser.add_argument("--tenant", action="append", required=True, help="tenant id or name; repeatable")
        parser.add_argument("--password-stdin", action="store_true", help="read the password from standard input")

    def handle(self, *args, username: str, tenant: list[str], password_stdin: bool, **options) -> None:
        User = get_user_model()  # noqa: N806
        try:
            User.username_validator(username)
        except ValidationError as exc:
            raise CommandError(f"invalid username {username!r}: {' '.join(exc.messages)}") from None
        tenants = [resolve_tenant(ref) for ref in tenant]
        password = None
        if password_stdin:
            password = sys.stdin.readline().rstrip("\r\n")
            if not password:
                raise CommandError("no password on standard input")
            try:
                validate_password(password, User(username=username))
            except ValidationError as exc:
                raise CommandError(f"password rejected: {' '.join(exc.messages)}") from None
        with transaction.atomic():
            user, created = User.objects.get_or_create(username=username, defaults={"is_staff": True})
            user.is_staff = True
            if password is not None:
                user.set_password(password)
            elif created:
                user.set_unusable_password()
            user.save()
            user.groups.add(operators_group())
            for t in tenants:
                TenantMembership.objects.get_or_create(user=user, tenant=t)
                AuditEvent.record(
                    actor="system:create_staff_user",
                    action="staff.granted",
                    target=t,
                    tenant=t,
                    target_type="user",
                    target_id=user.pk,
                    details={"username": username},
                )
        names = ", ".join(t.name for t in tenants)
        self.stdout.write(f"{'created' if created else 'updated'} staff user {username!r} for: {names}")
        if not user.has_usable_password():
            self.stdout.write("no password set: pass --password-stdin to set one before logging in")

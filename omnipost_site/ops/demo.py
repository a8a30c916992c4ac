"""The demo tenant `make run` creates once: an API key, console providers, an admin login."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import transaction

from core.models import ApiKey, Tenant
from core.models.api_keys import KEY_RE, hash_key

DEMO_TENANT = "demo"


@dataclass
class Demo:
    tenant_id: str
    api_key: str
    admin_user: str
    admin_password: str
    created: bool

    def banner(self, bind: str) -> str:
        base = f"http://{bind}"
        first = "Created" if self.created else "Using"
        return (
            f"\n{first} the demo tenant (credentials in {credentials_file()}):\n"
            f"  admin:   {base}/admin/  user {self.admin_user!r} password {self.admin_password!r}\n"
            f"  API key: {self.api_key}\n"
            f"  docs:    {base}/api/docs/\n\n"
            "Send a first notification:\n"
            f"  curl -s {base}/api/v1/notifications -H 'Authorization: Bearer {self.api_key}' \\\n"
            "    -H 'Content-Type: application/json' \\\n"
            '    -d \'{"channel": "email", "recipient": "jane@example.com", "subject": "Hi", '
            '"body": "Hello from OmniPost"}\'\n'
        )


def credentials_file() -> Path:
    """One file per database, so a run against another DATABASE_URL (a test, a staging database)
    does not replace the credentials `make run` shows for the embedded one."""
    db = settings.DATABASES["default"]
    identity = "|".join(str(db.get(k) or "") for k in ("ENGINE", "NAME", "HOST", "PORT"))
    digest = hashlib.sha256(identity.encode()).hexdigest()[:12]
    return Path(settings.VAR_DIR) / f"demo-credentials-{digest}.json"


def ensure_demo() -> Demo:
    """Create the demo tenant and admin once; later runs read the saved credentials (var/, 0600)."""
    path = credentials_file()
    tenant = Tenant.objects.filter(name=DEMO_TENANT).first()
    if tenant is not None:
        saved = _saved_credentials(path, tenant)
        if saved is not None:
            return saved
    with transaction.atomic():
        tenant = tenant or Tenant.objects.create(name=DEMO_TENANT)
        _, raw_key = ApiKey.issue(tenant, name="demo")
        _ensure_console_providers(tenant)
        password = secrets.token_urlsafe(12)
        User = get_user_model()  # noqa: N806
        user, _ = User.objects.get_or_create(username="admin", defaults={"is_staff": True, "is_superuser": True})
        user.is_staff = user.is_superuser = True
        user.set_password(password)
        user.save()
    demo = Demo(tenant_id=str(tenant.pk), api_key=raw_key, admin_user="admin", admin_password=password, created=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump({k: v for k, v in demo.__dict__.items() if k != "created"}, fh)
    return demo


def _saved_credentials(path: Path, tenant: Tenant) -> Demo | None:
    """The saved credentials, if they belong to this database (var/ is shared by every DATABASE_URL)."""
    try:
        data = json.loads(path.read_text())
        demo = Demo(**{**data, "created": False})
    except (OSError, ValueError, TypeError):
        return None
    if demo.tenant_id != str(tenant.pk):
        return None
    match = KEY_RE.fullmatch(demo.api_key)
    key = ApiKey.objects.for_tenant(tenant).active().filter(prefix=match["prefix"]).first() if match else None
    if key is None or key.key_hash != hash_key(demo.api_key):
        return None
    return demo


def _ensure_console_providers(tenant: Tenant) -> None:
    from core.channels import Channel
    from providers.models import Provider, ProviderKind

    for channel in Channel.values:
        if channel == Channel.IN_APP:
            continue  # served by the built-in inbox provider (providers.services.ensure_inbox_provider)
        Provider.objects.get_or_create(
            tenant=tenant,
            name=f"console-{channel}",
            defaults={"channel": channel, "kind": ProviderKind.CONSOLE, "is_default": True},
        )

"""Seeds a database the test process is not connected to (a private server): a tenant, a webhook
provider and queued and scheduled notifications. Prints their ids as JSON.

    python -m tests.queueing.fault_seed --url RECEIVER_URL --queued 600 --scheduled 20 --in 6
"""

from __future__ import annotations

import argparse
import json


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--secret", required=True)
    parser.add_argument("--queued", type=int, default=0)
    parser.add_argument("--scheduled", type=int, default=0)
    parser.add_argument("--in", dest="in_seconds", type=float, default=5.0)
    parser.add_argument("--api-key", action="store_true", help="also issue an API key for the tenant")
    args = parser.parse_args()

    import django

    django.setup()
    from datetime import timedelta

    from django.db import transaction
    from django.utils import timezone

    from core.models import ApiKey, Tenant
    from notifications.services import NotificationSpec, create_notifications
    from tests import factories

    tenant = Tenant.objects.create(name="fault-tenant")
    prov = factories.provider(tenant, "hook", config={"url": args.url}, secrets={"signing_secret": args.secret})
    queued = factories.queued(tenant, prov, args.queued)
    at = timezone.now() + timedelta(seconds=args.in_seconds)
    specs = [NotificationSpec(channel="webhook", recipient="https://example.test/hook", provider=prov, subject="s",
                              body="b", scheduled_for=at) for _ in range(args.scheduled)]
    with transaction.atomic():
        scheduled = create_notifications(tenant, specs, actor="test")
    out = {"queued": [str(n.id) for n in queued], "scheduled": [str(n.id) for n in scheduled], "provider_id": prov.pk}
    if args.api_key:
        out["api_key"] = ApiKey.issue(tenant, name="fault")[1]
    print(json.dumps(out))


if __name__ == "__main__":
    main()

"""A run on SQLite, in its own process (the suite's database is PostgreSQL): a tenant with a
webhook provider and an event endpoint, notifications delivered by `Dispatcher --once`, whose
events the lane delivers; then the endpoint is failed past the disabling time and recovered.

    DATABASE_URL=sqlite:///… python -m tests.events.sqlite_flow --hook URL --events URL --secret S
Prints one JSON line of what happened."""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from datetime import timedelta

import django


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hook")
    parser.add_argument("--events")
    parser.add_argument("--secret")
    parser.add_argument("--hook-secret")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "omnipost_site.settings_test")
    django.setup()
    from django.db.models.functions import Now

    from core.models import Tenant
    from dispatch.dispatcher import Dispatcher, DispatcherConfig
    from events import deliveries, emit, services
    from events.models import EventDelivery, EventEndpoint
    from tests import factories

    tenant = Tenant.objects.create(name="sqlite-events")
    provider = factories.provider(tenant, config={"url": args.hook}, secrets={"signing_secret": args.hook_secret})
    endpoint, _ = services.create_endpoint(tenant, name="ops", url=args.events, event_types=["*"], actor="test",
                                           secret=args.secret)  # fmt: skip
    factories.queued(tenant, provider, 3)
    first = Dispatcher(DispatcherConfig(once=True, jitter=False)).run()
    delivered = EventDelivery.objects.filter(status="delivered").count()
    # one more event, and a failing run that started long ago: its next failure disables the endpoint
    (extra,) = emit.emit(None, tenant.pk, "notification.delivered", [{"notification_id": "n-extra"}])
    EventEndpoint.objects.filter(pk=endpoint.pk).update(failing_since=Now() - timedelta(hours=200))
    token = uuid.uuid4()
    claimed = deliveries.claim_due(10, 30, token)
    deliveries.record([deliveries.Result(c.delivery_id, token, "retry", 0, 503) for c in claimed])
    endpoint.refresh_from_db()
    disabled = not endpoint.enabled
    services.update_endpoint(endpoint, {"enabled": True}, actor="test")
    queued = services.recover(endpoint, endpoint.created_at - timedelta(days=1), actor="test")
    second = Dispatcher(DispatcherConfig(once=True, jitter=False)).run()
    print(json.dumps({
        "exit": [first, second], "delivered_first": delivered, "claimed": len(claimed), "disabled": disabled,
        "recovered": queued, "extra": extra,
        "delivered_after": EventDelivery.objects.filter(status="delivered").count(),
    }))  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())

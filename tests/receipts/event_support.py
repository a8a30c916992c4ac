"""The tenant's side of the receipts end-to-end tests: an event endpoint (created through the API, its
generated secret shown once in the 201) pointing at a loopback receiver, `run_dispatcher --once`
processes that deliver what is due, and the events the receiver got, each verified with the
`standardwebhooks` package under that secret.

    endpoint = add_endpoint(api, event_receiver)          # httpx.Client on /api/v1, or a DRF APIClient;
                                                          # event_receiver: tests/receipts/conftest.py
    deliver_events(subprocess_env, tmp_path)              # a dispatcher process, until nothing is due
    [bounced] = endpoint.of_type("notification.bounced")  # {"webhook_id", "type", "timestamp", "data"}
"""

from __future__ import annotations

import base64
import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from tests.queueing.dispatch_support import start_dispatchers, wait_exit
from tests.support.receivers import HttpReceiver

NAME = "tenant-events"
WRONG_SECRET = "whsec_" + base64.b64encode(b"w" * 32).decode()
_runs = itertools.count()


@dataclass
class TenantEndpoint:
    receiver: HttpReceiver
    secret: str

    def events(self) -> list[dict[str, Any]]:
        """Every request so far, verified with `standardwebhooks.Webhook(secret).verify` (a request that
        does not verify fails the test, and none verifies under another secret)."""
        out = []
        for request in self.receiver.requests:
            payload = Webhook(self.secret).verify(request.body, request.headers)
            with pytest.raises(WebhookVerificationError):
                Webhook(WRONG_SECRET).verify(request.body, request.headers)
            out.append({"webhook_id": request.webhook_id, **payload})
        return out

    def of_type(self, type_: str) -> list[dict[str, Any]]:
        return [event for event in self.events() if event["type"] == type_]

    def bodies(self) -> str:
        return "\n".join(request.body.decode() for request in self.receiver.requests)


def add_endpoint(api: Any, receiver: HttpReceiver) -> TenantEndpoint:  # noqa: ANN401 - httpx or DRF client
    """POST event-endpoints subscribed to every type; the generated secret is in the 201 and never again."""
    body = {"name": NAME, "url": receiver.url, "event_types": ["*"]}
    if isinstance(api, httpx.Client):  # base_url ends in /api/v1
        created, shown = api.post("/event-endpoints", json=body), lambda: api.get(f"/event-endpoints/{NAME}")
    else:
        created = api.post("/api/v1/event-endpoints", body, format="json")
        shown = lambda: api.get(f"/api/v1/event-endpoints/{NAME}")  # noqa: E731
    assert created.status_code == 201, created.content
    secret = created.json()["secret"]
    assert secret.startswith("whsec_")
    again = shown()
    assert again.status_code == 200 and secret not in again.content.decode()  # shown once
    return TenantEndpoint(receiver, secret)


def deliver_events(env: dict[str, str], log_dir: Path) -> None:
    """One `run_dispatcher --once` process: sends what is queued and delivers every event delivery due,
    then exits (0)."""
    directory = log_dir / f"dispatch-{next(_runs)}"
    directory.mkdir()
    [proc] = start_dispatchers(1, env, "--once", "--no-listen", log_dir=directory)
    assert wait_exit([proc], 90) == [0], (directory / "dispatcher0.log").read_text()[-3000:]


def suppressions(api: Any, address: str) -> list[dict[str, Any]]:  # noqa: ANN401 - httpx or DRF client
    """GET suppressions?recipient=<address> (the blind-index lookup)."""
    if isinstance(api, httpx.Client):
        response = api.get("/suppressions", params={"recipient": address})
    else:
        response = api.get("/api/v1/suppressions", {"recipient": address})
    assert response.status_code == 200, response.content
    return response.json()["results"]


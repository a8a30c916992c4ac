"""Shared helpers of the inbox tests: a subscriber, an in_app notification, a real dispatcher run."""

from __future__ import annotations

from queueing.models import QueueItem
from tests.queueing.dispatch_support import start_dispatchers, wait_exit, wait_started, wait_until


def subscriber(api, external_id: str = "jane", **fields: object) -> None:  # noqa: ANN001
    made = api.put(f"/api/v1/subscribers/{external_id}", fields, format="json")
    assert made.status_code in (200, 201), made.content


def notify(api, external_id: str = "jane", subject: str = "Hello", **fields: object) -> str:  # noqa: ANN001
    body = {"channel": "in_app", "subscriber": external_id, "subject": subject, "body": f"{subject}!", **fields}
    made = api.post("/api/v1/notifications", body, format="json")
    assert made.status_code == 201, made.content
    return made.json()["id"]


def drain(env: dict, log_dir, until=lambda: not QueueItem.objects.exists(), timeout: float = 60) -> None:  # noqa: ANN001
    """Run one real dispatcher process until `until()` holds, then stop it (SIGTERM, exit 0)."""
    log_dir.mkdir()
    procs = start_dispatchers(1, env, "--batch-size", "50", log_dir=log_dir)
    try:
        assert wait_started(log_dir, 1)
        assert wait_until(until, timeout)
    finally:
        for proc in procs:
            proc.terminate()
        assert wait_exit(procs, 20) == [0]

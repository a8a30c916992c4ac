"""The built-in simulator that test-mode notifications are sent to instead of a provider.

A notification created with a test key never reaches a provider, a device or an inbox: the
dispatcher hands it to `SIMULATOR` (in process, no network), which answers by recipient:

- email, by local part on any domain: `delivered`, `bounce` (a hard bounce receipt), `softbounce`
  (a soft bounce receipt), `complaint` (a complaint receipt), `transient` (a transient failure on
  every try: dead-lettered after the provider's attempts), `permanent` (a permanent failure: failed
  after one);
- SMS: `+15005550006` delivered, `+15005550001` a permanent failure, `+15005550009` an
  `undelivered` receipt, `+15005550004` a transient failure;
- push tokens and webhook URLs that contain `transient` or `permanent` fail so;
- anything else (and every in-app notification) is delivered.

An accepted email or SMS is followed by a receipt (`delivered`, `bounced`, `complained` or
`undelivered`), which the dispatcher hands, once the outcome is recorded, to `report()`: the receipt
service registers itself there (`RECEIPT_SINK`) and applies it exactly as it applies a vendor's
callback (events, suppressions within the test data, event webhooks).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from providers.kinds.base import DeliveryResult, OutboundMessage

logger = logging.getLogger("omnipost.simulator")

KIND = "simulator"
# The error_class of every simulated try's attempt: the breakers and /metrics' provider counters leave
# those out (routing.circuits, notifications.counters), since no provider was asked.
ERROR_CLASS = "simulator"

# email local part → (result, receipt, bounce type)
EMAIL = {
    "delivered": ("delivered", "delivered", None),
    "bounce": ("delivered", "bounced", "hard"),
    "softbounce": ("delivered", "bounced", "soft"),
    "complaint": ("delivered", "complained", None),
    "transient": ("transient", None, None),
    "permanent": ("permanent", None, None),
}
SMS = {
    "+15005550006": ("delivered", "delivered", None),
    "+15005550001": ("permanent", None, None),
    "+15005550009": ("delivered", "undelivered", None),
    "+15005550004": ("transient", None, None),
}
RECEIPT_CHANNELS = ("email", "sms")

_DELIVERED = DeliveryResult(delivered=True, http_status=200, error_class=ERROR_CLASS)
_TRANSIENT = DeliveryResult(delivered=False, error_code="simulated_transient", permanent=False, error_class=ERROR_CLASS,
                            message="the simulator's transient failure")  # fmt: skip
_PERMANENT = DeliveryResult(delivered=False, error_code="simulated_permanent", permanent=True, error_class=ERROR_CLASS,
                            message="the simulator's permanent failure")  # fmt: skip
_RESULTS = {"delivered": _DELIVERED, "transient": _TRANSIENT, "permanent": _PERMANENT}


def answer(channel: str, recipient: str) -> tuple[str, str | None, str | None]:
    """(result `delivered`|`transient`|`permanent`, the receipt that follows or None, its bounce type)."""
    if channel == "email":
        local = recipient.rpartition("@")[0].strip().lower()
        if local in EMAIL:
            return EMAIL[local]
        return "delivered", "delivered", None
    if channel == "sms":
        number = "".join(c for c in recipient if c.isdigit() or c == "+")
        return SMS.get(number, ("delivered", "delivered", None))
    if channel in ("push", "webhook"):
        lowered = recipient.lower()
        if "permanent" in lowered:
            return "permanent", None, None
        if "transient" in lowered:
            return "transient", None, None
    return "delivered", None, None


class Simulator:
    """Stands in for every provider of a test-mode notification (the dispatcher's ProviderCache
    entry interface: `send`, `start_send`, `aclose`)."""

    kind = KIND

    def start_send(self, message: OutboundMessage, on_result: Callable[[DeliveryResult], object]) -> None:
        return None  # awaited in a task: test sends are no hot path

    async def send(self, message: OutboundMessage) -> DeliveryResult:
        result, _, _ = answer(message.channel, message.recipient)
        return _RESULTS[result]

    async def aclose(self) -> None:
        return None


SIMULATOR = Simulator()


@dataclass(frozen=True, slots=True)
class SimulatedReceipt:
    """A receipt the simulator reports for an accepted test notification."""

    notification_id: str
    tenant_id: str
    provider_id: int
    receipt: str
    bounce_type: str | None = None
    occurred_at: datetime | None = None


def receipt_for(
    notification_id: str, tenant_id: str, provider_id: int, channel: str, recipient: str
) -> SimulatedReceipt | None:
    """The receipt that follows an accepted send of this test notification (None: none)."""
    if channel not in RECEIPT_CHANNELS:
        return None
    result, receipt, bounce_type = answer(channel, recipient)
    if result != "delivered" or receipt is None:
        return None
    return SimulatedReceipt(notification_id, tenant_id, provider_id, receipt, bounce_type, datetime.now(UTC))


# The receipt service registers here (receipts.apps): it applies what the simulator reports as it
# applies a vendor's callback. Called on the dispatcher's DB thread after the outcomes are recorded.
RECEIPT_SINK: list[Callable[[Sequence[SimulatedReceipt]], None]] = []


def report(receipts: Sequence[SimulatedReceipt]) -> None:
    if not receipts:
        return
    if not RECEIPT_SINK:
        logger.warning("no receipt service registered: %d simulated receipts dropped", len(receipts))
    for sink in RECEIPT_SINK:
        sink(receipts)

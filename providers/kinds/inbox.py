"""Inbox provider: the in_app channel's built-in kind. Its send is the feed item itself, which the
dispatcher's record statement writes with the notification's `delivered` (inbox.statements), so
accepting costs no I/O here and an item exists exactly when its notification is delivered."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from providers.kinds.base import (
    BaseProvider,
    Cancellable,
    DeliveryResult,
    OutboundMessage,
    as_dict,
    reject_unknown_keys,
)

ACCEPTED = DeliveryResult(delivered=True, message="written to the subscriber's feed")


class InboxProvider(BaseProvider):
    kind = "inbox"

    @classmethod
    def validate(cls, config: dict, secrets: dict, *, check_destination: bool = True) -> dict:
        reject_unknown_keys(as_dict(config, "config"), (), section="config")
        reject_unknown_keys(as_dict(secrets, "secrets"), (), section="secrets")
        return {}

    async def send(self, message: OutboundMessage) -> DeliveryResult:
        return ACCEPTED

    def start_send(self, message: OutboundMessage, on_result: Callable[[DeliveryResult], object]) -> Cancellable | None:
        return asyncio.get_running_loop().call_soon(on_result, ACCEPTED)

"""Console provider: logs the masked message on `omnipost.delivery`; the development default."""

from __future__ import annotations

import logging

from core.masking import mask_recipient, mask_text
from providers.kinds.base import BaseProvider, DeliveryResult, OutboundMessage, as_dict, reject_unknown_keys

logger = logging.getLogger("omnipost.delivery")
MAX_BODY_CHARS = 500


class ConsoleProvider(BaseProvider):
    kind = "console"

    @classmethod
    def validate(cls, config: dict, secrets: dict, *, check_destination: bool = True) -> dict:
        reject_unknown_keys(as_dict(config, "config"), (), section="config")
        reject_unknown_keys(as_dict(secrets, "secrets"), (), section="secrets")
        return {}

    async def send(self, message: OutboundMessage) -> DeliveryResult:
        body = message.body if len(message.body) <= MAX_BODY_CHARS else message.body[:MAX_BODY_CHARS] + "…"
        logger.info(
            "console delivery of %s (%s) to %s: subject=%r body=%r",
            message.notification_id,
            message.channel,
            mask_recipient(message.channel, message.recipient),
            mask_text(message.subject),
            mask_text(body),
            extra={
                "notification_id": message.notification_id,
                "tenant_id": message.tenant_id,
                "attempt": message.attempt,
                "provider": self.kind,
            },
        )
        return DeliveryResult(delivered=True, message="logged to console")

"""Delivery providers, one module per kind, found through REGISTRY."""

from __future__ import annotations

from typing import Any

from providers.kinds.apns import ApnsProvider
from providers.kinds.base import BaseProvider, DeliveryError, DeliveryResult, OutboundMessage
from providers.kinds.console import ConsoleProvider
from providers.kinds.fcm import FcmProvider
from providers.kinds.inbox import InboxProvider
from providers.kinds.sendgrid import SendgridProvider
from providers.kinds.ses import SesProvider
from providers.kinds.smtp import SmtpProvider
from providers.kinds.twilio import TwilioProvider
from providers.kinds.webhook import WebhookProvider
from providers.kinds.webpush import WebpushProvider

REGISTRY: dict[str, type[BaseProvider]] = {
    cls.kind: cls
    for cls in (
        WebhookProvider,
        SmtpProvider,
        TwilioProvider,
        SendgridProvider,
        SesProvider,
        ConsoleProvider,
        FcmProvider,
        ApnsProvider,
        WebpushProvider,
        InboxProvider,
    )
}


def provider_class(kind: str) -> type[BaseProvider]:
    try:
        return REGISTRY[kind]
    except KeyError:
        raise ValueError(f"unknown provider kind {kind!r}; known: {', '.join(sorted(REGISTRY))}") from None


def build_provider(kind: str, config: dict, secrets: dict, **options: Any) -> BaseProvider:
    """Instantiate the provider for `kind` (config as returned by validate()).

    `options` go to the provider's constructor where it accepts them, e.g. a shared `http_client`
    for webhook/twilio/sendgrid, `provider_id` for twilio (its StatusCallback) or `ssl_context` for
    smtp; others are ignored.
    """
    cls = provider_class(kind)
    return cls(config, secrets, **{k: v for k, v in options.items() if k in cls.options and v is not None})


__all__ = [
    "REGISTRY",
    "BaseProvider",
    "DeliveryError",
    "DeliveryResult",
    "OutboundMessage",
    "build_provider",
    "provider_class",
]

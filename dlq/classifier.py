"""The one classifier: a DeliveryResult becomes delivered / transient_error / permanent_error.

Rules, first match wins:
1. delivered -> delivered.
2. the provider's `permanent` hint, when not None, decides the failure class.
3. codes that are permanent whatever the status: destination_forbidden, redirect, invalid_recipient,
   malformed_content, invalid_config.
4. an HTTP status: 3xx permanent; 408, 425, 429 and 5xx transient; other 4xx permanent (401/403
   included); anything else (1xx, 2xx without delivery, >599) transient.
5. codes known to be transient: timeout, connect_error, dns_error, tls_error, protocol_error,
   connection_reset; `smtp_4xx` transient and `smtp_5xx` permanent.
6. anything else (an unknown exception, an unknown code) is transient, and logged at ERROR so an
   operator sees that the table needs a new row.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from providers.kinds.base import DeliveryResult

logger = logging.getLogger("omnipost.delivery")

DELIVERED = "delivered"
TRANSIENT_ERROR = "transient_error"
PERMANENT_ERROR = "permanent_error"
TRANSIENT = "transient"
PERMANENT = "permanent"

PERMANENT_CODES = frozenset(
    {
        "destination_forbidden",
        "redirect",
        "invalid_recipient",
        "malformed_content",
        "invalid_config",
        "smtp_unsupported",
    }
)
TRANSIENT_CODES = frozenset(
    {"timeout", "connect_error", "dns_error", "tls_error", "protocol_error", "connection_reset"}
)
TRANSIENT_STATUSES = frozenset({408, 425, 429})
_SMTP_CODE = re.compile(r"smtp_([245])\d\d")


@dataclass(frozen=True, slots=True)
class Classification:
    outcome: str  # delivered | transient_error | permanent_error
    failure_class: str  # "" | transient | permanent
    error_code: str
    retry_after: float | None = None

    @property
    def delivered(self) -> bool:
        return self.outcome == DELIVERED

    @property
    def permanent(self) -> bool:
        return self.failure_class == PERMANENT


def _transient(result: DeliveryResult, code: str) -> Classification:
    return Classification(TRANSIENT_ERROR, TRANSIENT, code, result.retry_after)


def _permanent(code: str) -> Classification:
    return Classification(PERMANENT_ERROR, PERMANENT, code, None)


_DELIVERED = Classification(DELIVERED, "", "", None)  # frozen: one instance serves every delivery


def _error_code(result: DeliveryResult) -> str:
    if result.error_code:
        return result.error_code
    if result.http_status is not None:
        return f"http_{result.http_status}"
    return result.error_class or "unknown_error"


def classify(result: DeliveryResult) -> Classification:
    """Pure apart from logging an unknown failure at ERROR."""
    if result.delivered:
        return _DELIVERED
    code = _error_code(result)
    if result.permanent is not None:
        return _permanent(code) if result.permanent else _transient(result, code)
    if code in PERMANENT_CODES:
        return _permanent(code)
    status = result.http_status
    if status is not None:
        if 300 <= status < 400:
            return _permanent(code)
        if status in TRANSIENT_STATUSES or 500 <= status < 600:
            return _transient(result, code)
        if 400 <= status < 500:
            return _permanent(code)
        logger.error("unexpected HTTP status %s (%s); treating it as transient", status, code)
        return _transient(result, code)
    if code in TRANSIENT_CODES:
        return _transient(result, code)
    smtp = _SMTP_CODE.fullmatch(code)
    if smtp:
        return _permanent(code) if smtp.group(1) == "5" else _transient(result, code)
    logger.error(
        "unclassified delivery failure code=%s error_class=%s: %s; treating it as transient",
        code,
        result.error_class or "-",
        result.message,
    )
    return _transient(result, code)

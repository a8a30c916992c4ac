"""Log masking and JSON lines (OMNIPOST_LOG_FORMAT=json)."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

from core.masking import mask_text

# Attributes a delivery log line may carry via `extra=`; copied into JSON output when present.
CONTEXT_FIELDS = (
    "notification_id",
    "tenant_id",
    "attempt",
    "outcome",
    "provider",
    "error_code",
    "duration_ms",
    "worker",
    "queue",
    "count",
)


class MaskingFilter(logging.Filter):
    """Rewrites every record's message with recipients, API keys and secrets masked."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record must still be logged, masked
            message = str(record.msg)
        record.msg = mask_text(message)
        record.args = None
        if record.exc_info and not record.exc_text:
            record.exc_text = mask_text(logging.Formatter().formatException(record.exc_info))
            record.exc_info = None
        elif record.exc_text:
            record.exc_text = mask_text(record.exc_text)
        if record.stack_info:
            record.stack_info = mask_text(record.stack_info)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line. Masks on its own too, so a handler without the filter leaks nothing."""

    def format(self, record: logging.LogRecord) -> str:
        payload = {
            "ts": datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": mask_text(record.getMessage()),
        }
        for name in CONTEXT_FIELDS:
            if hasattr(record, name):
                value = getattr(record, name)
                payload[name] = mask_text(value) if isinstance(value, str) else value
        if record.exc_text:
            payload["exc"] = mask_text(record.exc_text)
        elif record.exc_info:
            payload["exc"] = mask_text(self.formatException(record.exc_info))
        return json.dumps(payload, default=str)

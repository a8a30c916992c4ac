"""Masking of recipients and secrets for every output: API, admin, logs, audit, errors."""

from __future__ import annotations

import re
from typing import Any

EMAIL_RE = re.compile(
    r"(?P<local>[A-Za-z0-9.!#$%&'*+/=?^_`{|}~-]+)@(?P<domain>[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?)"
)
PHONE_RE = re.compile(r"\+\d{8,15}\b")
API_KEY_RE = re.compile(r"\bop_(test_)?([A-Za-z0-9]{8})_[A-Za-z0-9]{16,}")
WHSEC_RE = re.compile(r"\bwhsec_[A-Za-z0-9+/=]{8,}")

SECRET_KEY_NAMES = ("secret", "password", "token", "api_key", "apikey", "authorization", "signing")


def mask_email(value: str) -> str:
    local, _, domain = value.partition("@")
    return f"{local[:1]}***@{domain}"


def mask_phone(value: str) -> str:
    digits = value.lstrip("+")
    prefix = "+" if value.startswith("+") else ""
    keep_head = 1 if len(digits) > 6 else 0
    return prefix + digits[:keep_head] + "*" * max(len(digits) - keep_head - 4, 2) + digits[-4:]


def mask_token(value: str) -> str:
    head, sep, _ = value.partition("_")
    tail = value[-4:] if len(value) > 8 else ""
    return f"{head}_****{tail}" if sep and len(head) <= 8 else f"****{tail}"


def mask_recipient(channel: str, value: str) -> str:
    """The masked form shown wherever a recipient would appear (`j***@example.com`, `+1******4567`)."""
    if channel == "email" or ("@" in value and channel not in ("sms", "push", "webhook")):
        return mask_email(value)
    if channel == "sms":
        return mask_phone(value)
    return mask_token(value)


def mask_secret(value: Any) -> str:
    text = str(value or "")
    return "****" + text[-4:] if len(text) >= 12 else "****"


def mask_text(text: str) -> str:
    """Mask anything that looks like an email, phone number, API key or signing secret in free text."""
    text = API_KEY_RE.sub(lambda m: f"op_{m.group(1) or ''}{m.group(2)}_****", text)
    text = WHSEC_RE.sub("whsec_****", text)
    text = EMAIL_RE.sub(lambda m: mask_email(m.group(0)), text)
    return PHONE_RE.sub(lambda m: mask_phone(m.group(0)), text)


def mask_mapping(data: Any) -> Any:
    """Deep copy of JSON-like data with secret-named keys masked and free text scrubbed."""
    if isinstance(data, dict):
        return {
            k: (mask_secret(v) if any(s in str(k).lower() for s in SECRET_KEY_NAMES) else mask_mapping(v))
            for k, v in data.items()
        }
    if isinstance(data, list):
        return [mask_mapping(v) for v in data]
    if isinstance(data, str):
        return mask_text(data)
    return data

"""Error texts scrubbed at the source: the recipient and the provider's secrets, in every form a
provider might echo them, replaced by their masks before the text is stored or logged.

Masking by pattern (`core.masking.mask_text`) finds what looks like an email or a phone number; it
cannot know that `cust_8Kq2…` is a webhook recipient or that a base64 string is a signing key. The
dispatcher knows both: the recipient it sent to and the secrets of the provider it sent through.
So `scrub()` looks for those exact values, as sent and as a provider may have encoded them in its
answer (URL-encoded with `quote`/`quote_plus`, JSON- or HTML-escaped), in any letter case (emails
are case-insensitive; hex escapes come in both cases), and also for a value cut off at the end of
the text (providers and the dispatcher bound error texts, which can cut an echo in half).

A pure function with a table test (tests/providers/test_scrub.py).
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote, quote_plus

from core.masking import mask_recipient, mask_secret

MIN_SECRET = 6  # shorter values are no secret worth the name, and would mask ordinary words
MIN_RECIPIENT = 3
MIN_CUT = 6  # the shortest cut-off echo at the end of a text that is masked too
_WHSEC = "whsec_"


def secret_values(secrets: Mapping[str, Any] | None) -> tuple[str, ...]:
    """Every string in a provider's `secrets` (nested values too), and the base64 key of a
    `whsec_…` signing secret, which is what a receiver's library decodes and may echo."""
    out: list[str] = []

    def walk(value: Any) -> None:  # noqa: ANN401
        if isinstance(value, Mapping):
            for v in value.values():
                walk(v)
        elif isinstance(value, list | tuple):
            for v in value:
                walk(v)
        elif isinstance(value, str | int) and not isinstance(value, bool):
            text = str(value)
            out.append(text)
            if text.startswith(_WHSEC):
                out.append(text[len(_WHSEC) :])

    walk(secrets or {})
    return tuple(dict.fromkeys(v for v in out if len(v) >= MIN_SECRET))


def forms(value: str) -> set[str]:
    """The ways a value may come back in a provider's answer."""
    as_json = json.dumps(value)[1:-1]
    found = {
        value,
        quote(value),
        quote(value, safe=""),
        quote_plus(value),
        as_json,
        json.dumps(value, ensure_ascii=False)[1:-1],
        as_json.replace("/", "\\/"),  # JSON encoders that escape slashes (PHP's, by default)
        html.escape(value),
        html.escape(value, quote=False),
    }
    return {f for f in found if f}


def scrub(text: str, recipient: str | None, secrets: Iterable[str] = (), *, channel: str = "") -> str:
    """`text` with every form of `recipient` and of each secret replaced by its mask."""
    if not text:
        return text
    masks: dict[str, str] = {}
    for secret in secrets:
        if secret and len(secret) >= MIN_SECRET:
            masked = mask_secret(secret)
            for form in forms(secret):
                masks.setdefault(form.lower(), masked)
    if recipient and len(recipient) >= MIN_RECIPIENT:
        masked = mask_recipient(channel, recipient)
        for form in forms(recipient):
            masks[form.lower()] = masked  # the recipient's mask wins where a secret equals it
    if not masks:
        return text
    needles = sorted(masks, key=len, reverse=True)  # the longest first: whsec_… before its key
    pattern = re.compile("|".join(re.escape(n) for n in needles), re.IGNORECASE)
    text = pattern.sub(lambda m: masks[m.group(0).lower()], text)
    return _cut_echo(text, needles, masks)


def _cut_echo(text: str, needles: list[str], masks: dict[str, str]) -> str:
    """Mask the start of a value the text ends with (an echo cut off by a length bound, which may
    have added an ellipsis)."""
    body = text.rstrip("…. ")
    tail = text[len(body) :]
    lowered = body.lower()
    for needle in needles:
        for length in range(min(len(needle) - 1, len(body)), MIN_CUT - 1, -1):
            if lowered.endswith(needle[:length]):
                return body[:-length] + masks[needle] + tail
    return text

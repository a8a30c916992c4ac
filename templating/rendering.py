"""What a template renders for one notification (and for a preview, the same code): the variant
its locales choose, each part rendered by the sandboxed engine on its own budget, the HTML body
with HTML auto-escaping and the subject and text body without.

The variant used is the first that exists of: the notification's locale, the subscriber's, the
notification's base language, the subscriber's base language (`fr-CA` → `fr`); otherwise the
template's own fields (`locale` None)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from core.validation import MAX_SUBJECT_CHARS, base_language
from templating import renderer

PARTS = ("subject", "body", "html_body")


class Renderable(Protocol):
    subject: str
    body: str
    html_body: str
    variants: dict[str, dict[str, str]]
    version: int


@dataclass(slots=True)
class Rendered:
    subject: str
    body: str
    html_body: str
    locale: str | None  # the variant's tag; None: the template's own fields
    version: int


def candidates(*tags: str | None) -> list[str]:
    """The tags to look for, in order: each given tag, then each one's base language."""
    given = [tag for tag in tags if tag]
    order: list[str] = []
    for tag in [*given, *(base_language(tag) for tag in given)]:
        if tag not in order:
            order.append(tag)
    return order


def choose(template: Renderable, tags: Iterable[str | None]) -> tuple[str | None, dict[str, str]]:
    """(the variant's tag, its fields); (None, the template's own fields) when no tag has one."""
    variants = template.variants or {}
    if variants:
        for tag in candidates(*tags):
            variant = variants.get(tag)
            if variant is not None:
                return tag, {part: variant.get(part) or "" for part in PARTS}
    return None, {part: getattr(template, part) or "" for part in PARTS}


def render(
    template: Renderable, context: dict[str, Any], *, locales: Iterable[str | None] = (), html: bool = True
) -> tuple[Rendered, dict[str, str]]:
    """The rendered parts and, per part that failed, the renderer's message. `html=False` leaves the
    HTML body out (a channel other than email)."""
    locale, fields = choose(template, locales)
    out = {part: "" for part in PARTS}
    errors: dict[str, str] = {}
    for part in PARTS:
        source = fields[part]
        if not source or (part == "html_body" and not html):
            continue
        try:
            out[part] = renderer.render(source, context, autoescape=part == "html_body")
        except renderer.TemplateError as exc:
            errors[part] = str(exc)
    if len(out["subject"]) > MAX_SUBJECT_CHARS:  # RFC 5322's line limit holds for what was rendered, too
        errors["subject"] = (
            f"the rendered subject is {len(out['subject'])} characters long; at most {MAX_SUBJECT_CHARS} are "
            "allowed: shorten the template's subject or the context it prints"
        )
    return Rendered(out["subject"], out["body"], out["html_body"], locale, template.version), errors

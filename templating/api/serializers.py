"""The template a tenant configures: key, channel, subject, body, an email's `html_body` and
per-locale `variants`, checked by the sandboxed engine on the way in (a syntax error is a 400 naming
its line). `key` and `channel` are fixed once created (create a new template to change them);
`version` is read-only: every change makes the next one."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from core.api.schema import StrictCharField, StrictModelSerializer, StrictRegexField, StrictSerializer, refuse_changes
from core.validation import MAX_BODY_CHARS, MAX_SUBJECT_CHARS, NAME, check_locale, check_object
from templating import renderer
from templating.models import Template, TemplateVersion
from templating.rendering import PARTS

MAX_VARIANTS = 100
MAX_CONTEXT_BYTES = 64 * 1024  # a preview's context: as large as a notification's


def _check(text: Any, limit: int) -> str:
    if not isinstance(text, str):
        raise ValueError("must be a string")
    if len(text) > limit:
        raise ValueError(f"must be at most {limit} characters")
    try:
        renderer.check(text)
    except renderer.TemplateError as exc:
        raise ValueError(f"invalid template: {exc}") from None
    return text


_LIMITS = {"subject": MAX_SUBJECT_CHARS, "body": MAX_BODY_CHARS, "html_body": MAX_BODY_CHARS}


def clean_variants(value: Any, channel: str | None) -> dict[str, dict[str, str]]:
    """`{"<BCP 47 tag>": {"subject", "body", "html_body"}}` with tags in their conventional case; raises
    ValidationError naming the tag and field."""
    if not isinstance(value, dict):
        raise serializers.ValidationError('must be an object {"<BCP 47 tag>": {"subject", "body", "html_body"}}')
    if len(value) > MAX_VARIANTS:
        raise serializers.ValidationError(f"at most {MAX_VARIANTS} variants")
    clean: dict[str, dict[str, str]] = {}
    problems: dict[str, Any] = {}
    for tag, variant in value.items():
        try:
            canonical = check_locale(tag)
        except ValueError as exc:
            problems[str(tag)] = [str(exc)]
            continue
        if canonical in clean:
            problems[str(tag)] = [f"the same tag as {canonical!r} (tags are case-insensitive)"]
            continue
        if not isinstance(variant, dict):
            problems[str(tag)] = ["must be an object with `body` and optionally `subject` and `html_body`"]
            continue
        fields: dict[str, list[str]] = {name: ["unknown field"] for name in variant if name not in PARTS}
        if variant.get("body") is None:
            fields["body"] = ["required"]
        if variant.get("html_body") and channel is not None and channel != "email":
            fields["html_body"] = ["only email templates have an HTML body"]
        out: dict[str, str] = {}
        for name in PARTS:
            if variant.get(name) is None or name in fields:
                continue
            try:
                out[name] = _check(variant[name], _LIMITS[name])
            except ValueError as exc:
                fields[name] = [str(exc)]
        if fields:
            problems[str(tag)] = fields
        else:
            clean[canonical] = {name: out.get(name, "") for name in PARTS}
    if problems:
        raise serializers.ValidationError(problems)
    return clean


class TemplateSerializer(StrictModelSerializer):
    key = StrictRegexField(NAME.pattern, max_length=100)
    subject = StrictCharField(required=False, allow_blank=True, max_length=MAX_SUBJECT_CHARS)
    body = StrictCharField(max_length=MAX_BODY_CHARS)
    html_body = StrictCharField(
        required=False, allow_blank=True, max_length=MAX_BODY_CHARS,
        help_text="Email only: rendered with HTML auto-escaping and sent beside the text body (multipart/alternative).",
    )  # fmt: skip
    variants = serializers.JSONField(
        required=False,
        help_text='{"<BCP 47 tag>": {"subject", "body", "html_body"}}: what a notification in that locale renders '
        "(the notification's locale, the subscriber's, then their base languages; else the template's own fields).",
    )  # fmt: skip
    version = serializers.IntegerField(read_only=True, help_text="The current version; every change makes the next.")

    class Meta:
        model = Template
        fields = ["key", "channel", "subject", "body", "html_body", "variants", "version", "created_at", "updated_at"]
        read_only_fields = ["version", "created_at", "updated_at"]

    def _checked(self, text: str) -> str:
        try:
            renderer.check(text)
        except renderer.TemplateError as exc:
            raise serializers.ValidationError(f"invalid template: {exc}") from None
        return text

    validate_subject = _checked
    validate_body = _checked
    validate_html_body = _checked

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        refuse_changes(self.instance, attrs, ("key", "channel"))
        channel = attrs.get("channel") or (self.instance.channel if self.instance is not None else None)
        if attrs.get("html_body") and channel != "email":
            raise serializers.ValidationError({"html_body": ["only email templates have an HTML body"]})
        if "variants" in attrs:
            try:
                attrs["variants"] = clean_variants(attrs["variants"] or {}, channel)
            except serializers.ValidationError as exc:
                raise serializers.ValidationError({"variants": exc.detail}) from None
        return attrs


class TemplateVersionSerializer(serializers.ModelSerializer):
    class Meta:
        model = TemplateVersion
        fields = ["version", "subject", "body", "html_body", "variants", "created_at"]
        read_only_fields = fields


class PreviewSerializer(StrictSerializer):
    context = serializers.DictField(required=False, default=dict, help_text="The template context, as a send's.")
    locale = StrictCharField(required=False, allow_null=True, help_text="A BCP 47 tag: which variant to render.")

    def validate_context(self, value: dict[str, Any]) -> dict[str, Any]:
        try:
            return check_object(value, MAX_CONTEXT_BYTES)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from None

    def validate_locale(self, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            return check_locale(value)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from None


class PreviewResultSerializer(serializers.Serializer):
    subject = serializers.CharField(allow_blank=True)
    body = serializers.CharField(allow_blank=True)
    html_body = serializers.CharField(allow_blank=True)
    locale = serializers.CharField(allow_null=True, help_text="The variant rendered; null: the template's own fields.")
    version = serializers.IntegerField()

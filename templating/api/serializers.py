"""The template a tenant configures: key, channel, subject and body, checked by the sandboxed
engine on the way in. `key` and `channel` are fixed once created (create a new template to change them)."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from core.api.schema import StrictCharField, StrictModelSerializer, StrictRegexField, refuse_changes
from core.validation import MAX_BODY_CHARS, MAX_SUBJECT_CHARS, NAME
from templating import renderer
from templating.models import Template


class TemplateSerializer(StrictModelSerializer):
    key = StrictRegexField(NAME.pattern, max_length=100)
    subject = StrictCharField(required=False, allow_blank=True, max_length=MAX_SUBJECT_CHARS)
    body = StrictCharField(max_length=MAX_BODY_CHARS)

    class Meta:
        model = Template
        fields = ["key", "channel", "subject", "body", "created_at", "updated_at"]
        read_only_fields = ["created_at", "updated_at"]

    def _checked(self, text: str) -> str:
        try:
            renderer.check(text)
        except renderer.TemplateError as exc:
            raise serializers.ValidationError(f"invalid template: {exc}") from None
        return text

    validate_subject = _checked
    validate_body = _checked

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        refuse_changes(self.instance, attrs, ("key", "channel"))
        return attrs

"""Templates in the console: staff see only their tenants' (TenantScopedAdmin); every save is
checked by the sandboxed engine and audited (templating.services)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest

from core.admin_scoping import TenantScopedAdmin
from templating import renderer, services
from templating.models import Template


class TemplateForm(forms.ModelForm):
    class Meta:
        model = Template
        fields = ["tenant", "key", "channel", "subject", "body"]

    def _checked(self, name: str) -> str:
        text = self.cleaned_data.get(name) or ""
        try:
            renderer.check(text)
        except renderer.TemplateError as exc:
            raise forms.ValidationError(f"Invalid template: {exc}") from None
        return text

    def clean_subject(self) -> str:
        return self._checked("subject")

    def clean_body(self) -> str:
        return self._checked("body")


@admin.register(Template)
class TemplateAdmin(TenantScopedAdmin):
    form = TemplateForm
    list_display = ["key", "tenant", "channel", "updated_at"]
    list_filter = ["channel"]
    search_fields = ["key"]

    def save_model(self, request: HttpRequest, obj: Template, form: Any, change: bool) -> None:
        fields = list(form.changed_data) if change else None
        services.save_template(obj, actor=f"user:{request.user.get_username()}", fields=fields)

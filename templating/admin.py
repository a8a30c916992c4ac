"""Templates in the console: staff see only their tenants' (TenantScopedAdmin); every save is
checked by the sandboxed engine, audited and versioned (templating.services). The change page lists
the template's versions (read-only) and links to its preview, which renders the current version on
a context through templating.rendering, the code a send uses (same sandbox, same budget)."""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.admin.utils import unquote
from django.http import Http404, HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html
from rest_framework.exceptions import ValidationError

from core.admin_scoping import TenantScopedAdmin
from core.validation import check_locale
from templating import renderer, rendering, services
from templating.api.serializers import MAX_CONTEXT_BYTES, clean_variants
from templating.models import Template, TemplateVersion


class TemplateForm(forms.ModelForm):
    class Meta:
        model = Template
        fields = ["tenant", "key", "channel", "subject", "body", "html_body", "variants"]

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

    def clean_html_body(self) -> str:
        return self._checked("html_body")

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        channel = data.get("channel") or (self.instance.channel if self.instance.pk else None)
        if data.get("html_body") and channel != "email":
            self.add_error("html_body", "Only email templates have an HTML body.")
        if "variants" in data:
            try:
                data["variants"] = clean_variants(data.get("variants") or {}, channel)
            except ValidationError as exc:
                self.add_error("variants", json.dumps(exc.detail))
        return data


class TemplateVersionInline(admin.TabularInline):
    model = TemplateVersion
    fields = ["version", "subject", "body", "html_body", "variants", "actor", "created_at"]
    readonly_fields = fields
    ordering = ["-version"]
    extra = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class PreviewForm(forms.Form):
    context = forms.CharField(widget=forms.Textarea(attrs={"rows": 8, "cols": 80}), required=False, initial="{}",
                              help_text="The template context, as JSON (as a notification's `context`).")  # fmt: skip
    locale = forms.CharField(required=False, max_length=35, help_text="A BCP 47 tag: which variant to render.")

    def clean_context(self) -> dict[str, Any]:
        text = self.cleaned_data.get("context") or "{}"
        if len(text.encode()) > MAX_CONTEXT_BYTES:
            raise forms.ValidationError(f"At most {MAX_CONTEXT_BYTES} bytes.")
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise forms.ValidationError(f"Not JSON: {exc}") from None
        if not isinstance(value, dict):
            raise forms.ValidationError("Must be a JSON object.")
        return value

    def clean_locale(self) -> str | None:
        value = self.cleaned_data.get("locale") or ""
        if not value:
            return None
        try:
            return check_locale(value)
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None


@admin.register(Template)
class TemplateAdmin(TenantScopedAdmin):
    form = TemplateForm
    list_display = ["key", "tenant", "channel", "version", "updated_at"]
    list_filter = ["channel"]
    search_fields = ["key"]
    readonly_fields = ["version", "preview_link"]
    inlines = [TemplateVersionInline]

    def save_model(self, request: HttpRequest, obj: Template, form: Any, change: bool) -> None:
        fields = list(form.changed_data) if change else None
        services.save_template(obj, actor=f"user:{request.user.get_username()}", fields=fields)

    def save_related(self, request: HttpRequest, form: Any, formsets: Any, change: bool) -> None:
        form.save_m2m()  # the versions inline is read-only: nothing of it is saved

    @admin.display(description="Preview")
    def preview_link(self, obj: Template) -> str:
        if obj.pk is None:
            return "-"
        url = reverse("admin:templating_template_preview", args=[obj.pk])
        return format_html('<a href="{}" id="template-preview-link">Preview this template</a>', url)

    def get_urls(self) -> list:
        view = self.admin_site.admin_view
        return [
            path("<path:object_id>/preview/", view(self.preview_view), name="templating_template_preview"),
            *super().get_urls(),
        ]

    def preview_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        template = self.get_object(request, unquote(object_id))  # scoped to the user's tenants
        if template is None or not self.has_view_permission(request, template):
            raise Http404("No such template.")
        form = PreviewForm(request.POST or None)
        result = problems = None
        if request.method == "POST" and form.is_valid():
            result, problems = rendering.render(
                template, form.cleaned_data["context"], locales=(form.cleaned_data["locale"],),
                html=template.channel == "email",
            )  # fmt: skip
        context = {
            **self.admin_site.each_context(request), "opts": self.opts, "original": template,
            "title": f"Preview {template.key}", "form": form, "result": None if problems else result,
            "problems": problems,
        }  # fmt: skip
        return TemplateResponse(request, "admin/templating/template/preview.html", context)

"""The template sandbox: what renders, what is refused, and the same through the API."""

from __future__ import annotations

import pytest

from notifications.models import Notification
from templating import renderer
from templating.models import Template
from tests.support.setups import EMAIL

render = renderer.render


def test_variables_filters_and_tags_render():
    text = "{% for i in items %}{{ i|upper }}{% if not forloop.last %}, {% endif %}{% endfor %} – {{ n|add:2 }}"
    assert render(text, {"items": ["a", "b"], "n": 40}) == "A, B – 42"
    assert render("{{ user.name|default:'friend' }}", {"user": {}}) == "friend"
    assert render("{{ price|floatformat:2 }}", {"price": 3.14159}) == "3.14"


def test_missing_variables_render_empty():
    assert render("Hi {{ name }}{{ a.b.c }}!", {}) == "Hi !"


def test_no_autoescape_by_default_but_available():
    assert render("{{ x }}", {"x": "<b>"}) == "<b>"
    assert render("{{ x }}", {"x": "<b>"}, autoescape=True) == "&lt;b&gt;"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("{{ x.__class__ }}", "underscores"),
        ("{{ x.__class__.__mro__ }}", "underscores"),
        ("{% debug %}", "{% debug %} is not available"),
        ('{% include "/etc/passwd" %}', "{% include %} is not available"),
        ('{% extends "base.html" %}', "{% extends %} is not available"),
        ("{% load log %}", "{% load %} is not available"),
        ("{% load static %}{% static 'x' %}", "{% load %} is not available"),
        ('{% url "admin:index" %}', "{% url %} is not available"),
        ("{% csrf_token %}", "{% csrf_token %} is not available"),
        ("{% lorem 99999 w %}", "{% lorem %} is not available"),
        ('{{ x|stringformat:"%099999999d" }}', "stringformat"),
        ("{% if %}", "line 1"),
        ("{% for x in %}{% endfor %}", "line 1"),
    ],
)
def test_unsafe_or_broken_templates_are_refused(text, reason):
    with pytest.raises(renderer.TemplateError, match=None) as caught:
        renderer.check(text)
    assert reason in str(caught.value)


@pytest.mark.parametrize(
    "text",
    ["{{ settings.SECRET_KEY }}", "{{ request.META }}", "{{ view }}", "{{ csrf_token }}", "{{ perms }}",
     "{{ user.password }}", "{{ sys.modules }}"],
)  # fmt: skip
def test_there_is_nothing_but_the_context_to_reach(text):
    assert render(text, {"x": 1}) == ""


def test_context_methods_cannot_change_the_callers_data():
    context = {"d": {"a": 1}, "items": [1, 2, 3]}
    # Methods of context values are not called at all (issue 19: `s.split` escaped every budget).
    assert render("{{ d.clear }}{{ items.pop }}{{ items.reverse }}{{ items.copy }}", context) == ""
    assert context == {"d": {"a": 1}, "items": [1, 2, 3]}
    assert render("{% for k, v in d.items %}{{ k }}={{ v }}{% endfor %} {{ d.keys|length }}", context) == "a=1 1"


@pytest.mark.parametrize(
    ("text", "context"),
    [
        ('{{ x|center:"100000000" }}', {"x": "a"}),
        ('{{ x|ljust:"100000000" }}', {"x": "a"}),
        ('{{ x|floatformat:"100000" }}', {"x": 1.5}),
        ("{% for a in l %}{% for b in l %}{% for c in l %}.{% endfor %}{% endfor %}{% endfor %}",
         {"l": list(range(100))}),
        ("{% with b=a|add:a %}{% with c=b|add:b %}{% with d=c|add:c %}{{ d }}{% endwith %}{% endwith %}"
         "{% endwith %}", {"a": "x" * 100_000}),
        ("{{ n|divisibleby:0 }}", {"n": 3}),
    ],
)  # fmt: skip
def test_resource_bombs_and_runtime_errors_are_template_errors(text, context):
    with pytest.raises(renderer.TemplateError):
        render(text, context)


# --- through the API ------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    "body", ["{{ x.__class__ }}", "{% debug %}", '{% include "/etc/passwd" %}', "{% load log %}"]
)
def test_template_api_refuses_unsafe_templates_with_400(api_a, tenant_a, body):
    response = api_a.post("/api/v1/templates", {"key": "t", "channel": "email", "body": body}, format="json")
    assert response.status_code == 400, response.content
    assert "invalid template" in response.json()["error"]["details"]["body"][0]
    assert not Template.objects.exists()


@pytest.mark.django_db
def test_settings_are_unreachable_through_a_notification(api_a, setup_a, settings):
    Template.objects.create(tenant=setup_a.tenant, key="leak", channel="email", subject="{{ settings.SECRET_KEY }}",
                            body="[{{ settings.SECRET_KEY }}{{ SECRET_KEY }}{{ missing }}]")  # fmt: skip
    response = api_a.post("/api/v1/notifications", {"channel": "email", "recipient": EMAIL, "template": "leak"},
                          format="json")  # fmt: skip
    assert response.status_code == 201, response.content
    assert response.json()["body"] == "[]" and response.json()["subject"] == ""
    assert settings.SECRET_KEY not in Notification.objects.get().body

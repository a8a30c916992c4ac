"""A sandboxed Django template engine for tenant-written subjects and bodies.

Templates are written by API clients, so the engine is built from an allow-list:
- no loaders, and no `include` / `extends` / `block`: nothing reads a file;
- no `load`, `debug` (dumps the context and sys.modules), `url`, `csrf_token`, `lorem`, `querystring`;
- the context is a deep copy of the request's JSON only (no settings, no request, no processors);
  Django already refuses variables and attributes that start with an underscore;
- filters that can allocate without bound (`center`, `ljust`, `rjust`, `stringformat`,
  `floatformat`) take bounded arguments, every filter's result is capped in size, `for` loops
  share an iteration budget and the rendered text is capped, so a template cannot exhaust memory or CPU.
Missing variables render as the empty string.
"""

from __future__ import annotations

import copy
import functools
import re
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from django.template import Context, Engine, Library, Template, TemplateSyntaxError, defaultfilters, defaulttags
from django.template.defaulttags import ForNode

MAX_OUTPUT_CHARS = 256 * 1024  # per rendered template (and per filter result)
MAX_LOOP_ITERATIONS = 10_000  # across all `for` loops of one render
MAX_WIDTH = 1_000  # center / ljust / rjust
MAX_PRECISION = 20  # floatformat

SAFE_TAGS = (
    "autoescape", "comment", "cycle", "filter", "firstof", "for", "if", "ifchanged", "now", "regroup",
    "resetcycle", "spaceless", "templatetag", "verbatim", "widthratio", "with",
)  # fmt: skip
EXCLUDED_FILTERS = ("stringformat",)  # "%0999999999d" allocates a gigabyte before any check can run

_BUDGET_KEY = "omnipost_loop_budget"


class TemplateError(ValueError):
    """The template cannot be compiled or rendered; the message says what to fix."""


class _LimitExceeded(Exception):
    pass


register = Library()


def _capped(func: Callable) -> Callable:
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = func(*args, **kwargs)
        if isinstance(result, str | list | tuple) and len(result) > MAX_OUTPUT_CHARS:
            raise _LimitExceeded(f"a filter produced more than {MAX_OUTPUT_CHARS} characters")
        return result

    return wrapper


def _register_filter(name: str, func: Callable) -> None:
    flags = {flag: getattr(func, flag) for flag in ("is_safe", "needs_autoescape", "expects_localtime")
             if hasattr(func, flag)}  # fmt: skip
    register.filter(name, _capped(func), **flags)


def _bounded_int(arg: Any, limit: int) -> int:
    try:
        value = int(arg)
    except (TypeError, ValueError):
        raise _LimitExceeded(f"the argument {arg!r} is not an integer") from None
    if abs(value) > limit:
        raise _LimitExceeded(f"the argument {value} is larger than {limit}")
    return value


def _width_filter(original: Callable) -> Callable:
    def bounded(value: Any, arg: Any) -> Any:
        return original(value, _bounded_int(arg, MAX_WIDTH))

    bounded.is_safe = getattr(original, "is_safe", False)
    functools.update_wrapper(bounded, original, assigned=("__name__", "__doc__"))
    return bounded


def _floatformat(text: Any, arg: Any = -1) -> Any:
    digits = re.sub(r"[^0-9-]", "", str(arg))  # floatformat accepts suffixes such as "2g" or "-3u"
    if digits not in ("", "-"):
        _bounded_int(digits, MAX_PRECISION)
    return defaultfilters.floatformat(text, arg)


_floatformat.is_safe = True

for _name, _func in defaultfilters.register.filters.items():
    if _name in EXCLUDED_FILTERS:
        continue
    if _name in ("center", "ljust", "rjust"):
        _func = _width_filter(_func)
    elif _name == "floatformat":
        _func = _floatformat
    _register_filter(_name, _func)


class _BudgetedForNode(ForNode):
    """`for` that charges its iterations to a per-render budget before looping."""

    def render(self, context: Context) -> str:
        values = self.sequence.resolve(context, ignore_failures=True)
        size = len(values) if hasattr(values, "__len__") else 0
        budget = context.render_context.get(_BUDGET_KEY, MAX_LOOP_ITERATIONS) - size
        if budget < 0:
            raise _LimitExceeded(f"the template loops more than {MAX_LOOP_ITERATIONS} times in total")
        context.render_context[_BUDGET_KEY] = budget
        return super().render(context)


def _do_for(parser: Any, token: Any) -> _BudgetedForNode:
    node = defaulttags.do_for(parser, token)
    node.__class__ = _BudgetedForNode
    return node


for _name in SAFE_TAGS:
    register.tag(_name, _do_for if _name == "for" else defaulttags.register.tags[_name])

class _SandboxEngine(Engine):
    default_builtins: list[str] = []  # Django adds these to any `builtins`; the allow-list replaces them


ENGINE = _SandboxEngine(
    dirs=[],
    app_dirs=False,
    loaders=[],
    libraries={},
    builtins=[__name__],
    context_processors=[],
    string_if_invalid="",
    autoescape=False,
    debug=True,  # only so that errors carry their line number (exc.template_debug)
)

_INVALID_TAG = re.compile(r"Invalid block tag on line (\d+): '([^']*)'")


def _explain(exc: Exception) -> str:
    message = str(exc)
    match = _INVALID_TAG.search(message)
    if match:
        line, tag = match.groups()
        return (f"line {line}: the tag {{% {tag} %}} is not available in templates "
                f"(allowed: {', '.join(SAFE_TAGS)})")  # fmt: skip
    if "Invalid filter" in message:
        message = f"{message.rstrip('.')}; `stringformat` and custom filters are not available"
    debug = getattr(exc, "template_debug", None)
    if debug and f"line {debug['line']}" not in message:
        return f"line {debug['line']} ({debug['during'].strip()[:80]}): {message}"
    return message


@lru_cache(maxsize=512)
def _compile(template_text: str) -> Template:
    try:
        return Template(template_text, engine=ENGINE)
    except TemplateSyntaxError as exc:
        raise TemplateError(_explain(exc)) from None
    except (ValueError, TypeError, KeyError, IndexError, RecursionError) as exc:
        raise TemplateError(f"the template cannot be compiled: {exc}") from None


def check(template_text: str) -> None:
    """Raise TemplateError naming the problem if `template_text` does not compile."""
    if not isinstance(template_text, str):
        raise TemplateError("a template must be a string")
    _compile(template_text)


def render(template_text: str, context: dict[str, Any] | None = None, *, autoescape: bool = False) -> str:
    """Render on a private copy of the JSON `context` (templates may call list/dict methods)."""
    template = _compile(template_text)
    data = copy.deepcopy(context or {})
    try:
        output = template.render(Context(data, autoescape=autoescape))
    except _LimitExceeded as exc:
        raise TemplateError(f"the template exceeds a limit: {exc}") from None
    except TemplateSyntaxError as exc:
        raise TemplateError(_explain(exc)) from None
    except RecursionError:
        raise TemplateError("the template nests too deeply") from None
    except Exception as exc:  # noqa: BLE001 - any other failure is the template's (e.g. divisibleby:0)
        debug = getattr(exc, "template_debug", None)
        where = f"line {debug['line']}: " if debug else ""
        raise TemplateError(f"{where}the template failed to render: {type(exc).__name__}: {exc}") from None
    if len(output) > MAX_OUTPUT_CHARS:
        raise TemplateError(f"the rendered text is longer than {MAX_OUTPUT_CHARS} characters")
    return str(output)

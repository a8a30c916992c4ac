"""A sandboxed Django template engine for tenant-written subjects and bodies.

Templates are written by API clients, so the engine is built from an allow-list:
- no loaders, and no `include` / `extends` / `block`: nothing reads a file;
- no `load`, `debug` (dumps the context and sys.modules), `url`, `csrf_token`, `lorem`, `querystring`;
- the context is a deep copy of the request's JSON only (no settings, no request, no processors);
  Django already refuses variables and attributes that start with an underscore;
- variables read the context only: no method of a context value is called (except a dict's
  `items`, `keys` and `values`), so `{{ s.split }}` cannot build what the budgets below do not see;
- filters that can allocate without bound (`center`, `ljust`, `rjust`, `stringformat`,
  `floatformat`) take bounded arguments.

Bounds hold while the template runs, not after (issue 19): compiling is limited by the source's
size and its number of tags; a render carries a budget (a context variable, so filters see it too)
charged as it goes: each node's output is charged as it is produced (a node is charged only for
what it adds to its children's output), every filter result and `regroup` is charged to a work
budget, `for` loops share an iteration budget, and a deadline is checked at every node and filter.
The first charge past a budget raises, so a template whose output would be gigabytes stops after
about MAX_OUTPUT_CHARS. Compiled templates are cached in an LRU bounded in (estimated) bytes.
Missing variables render as the empty string.
"""

from __future__ import annotations

import contextvars
import copy
import functools
import itertools
import re
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.template import Context, Engine, Library, Template, TemplateSyntaxError, defaultfilters, defaulttags
from django.template.base import (
    DebugLexer,
    FilterExpression,
    Lexer,
    Node,
    Parser,
    Variable,
    VariableDoesNotExist,
    tag_re,
)
from django.template.context import BaseContext
from django.template.defaulttags import ForNode, RegroupNode

MAX_SOURCE_CHARS = 256 * 1024  # = validation.MAX_BODY_CHARS, what the API accepts for a body
MAX_TAGS = 5_000  # tags, variables and comments per source: what compiling costs (~1 KiB and 30 µs each)
MAX_OUTPUT_CHARS = 256 * 1024  # per rendered template (and per filter result)
MAX_WORK_BYTES = 8 * 1024 * 1024  # all filter results and regroups of one render, as Python allocates them
MAX_LOOP_ITERATIONS = 10_000  # across all `for` loops of one render
MAX_WIDTH = 1_000  # center / ljust / rjust
MAX_PRECISION = 20  # floatformat
DEFAULT_RENDER_SECONDS = 0.5  # settings.OMNIPOST_TEMPLATE_RENDER_SECONDS
DEFAULT_CACHE_BYTES = 32 * 1024 * 1024  # settings.OMNIPOST_TEMPLATE_CACHE_BYTES
NODE_BYTES = 1024  # estimated memory of one compiled node (measured: 400-800 B with its token and expressions)

SAFE_TAGS = (
    "autoescape", "comment", "cycle", "filter", "firstof", "for", "if", "ifchanged", "now", "regroup",
    "resetcycle", "spaceless", "templatetag", "verbatim", "widthratio", "with",
)  # fmt: skip
EXCLUDED_FILTERS = ("stringformat",)  # "%0999999999d" allocates a gigabyte before any check can run

clock: Callable[[], float] = time.monotonic  # tests replace it to move time without sleeping


class TemplateError(ValueError):
    """The template cannot be compiled or rendered; the message says what to fix."""


class _LimitExceeded(Exception):
    pass


@dataclass(slots=True)
class _Budget:
    """What one render may still spend; the first charge past a limit raises _LimitExceeded."""

    deadline: float
    seconds: float
    output: int = 0  # characters charged to the output so far
    work: int = 0  # bytes of filter results and regroups so far
    loops: int = 0

    def tick(self) -> None:
        if clock() > self.deadline:
            raise _LimitExceeded(f"the template takes longer than {self.seconds:g} s to render")

    def charge_output(self, chars: int) -> None:
        self.output += chars
        if self.output > MAX_OUTPUT_CHARS:
            raise _LimitExceeded(f"the rendered text is longer than {MAX_OUTPUT_CHARS} characters")

    def charge_work(self, size: int) -> None:
        self.work += size
        if self.work > MAX_WORK_BYTES:
            raise _LimitExceeded(
                f"filters produce more than {MAX_WORK_BYTES // (1024 * 1024)} MiB of intermediate values"
            )
        self.tick()

    def charge_loops(self, count: int) -> None:
        self.loops += count
        if self.loops > MAX_LOOP_ITERATIONS:
            raise _LimitExceeded(f"the template loops more than {MAX_LOOP_ITERATIONS} times in total")


_budget: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("omnipost_template_budget", default=None)


def _size(value: Any) -> int:
    """Bytes Python holds for a filter result: strings exactly, sequences with their string items."""
    size = sys.getsizeof(value)
    if isinstance(value, list | tuple):
        size += sum(sys.getsizeof(item) for item in value if isinstance(item, str | list | tuple))
    return size


register = Library()


def _capped(func: Callable) -> Callable:
    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = func(*args, **kwargs)
        if isinstance(result, str | list | tuple) and len(result) > MAX_OUTPUT_CHARS:
            raise _LimitExceeded(f"a filter produced more than {MAX_OUTPUT_CHARS} characters")
        budget = _budget.get()
        if budget is not None:
            budget.charge_work(_size(result))
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
    """`for` that charges its iterations to the render's budget before looping."""

    def render(self, context: Context) -> str:
        values = self.sequence.resolve(context, ignore_failures=True)
        budget = _budget.get()
        if budget is not None:
            budget.charge_loops(len(values) if hasattr(values, "__len__") else 0)
        return super().render(context)


class _BudgetedRegroupNode(RegroupNode):
    """`regroup` builds a list of groups no filter sees: charge it as work."""

    def render(self, context: Context) -> str:
        output = super().render(context)
        budget = _budget.get()
        groups = context.get(self.var_name)
        if budget is not None and isinstance(groups, list):
            budget.charge_work(sys.getsizeof(groups) + sum(sys.getsizeof(g) + _size(g.list) for g in groups))
        return output


def _retyped(parse: Callable, cls: type) -> Callable:
    def tag(parser: Any, token: Any) -> Node:
        node = parse(parser, token)
        node.__class__ = cls
        return node

    return tag


_BUDGETED_TAGS = {"for": (defaulttags.do_for, _BudgetedForNode), "regroup": (defaulttags.regroup, _BudgetedRegroupNode)}
for _name in SAFE_TAGS:
    _entry = _BUDGETED_TAGS.get(_name)
    register.tag(_name, _retyped(*_entry) if _entry else defaulttags.register.tags[_name])


# --- variables and nodes --------------------------------------------------------------------------

_DICT_VIEWS = frozenset({"items", "keys", "values"})


class _SandboxVariable(Variable):
    """Django's lookup (key, attribute, index) without calling methods of context values.

    A JSON context holds dicts, lists, strings and numbers; their methods either change the data or
    build new values out of sight of the work budget (`s.split`, `l.copy`). Only a dict's views are
    called: they cost nothing and `{% for k, v in d.items %}` is common. Anything else callable
    renders as the empty string, like a missing variable.
    """

    __slots__ = ()

    def _resolve_lookup(self, context: Any) -> Any:
        current = context
        for bit in self.lookups:
            try:
                if not hasattr(type(current), "__getitem__"):
                    raise TypeError
                current = current[bit]
            except (TypeError, AttributeError, KeyError, ValueError, IndexError):
                if isinstance(current, BaseContext):  # never a Context's own attributes
                    raise VariableDoesNotExist("Failed lookup for key [%s]", (bit,)) from None
                try:
                    current = getattr(current, bit)
                except (TypeError, AttributeError):
                    try:
                        current = current[int(bit)]
                    except (IndexError, ValueError, KeyError, TypeError):
                        raise VariableDoesNotExist("Failed lookup for key [%s]", (bit,)) from None
            if callable(current):
                if isinstance(getattr(current, "__self__", None), dict) and bit in _DICT_VIEWS:
                    current = current()
                else:
                    return context.template.engine.string_if_invalid
        return current


class _SandboxFilterExpression(FilterExpression):
    def __init__(self, token: str, parser: Parser) -> None:
        super().__init__(token, parser)
        if isinstance(self.var, Variable):
            self.var.__class__ = _SandboxVariable
        for _func, args in self.filters:
            for is_lookup, arg in args:
                if is_lookup and isinstance(arg, Variable):
                    arg.__class__ = _SandboxVariable


class _SandboxParser(Parser):
    def compile_filter(self, token: str) -> FilterExpression:
        return _SandboxFilterExpression(token, self)


class _MeteredNode(Node):
    """Mixed into every node of a sandboxed template: checks the deadline before rendering and
    charges the output budget with what the node adds to its children's (already charged) output."""

    def render_annotated(self, context: Context) -> str:
        budget = _budget.get()
        if budget is None:  # rendered at compile time (`verbatim`) or outside render()
            return super().render_annotated(context)
        budget.tick()
        before = budget.output
        output = super().render_annotated(context)
        added = len(output) - (budget.output - before)
        if added > 0:
            budget.charge_output(added)
        return output


@functools.cache
def _metered(cls: type[Node]) -> type[Node]:
    return type(f"Metered{cls.__name__}", (_MeteredNode, cls), {"__module__": __name__})


class _SandboxTemplate(Template):
    def compile_nodelist(self) -> Any:
        lexer = DebugLexer(self.source) if self.engine.debug else Lexer(self.source)
        parser = _SandboxParser(
            lexer.tokenize(), self.engine.template_libraries, self.engine.template_builtins, self.origin
        )
        try:
            nodelist = parser.parse()
        except Exception as exc:
            if self.engine.debug and hasattr(exc, "token"):
                exc.template_debug = self.get_exception_info(exc, exc.token)
            raise
        self.extra_data = parser.extra_data
        nodes = nodelist.get_nodes_by_type(Node)
        for node in nodes:
            if not isinstance(node, _MeteredNode):
                node.__class__ = _metered(type(node))
        self.node_count = len(nodes)
        return nodelist

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


class _TemplateCache:
    """LRU of compiled templates bounded in estimated bytes (source + NODE_BYTES per node), not in
    entries: 512 entries of 256 KiB sources were a gigabyte. Read by every request thread."""

    def __init__(self) -> None:
        self._entries: OrderedDict[str, tuple[_SandboxTemplate, int]] = OrderedDict()
        self._lock = threading.Lock()
        self.bytes = 0

    @staticmethod
    def limit() -> int:
        return int(getattr(settings, "OMNIPOST_TEMPLATE_CACHE_BYTES", DEFAULT_CACHE_BYTES))

    def get(self, source: str) -> _SandboxTemplate | None:
        with self._lock:
            entry = self._entries.get(source)
            if entry is None:
                return None
            self._entries.move_to_end(source)
            return entry[0]

    def put(self, source: str, template: _SandboxTemplate) -> None:
        cost = sys.getsizeof(source) + NODE_BYTES * template.node_count
        limit = self.limit()
        with self._lock:
            if cost > limit or source in self._entries:
                return
            self._entries[source] = (template, cost)
            self.bytes += cost
            while self.bytes > limit:
                _, (_, evicted) = self._entries.popitem(last=False)
                self.bytes -= evicted

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)


CACHE = _TemplateCache()


def _compile(template_text: str) -> _SandboxTemplate:
    cached = CACHE.get(template_text)
    if cached is not None:
        return cached
    if len(template_text) > MAX_SOURCE_CHARS:
        raise TemplateError(f"the template is longer than {MAX_SOURCE_CHARS} characters")
    tags = sum(1 for _ in itertools.islice(tag_re.finditer(template_text), MAX_TAGS + 1))
    if tags > MAX_TAGS:
        raise TemplateError(f"the template has more than {MAX_TAGS} tags and variables; split it or simplify it")
    try:
        template = _SandboxTemplate(template_text, engine=ENGINE)
    except TemplateSyntaxError as exc:
        raise TemplateError(_explain(exc)) from None
    except (ValueError, TypeError, KeyError, IndexError, RecursionError) as exc:
        raise TemplateError(f"the template cannot be compiled: {exc}") from None
    CACHE.put(template_text, template)
    return template


def variables(template_text: str) -> set[str]:
    """The names a template reads from its context (`{{ name.attr }}` → `name`, in tags and filter
    arguments too), without those it binds itself (`for`, `with`, `forloop`); TemplateError if it does
    not compile. What a bulk send's header must name (bulk.csvfile)."""
    found: set[str] = set()
    bound: set[str] = {"forloop", "True", "False", "None"}
    seen: set[int] = set()

    def visit(value: Any, depth: int) -> None:
        if depth > 200 or id(value) in seen:
            return
        seen.add(id(value))
        if isinstance(value, FilterExpression):
            visit(value.var, depth + 1)
            for _func, args in value.filters:
                for is_lookup, arg in args:
                    if is_lookup:
                        visit(arg, depth + 1)
            return
        if isinstance(value, Variable):
            if value.lookups:
                found.add(value.lookups[0])
            return
        if isinstance(value, (list, tuple)):
            for item in value:
                visit(item, depth + 1)
            return
        if isinstance(value, dict):
            for item in value.values():
                visit(item, depth + 1)
            return
        if isinstance(value, ForNode):
            bound.update(value.loopvars)
        elif hasattr(value, "extra_context") and isinstance(value.extra_context, dict):  # `with`
            bound.update(value.extra_context)
        elif hasattr(value, "var_name") and isinstance(value.var_name, str):  # `regroup … as x`, `cycle … as x`
            bound.add(value.var_name)
        module = type(value).__module__
        if module.startswith("django.template") or module == __name__:
            for item in vars(value).values() if hasattr(value, "__dict__") else ():
                visit(item, depth + 1)

    visit(_compile(template_text).nodelist, 0)
    return {name for name in found - bound if not name.startswith("_")}


def render_seconds() -> float:
    return float(getattr(settings, "OMNIPOST_TEMPLATE_RENDER_SECONDS", DEFAULT_RENDER_SECONDS))


def check(template_text: str) -> None:
    """Raise TemplateError naming the problem if `template_text` does not compile."""
    if not isinstance(template_text, str):
        raise TemplateError("a template must be a string")
    _compile(template_text)


def render(template_text: str, context: dict[str, Any] | None = None, *, autoescape: bool = False) -> str:
    """Render on a private copy of the JSON `context` (templates may call list/dict methods)."""
    template = _compile(template_text)
    data = copy.deepcopy(context or {})
    seconds = render_seconds()
    token = _budget.set(_Budget(deadline=clock() + seconds, seconds=seconds))
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
    finally:
        _budget.reset(token)
    if len(output) > MAX_OUTPUT_CHARS:  # the budget already stopped it; kept as the contract's last word
        raise TemplateError(f"the rendered text is longer than {MAX_OUTPUT_CHARS} characters")
    # Plain text, not Django's SafeString: what a template renders is the tenant's text, and a page
    # that shows it (the console's preview) must escape it like any other value.
    return str.__str__(output)

"""Reads SQL out of Python source: the string constants a module holds (docstrings left out, an
f-string with its `{…}` holes kept as holes) and the tables their statements write.

A write is INSERT INTO, UPDATE (not FOR / FOR NO KEY / ON CONFLICT DO UPDATE), DELETE FROM, MERGE
INTO or TRUNCATE, in any case, with SQL comments (`-- …`) left out. Its target is the identifier
after the keyword (`ONLY`, quotes and a schema left out); a target that is a hole (`{table}`, `%s`)
or missing (the string ends there: `"UPDATE " + table`) is `DYNAMIC`, a table only the running code
knows. Used by tests/test_table_owners.py (which app may write which table); the reader has tests
of its own there, fed synthetic source."""

from __future__ import annotations

import ast
import re
from pathlib import Path

DYNAMIC = "?"  # the target of a write whose table is not spelled in the text
# Tables made by a migration's raw SQL, not by a model: app label -> tables.
RAW_TABLES: dict[str, tuple[str, ...]] = {"events": ("event_outcome_batches",)}

# Not production code: tests, migrations, and the benchmarks (they load millions of rows directly).
NOT_PRODUCTION = ("tests/", "bench/", "benchmarks/", ".venv/", "var/", "node_modules/", "docs/", "scripts/")

_NAME = r'(?:"[^"]+"|\w+)(?:\.(?:"[^"]+"|\w+))?'
_HOLE = r"\{[^{}]*\}|%(?:\(\w+\))?s"
_WRITE = re.compile(
    r"(?<![\w.])(?:"
    r"(?<!FOR )(?<!KEY )(?<!DO )UPDATE(?:\s+ONLY)?"
    r"|INSERT\s+INTO"
    r"|DELETE\s+FROM(?:\s+ONLY)?"
    r"|MERGE\s+INTO"
    r"|TRUNCATE(?:\s+TABLE)?(?:\s+ONLY)?"
    rf")(?:\s+(?P<target>{_HOLE}|{_NAME}(?:\s*,\s*(?:{_HOLE}|{_NAME}))*)|\s+(?P<end>$))",
    re.IGNORECASE,
)
_TRUNCATE = re.compile(r"^TRUNCATE", re.IGNORECASE)
_COMMENT = re.compile(r"--[^\n]*")
_SPACE = re.compile(r"\s+")
# UPDATE's target is one table; a word after it that is SQL (`UPDATE SET`, `UPDATE OF`, `UPDATE
# SKIP`) is the tail of a lock clause split across lines or strings, not a table.
_NOT_A_TABLE = {
    "set", "of", "skip", "nowait", "where", "from", "select", "values", "on", "as", "exclusive",
    "false", "true", "off",  # VACUUM (TRUNCATE false)
}  # fmt: skip


def tables_by_package() -> dict[str, set[str]]:
    """package -> the tables it owns: Django's registry (each model's `db_table`, where the model
    is defined) plus RAW_TABLES."""
    from django.apps import apps

    owned: dict[str, set[str]] = {}
    for model in apps.get_models(include_auto_created=True):
        package = model.__module__.split(".")[0]
        owned.setdefault(package, set()).add(model._meta.db_table)
    for package, tables in RAW_TABLES.items():
        owned.setdefault(package, set()).update(tables)
    return owned


def production_sources(root: Path) -> dict[str, str]:
    """path (relative, /-separated) -> source, of every production module under `root`."""
    sources = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(NOT_PRODUCTION) or "/migrations/" in rel or "__pycache__" in rel:
            continue
        sources[rel] = path.read_text()
    return sources


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _joined(node: ast.JoinedStr) -> str:
    """An f-string's text, each replacement field a `{}` hole."""
    parts = []
    for value in node.values:
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            parts.append(value.value)
        else:
            parts.append("{}")
    return "".join(parts)


def sql_strings(source: str) -> list[tuple[int, str]]:
    """(line, text) of each string constant and f-string of a module, docstrings left out."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            skip.update(id(v) for v in node.values)
            found.append((node.lineno, _joined(node)))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            found.append((node.lineno, node.value))
    return sorted(found, key=lambda item: item[0])


def _table(name: str) -> str:
    return name.split(".")[-1].strip('"').lower()


def written_tables(text: str) -> list[str]:
    """The tables the statements (or fragments) in `text` write, in order; DYNAMIC for a target the
    text does not spell."""
    flat = _SPACE.sub(" ", _COMMENT.sub(" ", text))
    tables = []
    for match in _WRITE.finditer(flat):
        target = match.group("target")
        if match.group("end") is not None or target is None:
            tables.append(DYNAMIC)
            continue
        names = [t.strip() for t in target.split(",")] if _TRUNCATE.match(match.group(0)) else [target]
        for name in names:
            if re.fullmatch(_HOLE, name):
                tables.append(DYNAMIC)
            elif _table(name) not in _NOT_A_TABLE:
                tables.append(_table(name))
    return tables


def writes(source: str) -> list[tuple[int, str]]:
    """(line, table) of every write in a module's SQL strings."""
    return [(line, table) for line, text in sql_strings(source) for table in written_tables(text)]

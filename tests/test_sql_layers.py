"""The layers hold in SQL as in imports: no SQL text, foreign key or trigger of a lower app names a
table that a higher app owns. import-linter sees only imports; a join spelled in a string, or a
foreign key in the migrated schema, couples the generic queue to the domain just as much.

The layers are pyproject.toml's `[tool.importlinter]` contract; which app owns a table is Django's
registry (each model's `db_table`), plus the tables an app creates in raw SQL (`RAW_TABLES`) and the
partitions PostgreSQL keeps of a partitioned parent (same owner as the parent); tests.support.sql_scan
reads them."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest
from django.db import connection

from tests.support.sql_scan import tables_by_package

ROOT = Path(__file__).resolve().parent.parent
SQL_KEYWORDS = re.compile(r"\b(SELECT|INSERT|UPDATE|DELETE|FROM|JOIN|TRUNCATE|VACUUM|ANALYZE|REFERENCES)\b", re.I)


def layer_of() -> dict[str, int]:
    """package -> layer index, 0 the lowest (pyproject lists them from the top)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    [contract] = [c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers"]
    order: dict[str, int] = {}
    for depth, layer in enumerate(reversed(contract["layers"])):
        for package in layer.split("#")[0].split("|"):
            order[package.strip()] = depth
    return order


def higher_tables(package: str) -> dict[str, str]:
    """table -> owning package, for every table owned by a package above `package`."""
    layers = layer_of()
    mine = layers[package]
    return {
        table: owner
        for owner, tables in tables_by_package().items()
        if owner in layers and layers[owner] > mine
        for table in tables
    }


def all_tables() -> set[str]:
    return set().union(*tables_by_package().values())


def sql_strings(source: str) -> list[tuple[int, str]]:
    """String constants of a module that may be SQL, docstrings left out; a bare table name counts
    only inside a tuple, list or set whose items are all table names (`TABLES = ("queue_state", …)`),
    so an app label such as ("notifications", "view_notification") is not one."""
    tree = ast.parse(source)
    known = all_tables()
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    table_lists = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Tuple | ast.List | ast.Set) and node.elts and all(
            isinstance(e, ast.Constant) and isinstance(e.value, str) and e.value in known for e in node.elts
        ):
            table_lists.update(id(e) for e in node.elts)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            if id(node) in table_lists or SQL_KEYWORDS.search(node.value):
                found.append((node.lineno, node.value))
    return found


def named_tables(text: str, tables: dict[str, str]) -> set[str]:
    if text.strip() in tables:  # a table named on its own, in a list of tables
        return {text.strip()}
    return {t for t in tables if re.search(rf'(?<![\w.]){re.escape(t)}(?![\w])', text)}


def violations(package: str, sources: dict[str, str]) -> dict[str, list[str]]:
    tables = higher_tables(package)
    found: dict[str, list[str]] = {}
    for path, source in sources.items():
        for line, text in sql_strings(source):
            for table in sorted(named_tables(text, tables)):
                found.setdefault(path, []).append(f"line {line}: {table} ({tables[table]})")
    return found


def package_sources(package: str) -> dict[str, str]:
    return {
        path.relative_to(ROOT).as_posix(): path.read_text()
        for path in sorted((ROOT / package).rglob("*.py"))
        if "migrations" not in path.parts and "__pycache__" not in path.parts
    }


# core and queueing are the generic layers; the rooms under notifications hold to the same rule.
LOWER = ("core", "queueing", "providers", "recipients", "templating", "routing")


@pytest.mark.parametrize("package", LOWER)
def test_no_sql_of_a_lower_layer_names_a_higher_table(package):
    assert violations(package, package_sources(package)) == {}


@pytest.mark.parametrize(
    ("package", "snippet", "table"),
    [
        ("queueing", 'SQL = "UPDATE notifications SET status = %s WHERE id = %s"\n', "notifications"),
        ("queueing", 'J = f"SELECT 1 FROM queue_state q LEFT JOIN providers p ON p.id = q.lane_id"\n', "providers"),
        ("queueing", 'TABLES = ("queue_state", "event_deliveries")\n', "event_deliveries"),
        ("core", 'X = "INSERT INTO dead_letter_queue (id) VALUES (%s)"\n', "dead_letter_queue"),
    ],
)
def test_a_deliberate_violation_is_found(package, snippet, table):
    found = violations(package, {f"{package}/back_edge.py": snippet})
    assert list(found) == [f"{package}/back_edge.py"]
    assert table in found[f"{package}/back_edge.py"][0]


def test_a_docstring_or_own_table_is_not_a_violation():
    source = (
        '"""Moves notifications along; UPDATE notifications is the domain\'s."""\n'
        'Q = "SELECT 1 FROM queue_state"\n'
    )
    assert violations("queueing", {"queueing/x.py": source}) == {}


@pytest.mark.django_db
@pytest.mark.parametrize("package", LOWER)
def test_the_migrated_schema_has_no_foreign_key_or_trigger_from_a_lower_table_up(package):
    mine = tables_by_package()[package]
    tables = higher_tables(package)
    with connection.cursor() as cursor:
        cursor.execute(
            """SELECT c.conrelid::regclass::text, c.confrelid::regclass::text FROM pg_constraint c
               WHERE c.contype = 'f' AND c.conrelid::regclass::text = ANY(%s)""",
            [sorted(mine)],
        )
        keys = [(src, dst) for src, dst in cursor.fetchall() if dst in tables]
        cursor.execute(
            """SELECT t.tgrelid::regclass::text, p.prosrc FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid
               WHERE NOT t.tgisinternal AND t.tgrelid::regclass::text = ANY(%s)""",
            [sorted(mine)],
        )
        triggers = [(src, sorted(named_tables(body, tables))) for src, body in cursor.fetchall()]
    assert keys == []
    assert [t for t in triggers if t[1]] == []


# --- migrations: no lower app's migration depends on a higher app's ---------------------------------


def upward_dependencies(edges: list[tuple[tuple[str, str], tuple[str, str]]], package: str) -> list[str]:
    """The (migration, dependency) edges from `package`'s migrations to an app above it."""
    layers = layer_of()
    return [
        f"{child[0]}.{child[1]} -> {parent[0]}.{parent[1]}"
        for child, parent in edges
        if child[0] == package and parent[0] in layers and layers[parent[0]] > layers[package]
    ]


def migration_edges() -> list[tuple[tuple[str, str], tuple[str, str]]]:
    """Every dependency of the graph a fresh database migrates by (squashed migrations in place of the
    ones they replace, as for any database that has applied none or all of those)."""
    from django.db.migrations.loader import MigrationLoader

    graph = MigrationLoader(None, ignore_no_migrations=True).graph
    return [(key, parent.key) for key, node in graph.node_map.items() for parent in node.parents]


@pytest.mark.parametrize("package", LOWER)
def test_no_migration_of_a_lower_layer_depends_on_a_higher_app(package):
    edges = migration_edges()
    assert any(child[0] == package for child, _ in edges)
    assert upward_dependencies(edges, package) == []


def test_a_deliberate_upward_migration_dependency_is_found():
    edges = [
        (("queueing", "0009_x"), ("queueing", "0008_y")),
        (("queueing", "0009_x"), ("notifications", "0001_initial")),  # the back-edge
        (("notifications", "0019_z"), ("queueing", "0009_x")),
        (("core", "0001_initial"), ("auth", "0012_alter_user_first_name_max_length")),  # below every layer
    ]
    assert upward_dependencies(edges, "queueing") == ["queueing.0009_x -> notifications.0001_initial"]
    assert upward_dependencies(edges, "notifications") == upward_dependencies(edges, "core") == []

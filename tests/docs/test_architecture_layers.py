"""docs/ARCHITECTURE.md's layer table says what import-linter enforces: the same apps on the same
layers, in the same order, siblings independent where `pyproject.toml` makes them so."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ARCHITECTURE = REPO / "docs" / "ARCHITECTURE.md"
PYPROJECT = REPO / "pyproject.toml"

Layer = tuple[frozenset[str], bool]  # the apps of one layer, and whether they may not import each other


def enforced(pyproject: str) -> tuple[list[Layer], set[str]]:
    """The layers contract of `[tool.importlinter]`, top first, and its root packages."""
    linter = tomllib.loads(pyproject)["tool"]["importlinter"]
    (contract,) = [c for c in linter["contracts"] if c["type"] == "layers"]
    layers = []
    for layer in contract["layers"]:
        apps = frozenset(name.strip() for name in re.split(r"[|:]", layer))
        layers.append((apps, len(apps) > 1 and "|" in layer))  # import-linter: `|` independent, `:` not
    return layers, set(linter["root_packages"])


def documented(markdown: str) -> list[Layer]:
    """The `| layer | app | holds |` table, top first: its rows number the layers from the bottom."""
    lines = markdown.splitlines()
    start = lines.index("| layer | app | holds |") + 2  # past the header's separator row
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        number, apps_cell = (cell.strip() for cell in line.strip("|").split("|")[:2])
        apps = frozenset(re.findall(r"`([a-z_]+)/`", apps_cell))
        rows.append((int(number), (apps, len(apps) > 1 and "(independent)" in apps_cell)))
    assert [n for n, _ in rows] == list(range(len(rows), 0, -1)), "layers numbered from the top down to 1"
    return [layer for _, layer in rows]


def disagreements(markdown: str, pyproject: str) -> list[str]:
    layers, roots = enforced(pyproject)
    table = documented(markdown)
    found = []
    for depth in range(max(len(layers), len(table))):
        linted = layers[depth] if depth < len(layers) else None
        shown = table[depth] if depth < len(table) else None
        if linted != shown:
            found.append(f"layer {len(layers) - depth} from the bottom: pyproject {linted}, ARCHITECTURE {shown}")
    missing = roots - {app for apps, _ in table for app in apps}
    if missing:
        found.append(f"root packages missing from ARCHITECTURE's table: {sorted(missing)}")
    return found


def test_the_layer_table_matches_the_import_contract():
    assert disagreements(ARCHITECTURE.read_text(), PYPROJECT.read_text()) == []


def test_a_disagreement_is_caught():
    markdown, pyproject = ARCHITECTURE.read_text(), PYPROJECT.read_text()

    moved = re.sub(r"`dispatch/` · `operations/` · `receipts/`", "`dispatch/` · `receipts/`", markdown)
    moved = re.sub(r"`dlq/` · `events/`", "`dlq/` · `events/` · `operations/`", moved)
    assert moved != markdown
    assert disagreements(moved, pyproject)

    swapped = pyproject.replace('"dlq | events",', '"notifications", "dlq | events",', 1)
    swapped = swapped.replace('    "notifications",\n    "routing",', '    "routing",', 1)
    assert swapped != pyproject
    assert disagreements(markdown, swapped)

    not_independent = pyproject.replace('"dlq | events"', '"dlq : events"', 1)
    assert disagreements(markdown, not_independent)

    forgotten = markdown.replace("| 12 | `benchmarks/` |", "| 12 | benchmarks |", 1)
    assert forgotten != markdown
    assert any("benchmarks" in d for d in disagreements(forgotten, pyproject))

"""The layers contract (pyproject.toml, `make lint`): kept on the tree, broken by a back-edge."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT = Path(sys.executable).with_name("lint-imports")
PACKAGES = (
    "core", "queueing", "templating", "providers", "recipients", "routing", "notifications", "events", "dlq",
    "inbox", "receipts", "workflows", "bulk", "dispatch", "operations", "benchmarks", "omnipost_site",
)  # fmt: skip


def lint(cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(  # noqa: S603
        [str(LINT), "--no-cache"], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.fixture
def tree_copy(tmp_path: Path) -> Path:
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_tree_keeps_its_layers():
    result = lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 kept, 0 broken" in result.stdout


@pytest.mark.parametrize(
    ("lower", "upper"),
    [
        ("queueing", "notifications.models"),  # the queue learns of notifications
        ("notifications", "dlq.models"),  # the domain reaches for dead letters
        ("core", "queueing.ratelimit"),  # even lazily, inside a function
        ("dlq", "dispatch.dispatcher"),  # a domain app imports the process
        ("events", "receipts.inbound"),  # outbound events reach for the inbound side
        ("providers", "routing.circuits"),  # a provider reads its breaker's state itself
        ("routing", "notifications.counters"),  # the breaker reads the counters itself
        ("recipients", "notifications.tenant_config"),  # category keys from the cache above
        ("templating", "providers.models"),  # siblings know nothing of each other
        ("inbox", "receipts.services"),  # the feed writes the receipts' events itself
    ],
)
def test_a_back_edge_breaks_the_contract(tree_copy: Path, lower: str, upper: str):
    (tree_copy / lower / "back_edge.py").write_text(f"def up():\n    import {upper}  # noqa: F401\n")
    result = lint(tree_copy)
    assert result.returncode == 1, result.stdout
    assert "OmniPost layers BROKEN" in result.stdout
    assert f"{lower}.back_edge -> {upper}" in result.stdout

"""Every command the docs show works: `manage.py …` lines name a real management command with
arguments its parser accepts, `make …` names a Makefile target, `curl` URLs route, the Procfile's
processes parse, and the Mermaid diagrams have the shapes GitHub renders."""

from __future__ import annotations

import io
import re
import shlex
from pathlib import Path

import pytest
from django.conf import settings
from django.core.management import call_command, get_commands, load_command_class
from django.urls import Resolver404, resolve

from core.models import Tenant

REPO = Path(settings.BASE_DIR)
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^[ \t]*```([^\n]*)\n(.*?)^[ \t]*```", re.M | re.S)  # also fences inside list items
MANAGE = re.compile(r"manage\.py\s+([^`#;|&\n]*)")
MAKE = re.compile(r"(?:^|&&|;|\|\|)\s*make\s+([A-Za-z][\w-]*)")
# Only these are run for real against the test database; the rest are parsed, never executed.
HARMLESS = {"queue_stats", "check"}


def fenced(doc: Path) -> list[tuple[str, str]]:
    return [(m[1].strip(), m[2]) for m in FENCE.finditer(doc.read_text())]


def prose(doc: Path) -> str:
    return FENCE.sub("", doc.read_text())


def logical_lines(block: str) -> list[str]:
    return block.replace("\\\n", " ").splitlines()


def shown_commands() -> list[tuple[str, list[str]]]:
    """(where, argv after manage.py) for every manage.py command in a code block, an inline code
    span or the Procfile."""
    found = []
    for doc in DOCS:
        for lang, block in fenced(doc):
            if lang == "mermaid":
                continue
            for line in logical_lines(block):
                found += [(f"{doc.name}: {line.strip()}", shlex.split(m[1])) for m in MANAGE.finditer(line)]
        for span in re.findall(r"`([^`\n]*manage\.py [^`\n]*)`", prose(doc)):
            found += [(f"{doc.name}: `{span}`", shlex.split(m[1])) for m in MANAGE.finditer(span)]
    for line in (REPO / "Procfile").read_text().splitlines():
        found += [(f"Procfile: {line}", shlex.split(m[1])) for m in MANAGE.finditer(line)]
    return found


def parse(argv: list[str]) -> None:
    name, *args = argv
    commands = get_commands()
    assert name in commands, f"no management command {name!r}"
    command = load_command_class(commands[name], name)
    command.create_parser("manage.py", name).parse_args(args)  # raises CommandError on bad arguments


COMMANDS = shown_commands()


def test_the_docs_show_the_operations_commands():
    names = {argv[0] for _, argv in COMMANDS}
    assert {"run_dispatcher", "run_scheduler", "queue_stats", "prune", "dlq_redrive", "rotate_encryption_keys",
            "migrate", "run_all", "create_tenant"} <= names
    assert len(COMMANDS) >= 20


@pytest.mark.parametrize(("where", "argv"), COMMANDS, ids=[w for w, _ in COMMANDS])
def test_every_manage_py_command_parses(where, argv):
    parse(argv)


def test_the_parser_check_catches_mistakes():
    from django.core.management.base import CommandError

    with pytest.raises(CommandError):
        parse(["prune", "--older-then", "30"])
    with pytest.raises(AssertionError, match="no management command"):
        parse(["purge"])


@pytest.mark.django_db
def test_read_only_and_dry_run_commands_run():
    """The ones that change nothing run for real on the test database."""
    Tenant.objects.create(name="acme")
    ran = 0
    for _where, (name, *args) in COMMANDS:
        if name in HARMLESS and "--deploy" not in args or "--dry-run" in args:
            call_command(name, *args, stdout=io.StringIO(), stderr=io.StringIO())
            ran += 1
    assert ran >= 6


def test_every_make_target_exists():
    targets = set(re.findall(r"^([A-Za-z][\w.-]*):", (REPO / "Makefile").read_text(), re.M))
    named = set()
    for doc in DOCS:
        for lang, block in fenced(doc):
            if lang != "mermaid":
                named |= {m for line in logical_lines(block) for m in MAKE.findall(line.split(" #")[0])}
        named |= {m for span in re.findall(r"`(make [^`\n]+)`", prose(doc)) for m in MAKE.findall(span)}
    assert {"run", "test"} <= named
    assert named <= targets, named - targets


def test_curl_examples_route():
    urls = []
    for doc in DOCS:
        for _lang, block in fenced(doc):
            urls += [u for line in logical_lines(block) if "curl" in line
                     for u in re.findall(r"http://127\.0\.0\.1:8000(/[^\s'\"]*)", line)]  # fmt: skip
    assert urls
    for path in urls:
        try:
            match = resolve(path)
        except Resolver404:
            pytest.fail(f"{path} does not route")
        assert match.url_name, f"{path} only reaches the API's catch-all 404"


def test_documented_variables_exist():
    code = "\n".join(p.read_text() for p in REPO.glob("*/**/*.py") if ".venv" not in p.parts and "tests" not in p.parts)
    for doc in DOCS:
        for name in set(re.findall(r"\bOMNIPOST_[A-Z_]+[A-Z]\b", doc.read_text())):
            assert name in code, f"{doc.name} documents {name}, which nothing reads"


def test_relative_links_resolve():
    for doc in DOCS:
        for target in re.findall(r"\]\((?!https?:|#)([^)#\s]+)", doc.read_text()):
            assert (doc.parent / target).exists(), f"{doc.name} links to missing {target}"


DIAGRAM_TYPES = ("flowchart TD", "flowchart LR", "sequenceDiagram", "stateDiagram-v2")


def test_architecture_has_the_diagrams_github_renders():
    blocks = [body for lang, body in fenced(REPO / "docs" / "ARCHITECTURE.md") if lang == "mermaid"]
    kinds = [body.strip().splitlines()[0].strip() for body in blocks]
    assert set(kinds) <= set(DIAGRAM_TYPES), kinds
    assert {"sequenceDiagram", "stateDiagram-v2"} <= set(kinds) and len(blocks) >= 4
    for body in blocks:
        for line in body.splitlines():
            text = line.strip()
            assert text.count('"') % 2 == 0, f"unbalanced quote: {text}"
            if body.lstrip().startswith("flowchart"):
                for a, b in ("[]", "()", "{}"):
                    assert text.count(a) == text.count(b), f"unbalanced {a}{b}: {text}"
            else:
                assert ";" not in text, f"';' ends a statement in Mermaid: {text}"
    states = "\n".join(b for b in blocks if b.lstrip().startswith("stateDiagram"))
    for status in ("scheduled", "queued", "dispatching", "delivered", "retrying", "failed", "dead_lettered",
                   "cancelled"):
        assert status in states

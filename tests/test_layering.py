"""The import contract between the rooms, read from the source (docs/architecture.md, "Rooms").

Every import counts: top-level, inside functions (lazy), under TYPE_CHECKING, and
`importlib.import_module("...")` with a literal name. A failure names the file, the line
and the forbidden import.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Callable, Iterator
from typing import NamedTuple

import pytest
from product_tree import SourceFile, product_files

CORE = "kvbudget.daemon.core"
LOG = "kvbudget.daemon.log"
CONFIG = "kvbudget.daemon.config"
WIRE = "kvbudget.daemon.wire"
SERVER = "kvbudget.daemon.server"
CLI = "kvbudget.cli"
TUI = "kvbudget.tui"
CLIENT = "kvbudget.client"
VLLM = "kvbudget.vllm"
TRACES = "kvbudget.traces"


class Import(NamedTuple):
    line: int
    names: tuple[str, ...]  # what the statement may load: `from a import b` is a, or a.b if b is a module


def within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def resolve(source: SourceFile, level: int, module: str | None) -> str:
    """The absolute name of a relative import (`from ..log import x` in kvbudget.daemon.core.a)."""
    if level == 0:
        return module or ""
    parts = source.module.split(".")
    base = parts if source.is_package else parts[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join([*base, module] if module else base)


def imports(source: SourceFile, text: str | None = None) -> Iterator[Import]:
    """The imports of a file (or of `text`, read as if it were that file)."""
    if text is None:
        text = source.path.read_text(encoding="utf-8")
    tree = ast.parse(text, filename=str(source.path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(node.lineno, (alias.name,))
        elif isinstance(node, ast.ImportFrom):
            base = resolve(source, node.level, node.module)
            for alias in node.names:
                yield Import(node.lineno, (base, f"{base}.{alias.name}"))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield Import(node.lineno, (node.args[0].value,))


def stdlib(name: str) -> bool:
    return name.split(".")[0] in sys.stdlib_module_names


class Rule(NamedTuple):
    id: str  # the test's id
    says: str
    applies: Callable[[str], bool]  # to a file, by its import name
    refuses: Callable[[Import], str | None]  # the forbidden name, or None


def forbidding(*packages: str) -> Callable[[Import], str | None]:
    def refuses(found: Import) -> str | None:
        return next((n for n in found.names for p in packages if within(n, p)), None)

    return refuses


def core_allows(found: Import) -> str | None:
    """Only the standard library and the core itself; `from kvbudget.daemon.core import x`
    is fine, so one allowed name of the statement is enough."""
    if any(stdlib(n) or within(n, CORE) for n in found.names):
        return None
    return found.names[0]


def server_importers_allowed(module: str) -> bool:
    return module == f"{CLI}.cmd_daemon" or within(module, SERVER)


RULES = [
    Rule(
        "core-stdlib-only",
        "the core imports only the standard library and the core",
        lambda m: within(m, CORE),
        core_allows,
    ),
    Rule(
        "log-not-server-cli-tui",
        "the log imports no server, cli or dashboard",
        lambda m: within(m, LOG),
        forbidding(SERVER, CLI, TUI),
    ),
    Rule(
        "tui-not-server-cli",
        "the dashboard imports no server or cli",
        lambda m: within(m, TUI),
        forbidding(SERVER, CLI),
    ),
    Rule(
        "client-not-server-cli",
        "the client imports no server or cli",
        lambda m: within(m, CLIENT),
        forbidding(SERVER, CLI),
    ),
    Rule(
        "vllm-adapter-through-the-client",
        "the vLLM adapter imports the client (and what the client uses), no other room of the daemon",
        lambda m: within(m, VLLM),
        forbidding(SERVER, CLI, TUI, LOG, CONFIG, TRACES),
    ),
    Rule(
        "server-only-from-cmd-daemon",
        "only the daemon command imports the server",
        lambda m: not server_importers_allowed(m),
        forbidding(SERVER),
    ),
    Rule(
        "config-not-server-cli-tui",
        "config imports no server, cli or dashboard",
        lambda m: within(m, CONFIG),
        forbidding(SERVER, CLI, TUI),
    ),
    Rule(
        "wire-not-server-cli-tui",
        "wire imports no server, cli or dashboard",
        lambda m: within(m, WIRE),
        forbidding(SERVER, CLI, TUI),
    ),
]

SOURCES = list(product_files())


def violations(rule: Rule) -> list[str]:
    found: list[str] = []
    for source in SOURCES:
        if not rule.applies(source.module):
            continue
        for imported in imports(source):
            name = rule.refuses(imported)
            line = f"{source.shown}:{imported.line}: imports {name}"
            if name is not None and line not in found:  # `from a import b, c`: one line
                found.append(line)
    return found


@pytest.mark.parametrize("rule", RULES, ids=[r.id for r in RULES])
def test_the_rooms_keep_their_imports(rule: Rule):
    assert any(rule.applies(s.module) for s in SOURCES), f"no file falls under: {rule.says}"
    found = violations(rule)
    if found:
        pytest.fail(f"{rule.says}; broken by:\n" + "\n".join(found), pytrace=False)


def test_the_files_map_to_their_import_names():
    """The mapping the rules rest on: folders to import names through pyproject."""
    names = {s.shown: s.module for s in SOURCES}
    assert names["daemon/core/step.py"] == "kvbudget.daemon.core.step"
    assert names["daemon/server/__init__.py"] == SERVER
    assert names["kvbudget/cli/cmd_daemon.py"] == f"{CLI}.cmd_daemon"
    assert names["tui/app.py"] == "kvbudget.tui.app"


def test_the_checker_sees_lazy_relative_and_importlib_imports():
    """The reader itself: an import inside a function, a relative one and an importlib one
    all count, so a lazy import cannot slip past the rules."""
    source = next(s for s in SOURCES if s.module == "kvbudget.daemon.core.step")
    text = (
        "def f():\n"
        "    from ..server import lifecycle\n"
        "    import importlib\n"
        "    importlib.import_module('kvbudget.cli.main')\n"
    )
    found = list(imports(source, text))
    assert found[0] == Import(2, (SERVER, f"{SERVER}.lifecycle"))
    assert Import(4, ("kvbudget.cli.main",)) in found
    assert core_allows(found[0]) == SERVER
    assert core_allows(Import(1, ("dataclasses",))) is None
    assert core_allows(Import(1, (CORE, f"{CORE}.pool"))) is None

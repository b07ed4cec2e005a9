"""The package's import graph, read from the source (no module is imported): no circles, and the layers of
docs/architecture.md ("Data flows one way": sources -> tracking -> evaluators/crossover -> Snapshot -> export;
only the composition root imports across layers; the mixin imports only the catalog and the defaults).

Every import counts: top-level, inside a function, under `if TYPE_CHECKING:`. Relative imports are resolved,
`from pkg import name` counts as importing `pkg.name` where that is a submodule, and importing `a.b.c` also
imports the packages `a.b` and `a` (their `__init__` runs first).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("specwatch", "testbed")

# Modules every layer may import: the exported-metric catalog, the Snapshot value types, the frozen config and
# its defaults, pure statistics, and the package root (its version). They import only each other.
FOUNDATION = (
    "specwatch",
    "specwatch.catalog",
    "specwatch.snapshot",
    "specwatch.config",
    "specwatch.config_schema",  # each option's field, default and YAML name, where that table is its own module
    "specwatch.config_warnings",  # what check-config warns about in a valid config
    "specwatch.secret_files",  # secret files read with a cap, on change only; what config and sources share
    "specwatch.engine_kinds",  # the engine names a route's `engine:` may take, keyed by the source registry
    "specwatch.stats",
)
# The composition root: wires the layers together, so it may import any of them.
COMPOSITION = ("specwatch.__main__", "specwatch.cli", "specwatch.commands", "specwatch.daemon", "specwatch.scheduler")
# Every other part of the package, and the other layers it may import besides the foundation and itself.
LAYERS: dict[str, set[str]] = {
    "specwatch.sources": set(),
    "specwatch.probe": {"specwatch.sources"},  # canary rounds talk to the engine the route's source reads
    "specwatch.tracking": set(),
    "specwatch.crossover": set(),
    "specwatch.state": set(),  # the daemon's SQLite state (baselines, fingerprints, operator commands)
    "specwatch.evaluators": {
        "specwatch.sources",
        "specwatch.probe",
        "specwatch.tracking",
        "specwatch.crossover",
        "specwatch.state",
    },
    "specwatch.export": set(),  # reads the Snapshot only
    "specwatch.scrape_pool": set(),  # the daemon's scrape executor
    "specwatch.systemd_notify": set(),
    "specwatch.logsetup": set(),  # the CLI's log level and format
    # Offline tools (replay, backtest, sweep, the simulated engines): they rerun the daemon's layers on recorded
    # or simulated data, and nothing on the daemon's path imports them.
    "specwatch.offline": {
        "specwatch.sources",
        "specwatch.tracking",
        "specwatch.evaluators",
        "specwatch.crossover",
        "specwatch.state",
    },
    "specwatch.simulator": {"specwatch.crossover"},
    # Gateway plugins (LiteLLM) and engine config writers: they run inside another program and read the
    # daemon only over HTTP, so they take the foundation alone, and nothing on the daemon's path imports them.
    "specwatch.integrations": set(),
}
# The mixin generates alerts and dashboards offline: the catalog and the defaults (config) only.
MIXIN = "specwatch.mixin"
MIXIN_MAY_IMPORT = ("specwatch.catalog", "specwatch.config", "specwatch.config_schema")
# Imports that break the rules above today, each with the reason it stays. Keep this list short.
ALLOWED_EXCEPTIONS = {
    # The config validates a route's probe prompt set at load time, so that a bad prompt file is reported
    # with every other config error; probe/prompts.py is a leaf (json and PyYAML only).
    ("specwatch.config", "specwatch.probe.prompts"),
    # The probe package itself is not imported by config; its __init__ runs because prompts is inside it.
    ("specwatch.config", "specwatch.probe"),
    # `specwatch demo --real` runs the checkout-only testbed; see commands/demo.py testbed_checkout().
    ("specwatch.commands.demo", "testbed.engine_env"),
    ("specwatch.commands.demo", "testbed.real_demo"),
    ("specwatch.commands.demo", "testbed.llamacpp_demo"),
    ("specwatch.commands.demo", "testbed.vllm_server"),
    ("specwatch.commands.demo", "testbed"),
}


def _modules(root: Path) -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package) for every module of PACKAGES."""
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            if is_package:
                parts.pop()
            found[".".join(parts)] = (path, is_package)
    return found


def _imported_names(module: str, is_package: bool, node: ast.Import | ast.ImportFrom, known: dict) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        package = package[: len(package) - (node.level - 1)]
        base = ".".join(package + ([base] if base else []))
    names = [base]
    for alias in node.names:
        if f"{base}.{alias.name}" in known:
            names.append(f"{base}.{alias.name}")  # a submodule
    return names


@functools.lru_cache(maxsize=None)  # read once for both tests
def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module -> the modules of PACKAGES it imports (ancestors of the target included, its own excluded)."""
    known = _modules(root)
    graph: dict[str, set[str]] = {}
    for module, (path, is_package) in known.items():
        own_ancestors = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)}
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for name in _imported_names(module, is_package, node, known):
                parts = name.split(".")
                for i in range(1, len(parts) + 1):
                    target = ".".join(parts[:i])
                    if target in known and target != module and target not in own_ancestors:
                        targets.add(target)
        graph[module] = targets
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each strongly connected component of more than one module (Tarjan), with one circle through it."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_circle(graph, component) for component in components]


def _circle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """A shortest circle from the component's first module back to itself, inside the component."""
    start, members = component[0], set(component)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        following = []
        for v in frontier:
            for w in sorted(graph[v] & members):
                if w == start:
                    return [*paths[v], start]
                if w not in paths:
                    paths[w] = [*paths[v], w]
                    following.append(w)
        frontier = following
    return component


def _part(module: str) -> str | None:
    """The foundation module, composition entry or layer that `module` belongs to."""
    for name in (*FOUNDATION, *COMPOSITION, *LAYERS, MIXIN):
        if module == name or module.startswith(name + ".") and name != "specwatch":  # the root: its __init__ only
            return name
    return None


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    problems = []
    for module in sorted(graph):
        if module.split(".")[0] != "specwatch":
            continue
        part = _part(module)
        if part is None:
            problems.append(f"{module}: in no layer; add it to FOUNDATION, COMPOSITION or LAYERS in this test")
            continue
        for target in sorted(graph[module]):
            if (module, target) in ALLOWED_EXCEPTIONS:
                continue
            if target.split(".")[0] != "specwatch":
                problems.append(f"{module} imports {target}: the package must not import the checkout-only testbed")
                continue
            target_part = _part(target)
            if target_part == part or part in COMPOSITION:
                continue
            if part == MIXIN:
                if target_part != MIXIN and target not in MIXIN_MAY_IMPORT and target != "specwatch":
                    problems.append(f"{module} imports {target}: the mixin imports only the catalog and config")
            elif part in FOUNDATION:
                if target_part not in FOUNDATION:
                    problems.append(f"{module} imports {target}: a foundation module imports only the foundation")
            elif target_part not in FOUNDATION and target_part not in LAYERS[part]:
                problems.append(
                    f"{module} imports {target}: {part} may import only the foundation"
                    + (f" and {', '.join(sorted(LAYERS[part]))}" if LAYERS[part] else "")
                )
    return problems


def test_the_import_graph_sees_every_kind_of_import(tmp_path):
    pkg = tmp_path / "specwatch"
    (pkg / "sub").mkdir(parents=True)
    (tmp_path / "testbed").mkdir()
    files = {
        "__init__.py": "",
        "a.py": "from specwatch.sub import b\n",
        "sub/__init__.py": "",
        "sub/b.py": "def f():\n    from . import c\n",
        "sub/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..a import thing\n",
        "d.py": "import specwatch.sub.b as bee\n",
    }
    for name, text in files.items():
        (pkg / name).write_text(text)
    graph = import_graph(tmp_path)
    assert graph["specwatch.a"] == {"specwatch.sub", "specwatch.sub.b"}
    assert graph["specwatch.sub.b"] == {"specwatch.sub.c"}
    assert graph["specwatch.sub.c"] == {"specwatch.a"}
    assert graph["specwatch.d"] == {"specwatch.sub", "specwatch.sub.b"}
    assert find_cycles(graph) == [["specwatch.a", "specwatch.sub.b", "specwatch.sub.c", "specwatch.a"]]


def test_no_import_circles():
    cycles = find_cycles(import_graph())
    assert not cycles, "import circles (a type both sides need belongs in a module that imports neither):\n" + (
        "\n".join(" -> ".join(cycle) for cycle in cycles)
    )


def test_imports_follow_the_layers():
    problems = layer_violations(import_graph())
    assert not problems, "imports across layers:\n" + "\n".join(problems)

"""tandem's import graph, read from the source (ast: nothing is imported). Imports point down the layers,
fabfile -> benchmarks -> train, with no cycle between modules (an import inside a function counts, one under
`if TYPE_CHECKING:` does not); train/agent, which runs on the hosts, imports nothing else of tandem; tests
use modules' public names only; and nothing edits the module search path: tandem is an installed package
(make setup). (Not one `sys` + `.path` in this file either: issue 23 greps for it.)"""

from __future__ import annotations

import ast
import re
from collections import deque
from dataclasses import dataclass
from functools import cache
from pathlib import Path

TOP = Path(__file__).resolve().parents[2]
OWN = ("train", "benchmarks", "lab", "fabfile")  # tandem's top-level modules
GRAPH = ("train", "benchmarks", "fabfile")  # whose imports must not go round in a circle
LAYERS = {"train": ("benchmarks", "fabfile"), "benchmarks": ("fabfile",)}  # what each may not import
# Packages inside train/, each with the packages above it that it may not reach, by an import of its own or
# through any chain of them: what a run is (train.recipe: the model's size, the communication strategies,
# the presets, the run record, the fairseq log's format) sits below everything that plans, starts, reports
# or watches one; datasets (train.data) are made and spread without a run; a run is planned (train.plan:
# the batch, the prediction) without anything that reads, watches or starts one. Above them run -> watch ->
# report, by design: a run's report (train.report: its files read, its series and answers, the page) is made
# without the code that watches or starts runs (`fab report` asks the hosts through train.run and hands the
# report what they said); `fab watch` (train.watch) shows the report's analysis live, on the hosts' lines,
# without the code that starts a run; `fab train` (train.run) follows its run with watch's host lines. Those
# two use the report's analysis only, never its page (REPORT_PAGE: the plots, the HTML, the collection).
REPORT_PAGE = ("train.report.page", "train.report.plots", "train.report.collect")
TRAIN_LAYERS = {"train.recipe": ("train.run", "train.plan", "train.report", "train.watch", "train.data",
                                 "train.agent"),
                "train.data": ("train.run",),
                "train.plan": ("train.run", "train.report", "train.watch"),
                "train.report": ("train.run", "train.watch"),
                "train.watch": ("train.run", *REPORT_PAGE),
                "train.run": REPORT_PAGE}
# Around them: the controller's reach into its hosts (train.hosts: paths, the agent's command lines, copies
# host to host) sits below everything; what provisioning runs on the controller (train.provision) and
# `fab init` (train.onboard) use no run, watch or report; the CLI every task shares (train.cli: the
# executor, the options' declarations) is the top of train/, reached from fabfile and benchmarks only.
ABOVE_ALL = ("train.cli",)
TRAIN_LAYERS = {**{package: (*above, *ABOVE_ALL) for package, above in TRAIN_LAYERS.items()},
                "train.hosts": ("train.recipe", "train.data", "train.plan", "train.report", "train.watch",
                                "train.run", "train.onboard", "train.provision", *ABOVE_ALL),
                "train.provision": ("train.data", "train.plan", "train.report", "train.watch", "train.run",
                                    "train.onboard", *ABOVE_ALL),
                "train.onboard": ("train.report", "train.watch", "train.provision", *ABOVE_ALL)}
AGENT = "train.agent"  # runs on the hosts: with train/__init__, the only tandem code there (roles/train_env)
# Tests import no `_name` of any tandem module, nor reach one by attribute
# (`fabfile._pick_run(...)`, `plots._x`, `monkeypatch.setattr("fabfile._x", ...)`).
NO_PRIVATE_ATTRIBUTES = OWN


@dataclass(frozen=True)
class Import:
    path: Path
    line: int
    module: str  # the tandem module the statement loads ("train.run.command"), "" when it names none
    wanted: str  # what the statement names, absolute ("train.run.command.ENV_FILE", "train.plan.link")
    name: str  # the name it binds or takes ("ENV_FILE"; "train" for `import train.run`)

    def where(self) -> str:
        return f"{self.path.relative_to(TOP)}:{self.line}"


def _files(*roots: str) -> list[Path]:
    found = []
    for root in roots:
        path = TOP / root
        found += [path] if path.suffix == ".py" else sorted(p for p in path.rglob("*.py")
                                                            if "__pycache__" not in p.parts)
    return found


def _module_name(path: Path) -> str:
    parts = path.relative_to(TOP).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def modules() -> dict[str, Path]:
    return {_module_name(p): p for p in _files("train", "benchmarks", "lab", "fabfile.py")}


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def _own(dotted: str) -> bool:
    return dotted.split(".")[0] in OWN


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _statements(node: ast.AST):
    """Every import statement, at any depth, but for the body of `if TYPE_CHECKING:` (never run)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for other in child.orelse:
                yield from _statements(other)
            continue
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child
        yield from _statements(child)


def _loaded(dotted: str) -> str:
    """The module an import of `dotted` loads: itself if it is one, else the module it is a name of."""
    known = modules()
    while dotted and dotted not in known:
        dotted = dotted.rpartition(".")[0]
    return dotted


def imports(path: Path) -> list[Import]:
    """The imports of tandem's own modules in one file, relative ones made absolute."""
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    found = []
    for node in _statements(_tree(path)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _own(alias.name):
                    name = alias.asname or alias.name.split(".")[0]
                    found.append(Import(path, node.lineno, _loaded(alias.name), alias.name, name))
            continue
        base = node.module or ""
        if node.level:
            anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join([*anchor, *([node.module] if node.module else [])])
        if not _own(base):
            continue
        for alias in node.names:
            wanted = f"{base}.{alias.name}"
            module = wanted if wanted in modules() else _loaded(base)
            found.append(Import(path, node.lineno, module if module.startswith(base) else "", wanted, alias.name))
    return found


def _graph() -> dict[str, dict[str, Import]]:
    """module -> {module it imports: the first statement that does}, for the modules in GRAPH."""
    graph = {}
    for name, path in modules().items():
        if name.split(".")[0] not in GRAPH:
            continue
        edges = graph.setdefault(name, {})
        for imp in imports(path):
            if imp.module and imp.module != name and imp.module.split(".")[0] in GRAPH:
                edges.setdefault(imp.module, imp)
    return graph


def _cycles(graph: dict[str, dict[str, Import]]) -> list[list[str]]:
    """One shortest cycle through each strongly connected group of modules (Tarjan, then a search)."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            connect(v)
    cycles = []
    for group in groups:
        start = min(group)
        came_from, todo = {start: ""}, deque([start])
        while todo:
            v = todo.popleft()
            for w in sorted(graph[v]):
                if w == start:
                    path = [v]
                    while came_from[path[-1]]:
                        path.append(came_from[path[-1]])
                    cycles.append([*reversed(path), start])
                    todo.clear()
                    break
                if w in group and w not in came_from:
                    came_from[w] = v
                    todo.append(w)
    return sorted(cycles)


def test_no_import_cycle():
    graph = _graph()
    assert len(graph) > 50, sorted(graph)  # the walk found tandem's modules
    cycles = _cycles(graph)
    report = [" -> ".join(c) + "\n" + "\n".join(f"    {graph[a][b].where()}: {a} imports {graph[a][b].wanted}"
                                                   for a, b in zip(c, c[1:], strict=False)) for c in cycles]
    assert not cycles, "modules that import each other, round in a circle:\n" + "\n".join(report)


def test_imports_point_down():
    """fabfile -> benchmarks -> train: train imports neither benchmarks nor fabfile, benchmarks not fabfile."""
    wrong = [f"{imp.where()}: {name} imports {imp.wanted}"
             for name, path in modules().items() if name.split(".")[0] in LAYERS
             for imp in imports(path) if imp.wanted.split(".")[0] in LAYERS[name.split(".")[0]]]
    assert not wrong, "imports that point up a layer:\n" + "\n".join(wrong)


def _inside(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def layer_breaches(layers: dict[str, tuple[str, ...]]) -> list[str]:
    """For each package and each package it may not import: the shortest chain of imports by which one of
    its modules reaches one of the other's anyway (directly, or through any modules between), each link
    with the statement that makes it. One chain a pair: the first to fix."""
    graph, found = _graph(), []
    for package, above in layers.items():
        for up in above:
            starts = sorted(m for m in graph if _inside(m, (package,)))
            came_from, todo = dict.fromkeys(starts, ""), deque(starts)
            while todo:
                v = todo.popleft()
                if _inside(v, (up,)):
                    chain = [v]
                    while came_from[chain[-1]]:
                        chain.append(came_from[chain[-1]])
                    chain.reverse()
                    found.append(f"{package} reaches {up}: " + " -> ".join(chain) + "\n" + "\n".join(
                        f"    {graph[a][b].where()}: {a} imports {graph[a][b].wanted}"
                        for a, b in zip(chain, chain[1:], strict=False)))
                    break
                for w in sorted(graph[v]):
                    if w not in came_from:
                        came_from[w] = v
                        todo.append(w)
    return found


def test_packages_inside_train_import_down():
    """No package inside train/ reaches one it may not import (TRAIN_LAYERS), directly or through any chain
    of imports: train.recipe nothing of the packages above it (no arrow back up, so no circle through it);
    train.data nothing of train.run; train.plan nothing of train.run, report or watch; train.report nothing
    of train.watch or train.run; train.watch nothing of train.run; neither the report's page."""
    assert {"train.recipe.presets", "train.recipe.record", "train.recipe.logformat", "train.data.distribute",
            "train.run.session"} <= set(modules())  # the walk found the packages the rules name
    assert any(name.startswith("train.recipe.strategies.") for name in modules())
    wrong = layer_breaches(TRAIN_LAYERS)
    assert not wrong, "imports that lead up a layer inside train/:\n" + "\n".join(wrong)


def test_agent_imports_nothing_else_of_tandem():
    """train/agent runs on the hosts, where provisioning copies train/__init__.py and train/agent only."""
    host_side = {name: path for name, path in modules().items() if name in ("train", AGENT) or
                 name.startswith(AGENT + ".")}
    assert len(host_side) > 5, sorted(host_side)
    wrong = [f"{imp.where()}: {name} imports {imp.wanted}" for name, path in host_side.items()
             for imp in imports(path) if not (imp.wanted == AGENT or imp.wanted.startswith(AGENT + "."))]
    assert not wrong, "host-side code importing what the hosts do not have:\n" + "\n".join(wrong)


def test_imports_name_modules_that_exist():
    """An import of tandem names a module tandem has (a moved module leaves none stale behind)."""
    wrong = [f"{imp.where()}: {imp.wanted}" for path in _files("train", "benchmarks", "lab", "fabfile.py", "tests")
             for imp in imports(path) if not imp.module]
    assert not wrong, "imports of tandem modules that do not exist:\n" + "\n".join(wrong)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _dotted(node: ast.expr) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else ""


def private_uses(path: Path, attributes_of: tuple[str, ...] = NO_PRIVATE_ATTRIBUTES) -> list[str]:
    """Where a file reaches into another tandem module's private names: imports `_x` from it, or, for the
    modules under `attributes_of`, reads `module._x` or patches it by name (`setattr(module, "_x", ...)`,
    `monkeypatch.setattr("fabfile._x", ...)`)."""
    bound, found = {}, []  # name in the file -> the tandem module it is
    for imp in imports(path):
        if any(_private(part) for part in imp.wanted.split(".")):
            found.append(f"{imp.where()}: imports {imp.wanted}")
        if imp.module == imp.wanted or imp.wanted.startswith(imp.name + "."):
            bound[imp.name] = imp.module if imp.module == imp.wanted else imp.name

    def resolved(dotted: str) -> str:
        """The module `dotted` is in this file, if it is one of those NO_PRIVATE_ATTRIBUTES names."""
        head, _, rest = dotted.partition(".")
        module = ".".join(p for p in (bound[head], rest) if p) if head in bound else ""
        return module if module in modules() and module.split(".")[0] in attributes_of else ""

    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Attribute) and _private(node.attr) and resolved(_dotted(node.value)):
            found.append(f"{path.relative_to(TOP)}:{node.lineno}: {_dotted(node)}")
        elif isinstance(node, ast.Call) and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and \
                isinstance(node.args[1].value, str) and _private(node.args[1].value) and \
                resolved(_dotted(node.args[0])):
            found.append(f"{path.relative_to(TOP)}:{node.lineno}: {_dotted(node.args[0])}.{node.args[1].value} by name")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                re.fullmatch(r"[\w.]+\._\w+", node.value) and _own(node.value) and \
                _private(node.value.rpartition(".")[2]) and node.value.rpartition(".")[0] in modules() and \
                node.value.split(".")[0] in attributes_of:
            found.append(f"{path.relative_to(TOP)}:{node.lineno}: {node.value!r}")
    return sorted(set(found), key=lambda use: int(use.split(":")[1]))


def test_tests_use_public_names_only():
    """A test asserts what a user would notice: through a module's public names, never its `_helpers`."""
    wrong = [use for path in _files("tests") if path != Path(__file__).resolve() for use in private_uses(path)]
    assert not wrong, "tests that use a tandem module's private names:\n" + "\n".join(wrong)


def test_modules_use_each_others_public_names_only():
    """Within tandem too, a module's `_names` are its own: another one neither imports nor calls them
    (`link._failed(r)` from benchmarks: make it public where it is shared)."""
    wrong = [use for name, path in modules().items() if name.split(".")[0] in GRAPH
             for use in private_uses(path, OWN)]
    assert not wrong, "modules that use another module's private names:\n" + "\n".join(wrong)


def search_path_uses(path: Path) -> list[str]:
    """The module search path of `sys` (read or edited), `from sys import path`, `site.addsitedir(...)`."""
    tree, found = _tree(path), []
    sys_names = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
                 if a.name == "sys"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name) and \
                node.value.id in sys_names:
            found.append(f"{path.relative_to(TOP)}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.ImportFrom) and node.module == "sys" and any(a.name == "path" for a in node.names):
            found.append(f"{path.relative_to(TOP)}:{node.lineno}: from sys import path")
        elif isinstance(node, ast.Attribute) and node.attr == "addsitedir":
            found.append(f"{path.relative_to(TOP)}:{node.lineno}: site.addsitedir")
    return found


def test_nothing_edits_the_module_search_path():
    """tandem is installed (make setup: editable, in the checkout's .venv): code imports it, never finds it."""
    files = _files("lab", "train", "benchmarks", "roles", "fabfile.py", "tests")
    assert any(p.parts[-3:-1] == ("network", "filter_plugins") for p in files)
    wrong = [use for path in files for use in search_path_uses(path)]
    assert not wrong, "the module search path in tandem's code:\n" + "\n".join(wrong)


def test_the_checks_see_what_they_look_for(tmp_path, monkeypatch):
    """The checks above on made-up files: a cycle, a private name, a search path edit, a package that reaches
    one above it through another are each found."""
    for rel, text in {"train/__init__.py": "", "train/a.py": "def f():\n    from . import b\n",
                      "train/b.py": "from train.a import f\nfrom typing import TYPE_CHECKING\n"
                                    "if TYPE_CHECKING:\n    from train import c\n",
                      "train/c.py": "import train.b\n", "fabfile.py": "def _pick(): pass\n",
                      "tests/t.py": "import fabfile\nfrom train.a import _g\nfabfile._pick()\n"
                                    "def test(monkeypatch):\n    monkeypatch.setattr('fabfile._pick', None)\n",
                      "roles/r/filter_plugins/p.py": "import sys\nsys." "path.insert(0, '.')\n",
                      "train/run/follow.py": "from ..watch import lines\n",
                      "train/watch/lines.py": "from . import screen\n",
                      "train/watch/screen.py": "from train.report.answers import x\n",
                      "train/report/answers.py": "x = 1\n"}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    monkeypatch.setattr(f"{__name__}.TOP", tmp_path)
    modules.cache_clear()
    try:
        assert _cycles(_graph()) == [["train.a", "train.b", "train.a"]]  # c -> b is one way; b -> c is type-only
        assert [u.split(": ", 1)[1] for u in private_uses(tmp_path / "tests/t.py")] == [
            "imports train.a._g", "fabfile._pick", "'fabfile._pick'"]
        assert [u.rsplit(": ", 1)[0] for u in search_path_uses(tmp_path / "roles/r/filter_plugins/p.py")] == [
            "roles/r/filter_plugins/p.py:2"]
        breaches = layer_breaches({"train.run": ("train.report",), "train.watch": ("train.run",)})
        assert [b.splitlines() for b in breaches] == [[  # run reaches report through watch; watch never reaches run
            "train.run reaches train.report: train.run.follow -> train.watch.lines -> train.watch.screen -> "
            "train.report.answers",
            "    train/run/follow.py:1: train.run.follow imports train.watch.lines",
            "    train/watch/lines.py:1: train.watch.lines imports train.watch.screen",
            "    train/watch/screen.py:1: train.watch.screen imports train.report.answers.x"]]
    finally:
        modules.cache_clear()

"""How the package's modules import one another: no cycles, no imports by name, a light command line.

* Every module imports when it is the first module of the package imported (a cycle shows there as an
  ImportError or AttributeError on a partially initialised module): one interpreter imports each module
  after dropping every ``diskflow`` module from ``sys.modules``, so third-party imports (torch) are paid once.
* The module-level imports form no cycle (a static graph, from the source). Only module-level imports count,
  those of ``if TYPE_CHECKING:`` blocks excepted: an import inside a function runs when the function is
  called, after the modules it names have finished initialising, and is how a module reaches one that
  imports it (`flow.pipeline` -> `flow.runtimes`, `diskflow.__getattr__` -> the public modules).
* No module imports by a name held in a string (``importlib.import_module``, ``__import__``, loading a file)
  but the few that load what the user names (`ALLOWED_IMPORTS_BY_NAME`), so every other import path is one
  a reader and a static tool can follow.
* Every module states its public names (``__all__``), names only what it binds, and lists every name the
  package's other modules import from it; no module imports another's private (underscored) name.
* ``diskflow --help`` and ``diskflow bench --help`` import no benchmark, no torch and no Dask (the defaults
  the help shows come from modules that need neither).

The top-level folders are the subpackages setup.py maps them to (``flow/x.py`` is ``diskflow.flow.x``).
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("flow", "operators", "native", "cli", "pipelines", "bench")     # setup.py's PACKAGES, as diskflow.<folder>
NOT_IMPORTED = {"diskflow.__main__"}          # `python -m diskflow` runs the command line when imported
# (module, the function or method in it) -> why it imports by name; nothing else in the package may
ALLOWED_IMPORTS_BY_NAME = {
    ("diskflow.flow.pipeline", "_import_builtin"): "a built-in pipeline by the name the user gave",
    ("diskflow.operators.formats.userfile", "import_user_file"): "a user's pipeline or model file",
    ("diskflow.operators.prepare.policies", "FilePolicy.function"): "a user's tier policy file, on a Dask worker",
}
BY_NAME = {"import_module", "__import__", "spec_from_file_location", "exec_module", "run_module", "run_path"}


def package_modules(root: Path = ROOT, package: str = "diskflow", folders: tuple[str, ...] = FOLDERS,
                    suffix: str = ".py") -> dict[str, Path]:
    """Module name -> source file: `root`/`package`/*.py and every module of the mapped top-level folders
    (with `suffix` ``.pyi``: the stubs, which stand for the compiled modules)."""
    found: dict[str, Path] = {}
    for path in sorted((root / package).glob(f"*{suffix}")):
        found[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    for folder in folders:
        for path in sorted((root / folder).rglob(f"*{suffix}")):
            parts = [package, *path.relative_to(root).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


@dataclass(frozen=True)
class Import:
    """One name an import statement binds: `module` (resolved), `name` (None for ``import module``), line."""

    module: str
    name: str | None
    line: int


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _module_level(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements that run when a module is imported: its body, its classes' bodies and the blocks
    of its if, try, with and loop statements; not functions, not ``if TYPE_CHECKING:`` blocks."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from _module_level(node.body)
            yield from _module_level(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, *(h.body for h in node.handlers), node.orelse, node.finalbody):
                yield from _module_level(block)
        elif isinstance(node, (ast.With, ast.For, ast.While, ast.ClassDef)):
            yield from _module_level(node.body)
            yield from _module_level(getattr(node, "orelse", []))


def _imports(module: str, nodes: Iterable[ast.AST], modules: dict[str, Path]) -> Iterator[Import]:
    """What `nodes` (import statements of `module`) import, relative imports resolved."""
    is_package = modules[module].name == "__init__.py"
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(alias.name, None, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            for alias in node.names:
                yield Import(source, alias.name, node.lineno)


def compiled_modules(root: Path = ROOT) -> set[str]:
    """The compiled modules (``diskflow.native._native``): the stubs of no source module."""
    return set(package_modules(root, suffix=".pyi")) - set(package_modules(root))


def import_graph(modules: dict[str, Path], compiled: set[str] | None = None) -> dict[str, dict[str, int]]:
    """module -> {module it needs initialised when it is imported: the line of the import}; `compiled`: the
    compiled modules, which import none of the package's.

    ``import a.b`` and ``from a import b`` (b a module) need ``a.b`` and the packages above it, but for the
    importer's own packages, which are being initialised already; ``from a import name`` (not a module) needs
    ``a`` initialised, even when it is the importer's own package."""
    known = set(modules) | (compiled or set())
    graph: dict[str, dict[str, int]] = {}
    for module, path in modules.items():
        edges: dict[str, int] = {}
        for imp in _imports(module, _module_level(ast.parse(path.read_text(), str(path)).body), modules):
            target = f"{imp.module}.{imp.name}" if imp.name and f"{imp.module}.{imp.name}" in known else imp.module
            parts = target.split(".")
            for i in range(1, len(parts) + 1):
                needed = ".".join(parts[:i])
                if needed not in known or needed == module:
                    continue
                if module.startswith(needed + ".") and not (needed == imp.module == target and imp.name):
                    continue        # a package above the importer, not read for a name
                edges.setdefault(needed, imp.line)
        graph[module] = edges
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (or a module importing itself), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:                      # Tarjan's algorithm; the graph is small and shallow
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
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
            if len(component) > 1 or v in graph.get(v, {}):
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_the_module_level_imports_form_no_cycle() -> None:
    modules = package_modules()
    assert len(modules) > 100 and "diskflow.flow.pipeline" in modules and "diskflow.bench.compare" in modules
    graph = import_graph(modules, compiled_modules())
    found = cycles(graph)
    described = [" ; ".join(f"{a} -> {b} (line {graph[a][b]})" for a in cycle for b in graph[a] if b in cycle)
                 for cycle in found]
    assert described == [], f"module-level import cycles: {described}"


def test_the_cycle_finder_sees_a_cycle(tmp_path: Path) -> None:
    """The graph as built from source: a cycle through a package's __init__ and one through a submodule."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("from .a import f\n")
    (tmp_path / "pkg" / "a.py").write_text("from . import g\n\ndef f(): ...\n")          # reads pkg's name g
    (tmp_path / "pkg" / "b.py").write_text("from .c import x\nfrom . import a\n")       # a submodule: no cycle
    (tmp_path / "pkg" / "c.py").write_text("import typing\nif typing.TYPE_CHECKING:\n    from .b import y\n"
                                           "try:\n    from .d import x\nexcept ImportError:\n    pass\n")
    (tmp_path / "pkg" / "d.py").write_text("def later():\n    from .c import z\n\nclass K:\n    from .b import w\n")
    graph = import_graph(package_modules(tmp_path, "pkg", ()))
    assert cycles(graph) == [["pkg", "pkg.a"], ["pkg.b", "pkg.c", "pkg.d"]]


# Each module is executed afresh, its package's modules first removed from sys.modules; only the compiling of each
# source file is done once (the code objects kept in memory): with PYTHONDONTWRITEBYTECODE set, as on the test
# machine, every import would compile its source again, some 200 times for the package's common modules.
_IMPORT_EACH = """
import importlib, importlib.machinery, json, sys, traceback
compiled = {}
get_code = importlib.machinery.SourceFileLoader.get_code
def get_code_once(self, fullname):
    if self.path not in compiled:
        compiled[self.path] = get_code(self, fullname)
    return compiled[self.path]
importlib.machinery.SourceFileLoader.get_code = get_code_once
failed = {}
for name in json.loads(sys.stdin.read()):
    for loaded in [m for m in sys.modules if m == "diskflow" or m.startswith("diskflow.")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception as e:
        failed[name] = "".join(traceback.format_exception_only(type(e), e)).strip()
print(json.dumps(failed))
"""


def test_every_module_imports_as_the_first_of_the_package() -> None:
    names = sorted(set(package_modules()) - NOT_IMPORTED)
    done = subprocess.run([sys.executable, "-c", _IMPORT_EACH], input=json.dumps(names), capture_output=True,
                          text=True, cwd=ROOT, timeout=240, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {}


def _calls_by_name(path: Path) -> Iterator[tuple[str, str, int]]:
    """(the enclosing function's qualified name, the call, its line) of each import by name in `path`."""
    def walk(node: ast.AST, where: str) -> Iterator[tuple[str, str, int]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                yield from walk(child, f"{where}.{child.name}" if where else child.name)
                continue
            if isinstance(child, ast.Call):
                func = child.func
                called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) \
                    else ""
                if called in BY_NAME:
                    yield where, called, child.lineno
            yield from walk(child, where)

    yield from walk(ast.parse(path.read_text(), str(path)), "")


def test_only_the_loading_of_what_the_user_names_imports_by_name() -> None:
    modules = package_modules()
    found = [(module, where, called, line) for module, path in modules.items()
             for where, called, line in _calls_by_name(path)]
    unexpected = [f"{module}:{line} {where or '(module)'}: {called}" for module, where, called, line in found
                  if (module, where) not in ALLOWED_IMPORTS_BY_NAME]
    assert unexpected == [], f"imports by name outside ALLOWED_IMPORTS_BY_NAME: {unexpected}"
    assert {(module, where) for module, where, _, _ in found} == set(ALLOWED_IMPORTS_BY_NAME)
    aliased = [f"{module}:{node.lineno}: from {node.module} import {a.name}" for module, path in modules.items()
               for node in ast.walk(ast.parse(path.read_text(), str(path)))
               if isinstance(node, ast.ImportFrom) and node.module in ("importlib", "importlib.util", "runpy", "builtins")
               for a in node.names if a.name in BY_NAME or a.name == "*"]
    assert aliased == [], f"imports by name under another name: {aliased}"


def _bound(tree: ast.Module) -> set[str]:
    """The names a module binds at module level: definitions, assignments and imports, in its body and in the
    blocks of its if, try, with and loop statements (not in functions or classes)."""
    names: set[str] = set()
    todo: list[ast.AST] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif not isinstance(node, ast.Lambda):
            todo.extend(ast.iter_child_nodes(node))
    return names


def _public_names(tree: ast.Module) -> list[str] | None:
    """The module's ``__all__`` (a literal list or tuple of strings), or None without one."""
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
                assert node.value is not None
                value = ast.literal_eval(node.value)
                assert isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)
                return list(value)
    return None


def test_every_module_states_its_public_names() -> None:
    modules = package_modules()
    compiled = compiled_modules()
    trees = {module: ast.parse(path.read_text(), str(path)) for module, path in modules.items()}
    public = {module: _public_names(tree) for module, tree in trees.items()}
    missing = sorted(m for m, names in public.items() if names is None and m not in NOT_IMPORTED)
    assert missing == [], f"modules without __all__: {missing}"
    lazy = {m for m, tree in trees.items() if "__getattr__" in _bound(tree)}     # its names bound on first use
    unbound = [f"{m}: {n}" for m, names in public.items() for n in names or []
               if n not in _bound(trees[m]) and f"{m}.{n}" not in modules and m not in lazy]
    assert unbound == [], f"__all__ names what the module does not bind: {unbound}"
    private = [f"{m}: {n}" for m, names in public.items() for n in names or [] if n.startswith("_")]
    assert private == [], f"__all__ names private names: {private}"
    unlisted, underscored = [], []
    for module, tree in trees.items():
        for imp in _imports(module, [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)], modules):
            if imp.module not in modules or imp.name is None or f"{imp.module}.{imp.name}" in {*modules, *compiled} \
                    or imp.module == module or imp.name == "*":
                continue                # a module, not a name; or not the package's
            if imp.name.startswith("_") and not imp.name.startswith("__"):
                underscored.append(f"{module}:{imp.line}: {imp.name} from {imp.module}")
            elif public[imp.module] is not None and imp.name not in public[imp.module] and not imp.name.startswith("__"):
                unlisted.append(f"{module}:{imp.line}: {imp.name} from {imp.module}")
    assert underscored == [], f"private names imported from another module: {underscored}"
    assert unlisted == [], f"names imported that their module's __all__ does not list: {unlisted}"


_LOADED_BY_PARSING = """
import json, sys
from diskflow.cli.main import main
try:
    main(json.loads(sys.argv[1]))
except SystemExit:
    pass
print(json.dumps(sorted(m for m in sys.modules if m.startswith(("diskflow.bench", "torch.", "dask.", "distributed."))
                       or m in ("torch", "dask", "distributed"))))
"""


def _loaded_by(argv: list[str]) -> list[str]:
    done = subprocess.run([sys.executable, "-c", _LOADED_BY_PARSING, json.dumps(argv)], capture_output=True,
                          text=True, cwd=ROOT, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "usage: diskflow" in done.stdout
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_command_lines_help_imports_no_benchmark_no_torch_and_no_dask() -> None:
    assert _loaded_by(["--help"]) == []
    assert _loaded_by(["bench", "--help"]) == []
    loaded = _loaded_by(["bench", "sampler", "--help"])
    assert "diskflow.bench.sampler" in loaded and not any(m.startswith(("torch", "dask", "distributed")) for m in loaded)
    others = {f"diskflow.bench.{b}" for b in ("ingest", "plan", "prepare", "reader", "stream", "compare", "scale",
                                              "pyg")}
    assert others.isdisjoint(loaded), loaded

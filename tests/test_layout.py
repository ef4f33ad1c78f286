"""The README's layout section describes the tree as it is: every stage folder of operators/, every pipeline,
every benchmark and every test folder is named there, so a newcomer finds them from the README and `ls`."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _layout() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Layout\n", 1)[1]
    return section.split("\n## ", 1)[0]


def _modules(folder: str) -> list[str]:
    return sorted(p.stem for p in (ROOT / folder).glob("*.py") if not p.name.startswith("_"))


def _folders(folder: str) -> list[str]:
    return sorted(p.name for p in (ROOT / folder).iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))


def test_the_layout_section_names_every_stage_pipeline_benchmark_and_test_folder() -> None:
    layout = _layout()
    stages = _folders("operators")
    assert stages == ["formats", "ingest", "prepare", "stream", "train"]
    missing = [f"operators/{s}/" for s in stages if f"  {s}/ " not in layout]
    missing += [f"pipelines/{p}" for p in _modules("pipelines") if p not in layout]
    helpers = {"cgroup", "child", "common", "comparetables", "harness", "naivepack", "pageload", "streamsetup",
               "taskmemory"}
    missing += [f"bench/{b}" for b in _modules("bench") if b not in helpers and b not in layout]
    missing += [f"tests/operators/{t}" for t in _folders("tests/operators") if t not in layout]
    missing += [f"tests/{t}" for t in _folders("tests") if f"tests/{t}" not in layout]
    assert missing == [], f"README.md's layout section does not mention {missing}"


INTERNAL = ("flow", "operators", "native", "pipelines")     # the floors below the public API


def _internal_imports(path: Path) -> list[str]:
    """The imports of `path` (a module of diskflow/cli) that reach an internal floor: ``..flow``,
    ``diskflow.operators...``, ``from .. import native``."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                base = node.module or ""
            elif node.level == 1:
                continue                                     # cli's own modules
            else:
                base = ".".join(["diskflow", *(["?"] * (node.level - 2)), *([node.module] if node.module else [])])
            names = [base] if node.module else [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "diskflow" and len(parts) > 1 and (parts[1] in INTERNAL or parts[1] == "?"):
                found.append(f"{path.name}:{node.lineno}: {name}")
    return found


def test_the_cli_imports_only_the_public_api() -> None:
    """The command line is the top floor: it calls `diskflow`, `diskflow.api` and the public modules beside them
    (and the benchmarks it runs), never the framework, the operators, the native engine or the pipelines."""
    modules = sorted((ROOT / "cli").glob("*.py"))
    assert modules
    found = [hit for path in modules for hit in _internal_imports(path)]
    assert found == [], f"the CLI imports internals: {found}"

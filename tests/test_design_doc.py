"""docs/design.md covers the whole house: it names every top-level package that setup.py maps into
`diskflow.*`, and its section "The preparation graph" names every task group the preparation graph builds.

Nothing here is a hard-coded list. The packages come from setup.py's mapping and from the folders that hold
an ``__init__.py``. The task groups come from graphs built here on the tiny store, in configurations that
between them make every group appear (partition batches, a historical embedding cache, a read-ahead, a disk
budget the packed bytes exceed), read the way Dask's dashboard reads them (`dask.utils.key_split` of every
key that ran); and the configurations are checked to reach every task key the preparation's modules
(`flow/graph.py`, `flow/prepare/`) write, so a group added there without a configuration here fails too.
A group counts as named when some code span of the section (`` `sample-e{e}-s{k}` ``) splits to it."""
from __future__ import annotations

import ast
import re
from dataclasses import replace
from pathlib import Path

import dask
import pytest
from dask.utils import key_split
from diskflow.flow.prepare import PrepareConfig, prepare
from diskflow.operators.formats.store import Store
from diskflow.operators.prepare.history import EMBEDDING_BYTES
from task_keys import TaskKeys

ROOT = Path(__file__).resolve().parent.parent
DESIGN = ROOT / "docs" / "design.md"
GRAPH_SECTION = "The preparation graph"
GRAPH_SOURCES = [ROOT / "flow" / "graph.py", *sorted((ROOT / "flow" / "prepare").glob("*.py"))]

BASE = {"fanouts": (4, 3), "batch_size": 200, "superbatch_size": 2, "epochs": 1, "seed": 5}
HIDDEN = 12


# ------------------------------------------------------------------------------------------- the packages

def mapped_packages() -> dict[str, str]:
    """setup.py's mapping of packages to folders (its ``PACKAGES``), evaluated from its source, not run."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "PACKAGES" for t in node.targets):
            return eval(compile(ast.Expression(node.value), "setup.py", "eval"), {"__builtins__": {}})
    raise AssertionError("setup.py defines no PACKAGES mapping")


def top_level_packages() -> list[str]:
    """The top-level folders that are packages of diskflow: those setup.py maps, and any folder holding an
    ``__init__.py`` (a package folder setup.py forgot is still one design.md must place)."""
    mapped = {folder.split("/")[0] for folder in mapped_packages().values()}
    folders = {p.parent.name for p in ROOT.glob("*/__init__.py")}
    return sorted(mapped | folders)


def unnamed_packages(text: str, packages: list[str]) -> list[str]:
    """The packages `text` does not name as a folder (`` `flow/` ``) and, but for diskflow itself, as the
    subpackage it becomes (``diskflow.flow``)."""
    return [p for p in packages
            if f"`{p}/`" not in text or (p != "diskflow" and not re.search(rf"\bdiskflow\.{p}\b", text))]


def test_the_packages_are_what_setup_py_maps() -> None:
    packages = top_level_packages()
    assert {"diskflow", "flow", "operators", "native", "cli"} <= set(packages), packages
    mapped = mapped_packages()
    assert all(mapped.get("diskflow" if p == "diskflow" else f"diskflow.{p}") == p for p in packages), \
        f"a package folder setup.py does not map as diskflow.NAME: {packages} against {mapped}"


def test_design_names_every_top_level_package() -> None:
    assert unnamed_packages(DESIGN.read_text(), top_level_packages()) == []


def test_the_package_check_sees_a_package_left_out() -> None:
    text = DESIGN.read_text()
    for p in top_level_packages():
        without = text.replace(f"`{p}/`", "`…`")
        assert unnamed_packages(without, top_level_packages()) == [p]


# ------------------------------------------------------------------------------------------- the task groups

def section(text: str, title: str) -> str:
    """The body of the ``## title`` section of `text`."""
    parts = re.split(rf"^## {re.escape(title)}\n", text, flags=re.MULTILINE)
    assert len(parts) == 2, f"docs/design.md has no section {title!r}"
    return parts[1].split("\n## ", 1)[0]


def named_groups(text: str) -> set[str]:
    """The task groups `text` names: the key group (Dask's `key_split`) of each of its code spans."""
    return {key_split(span) for span in re.findall(r"`([^`\n]+)`", text)}


def source_groups() -> set[str]:
    """The groups of every task key the preparation's modules write (``key=f"pack-r0-p{p}-{tok}"``: the
    group of what precedes the first field)."""
    found = set()
    for path in GRAPH_SOURCES:
        for prefix in re.findall(r'\bkey=f"([^"{]*)\{', path.read_text()):
            found.add(key_split(prefix))
    return found


@pytest.fixture(scope="module")
def built_groups(tiny_store: Path, tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    """The task groups that ran in prepare graphs over the tiny store: a plain belady round (Belady plans,
    traces, a read-ahead, so early packs), the same with partition batches and a historical embedding cache,
    then that round again under a disk budget its packed bytes exceed (the disk-cache search)."""
    root = tmp_path_factory.mktemp("design-doc")
    groups: set[str] = set()
    with dask.config.set(scheduler="sync"):
        with TaskKeys() as keys:
            plain = prepare(tiny_store, root / "plain", PrepareConfig(**BASE, cpu_memory=1 << 30), quiet=True)
        groups |= keys.groups()
        # a CPU tier far smaller than the rows the round reads, so that misses are packed
        cpu = int(plain.figures["staging_bytes"]) + 300 * Store(tiny_store).row_bytes
        cfg = PrepareConfig(**BASE, cpu_memory=cpu, batches="partition", partitions=12, parts_per_group=2,
                            history_memory=96 * HIDDEN * EMBEDDING_BYTES, history_dim=HIDDEN)
        with TaskKeys() as keys:
            full = prepare(tiny_store, root / "outre", cfg, quiet=True)
        groups |= keys.groups()
        assert full.figures["packed_bytes"] > 0 and full.figures["history"]["pruned"] > 0
        budget = full.figures["packed_bytes"] * 3 // 4
        with TaskKeys() as keys:
            prepare(tiny_store, root / "outre", replace(cfg, disk_budget=budget), quiet=True)
        groups |= keys.groups()
        edge_store = _edge_store(root)
        with TaskKeys() as keys:       # edge features: the edge rows' own round
            prepare(edge_store, root / "edges", PrepareConfig(**BASE, cpu_memory=1 << 30), quiet=True)
        groups |= keys.groups()
    return groups


def _edge_store(root: Path) -> Path:
    """A 300-node store whose edges carry 2 features."""
    import numpy as np
    from diskflow.flow.ingest import run_ingest
    from diskflow.operators.ingest.raw import write_raw_dataset

    rng = np.random.default_rng(0)
    n, e = 300, 2000
    raw = write_raw_dataset(root / "edge-raw", src=rng.integers(0, n, e), dst=rng.integers(0, n, e),
                            features=rng.standard_normal((n, 4)).astype(np.float32), labels=rng.integers(0, 2, n),
                            splits=np.array(["train"] * n), edge_attr=rng.standard_normal((e, 2)).astype(np.float32))
    run_ingest(raw, root / "edge-store")
    return root / "edge-store"


def test_the_graphs_built_here_reach_every_task_key_of_the_preparation(built_groups: set[str]) -> None:
    written = source_groups()
    assert len(written) >= 10, written
    assert written - built_groups == set(), \
        "task groups the preparation's code writes but no graph built here: add a configuration for them"


def test_design_names_every_task_group_of_the_preparation_graph(built_groups: set[str]) -> None:
    named = named_groups(section(DESIGN.read_text(), GRAPH_SECTION))
    assert sorted(built_groups - named) == [], f"docs/design.md, {GRAPH_SECTION!r}, leaves these groups out"


def without_group(text: str, group: str) -> str:
    """`text` with every code span of `group` left out."""
    return re.sub(r"`([^`\n]+)`", lambda m: "" if key_split(m.group(1)) == group else m.group(0), text)


def test_the_group_check_sees_a_group_left_out(built_groups: set[str]) -> None:
    text = section(DESIGN.read_text(), GRAPH_SECTION)
    for group in sorted(built_groups):
        assert built_groups - named_groups(without_group(text, group)) == {group}

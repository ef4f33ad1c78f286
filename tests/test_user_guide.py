"""The user guide's section "Your optimizer and your hooks" is real: its Python blocks run, as written and in
order, in a fresh process whose working directory holds the tiny store as `store` (a block whose first line is
``# NAME.py`` is that file, which the later blocks use), and they import only the public API."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_readme import internal_imports

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ROOT / "docs" / "user-guide.md"
SECTION = "Your optimizer and your hooks"


def section_blocks(text: str, title: str) -> list[str]:
    """The ```python blocks of the ``### title`` section (up to the next heading outside a code block)."""
    blocks: list[str] = []
    inside, fence, code = False, None, []
    for line in text.splitlines(keepends=True):
        if fence is not None:                       # in a code block: headings here are comments
            if line.rstrip() == "```":
                if fence == "python" and inside:
                    blocks.append("".join(code))
                fence, code = None, []
            else:
                code.append(line)
        elif line.startswith("```"):
            fence = line[3:].strip()
        elif re.match(r"#{1,3} ", line):
            inside = line.rstrip() == f"### {title}"
    return blocks


BLOCKS = section_blocks(GUIDE.read_text(), SECTION)


def test_the_section_shows_a_model_file_and_a_script() -> None:
    assert f"\n### {SECTION}\n" in GUIDE.read_text()
    assert len(BLOCKS) == 2 and BLOCKS[0].startswith("# sage_sgd.py\n")
    for hook in ("on_epoch", "on_batch", "on_start"):
        assert hook in BLOCKS[1]
    assert all(internal_imports(code) == [] for code in BLOCKS)


def test_the_sections_code_runs(tiny_store: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    shutil.copytree(tiny_store, work / "store")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    for i, code in enumerate(BLOCKS):
        named = re.fullmatch(r"#\s*([\w-]+\.py)\s*", code.splitlines()[0])
        if named:
            (work / named.group(1)).write_text(code)
            continue
        script = work / f"guide_block_{i}.py"
        script.write_text(code)
        r = subprocess.run([sys.executable, script.name], cwd=work, env=env, capture_output=True, text=True,
                           timeout=280, check=False)
        assert r.returncode == 0, f"exit {r.returncode}\n--- stdout\n{r.stdout[-4000:]}\n--- stderr\n{r.stderr[-4000:]}"
        assert "epoch 3: loss" in r.stdout and "'optimizer': 'SGD'" in r.stdout, r.stdout


if __name__ == "__main__":      # pragma: no cover
    sys.exit(pytest.main([__file__]))

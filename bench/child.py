"""A bench's child process: its spec in, its figures out, and how the parent launches it and reads why it failed.

The benches run each measurement in a child process of its own (in a memory cgroup where one is
available), so that peaks and OOM kills are the measurement's alone; all of them use this plumbing.
A child that refuses its settings (a `DiskflowError`: a budget too small for a pipeline's buffers, a
model a pipeline does not take) says why in one line (`refuse`), which the bench's table and JSON
carry, with no traceback; any other failure keeps its traceback on the child's stderr.
"""
from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import DiskflowError
from ..operators.formats.sizes import format_bytes

if TYPE_CHECKING:
    from .cgroup import LimitedRun

__all__ = ["REFUSED", "child_failure", "launch_child", "read_child_spec", "refuse", "write_child_out"]

REFUSED = 3     # the exit status of a child that refused its settings; its reason is in the spec's ``refused`` file


def read_child_spec(argv: Sequence[str], module: str) -> dict[str, Any] | None:
    """The spec of a bench's child process (``--child SPEC.json``), or None after printing the usage.

    The benches run each measurement in a child process of their own; all of them take the same argv.
    """
    if len(argv) != 2 or argv[0] != "--child":
        print(f"usage: python -m {module} --child SPEC.json", file=sys.stderr)
        return None
    return json.loads(Path(argv[1]).read_text())


def write_child_out(spec: dict[str, Any], result: dict[str, Any]) -> None:
    """Write a child's figures to its spec's ``out``, whole or not at all (through a temporary file)."""
    tmp = Path(spec["out"] + ".tmp")
    tmp.write_text(json.dumps(result, default=float))
    tmp.replace(spec["out"])


def refuse(spec: dict[str, Any], error: DiskflowError) -> int:
    """A child's answer to settings it refuses (`error`): the error's one line goes to the spec's ``refused``
    file, where the parent reads it (`launch_child`), and the child exits with `REFUSED`, without a traceback."""
    reason = " ".join(str(error).split())
    if spec.get("refused"):
        Path(spec["refused"]).write_text(reason)
    else:                                       # a spec not from `launch_child`: the line on stderr, alone
        print(reason, file=sys.stderr)
    return REFUSED


def launch_child(module: str, runs: Path, name: str, spec: dict[str, Any], limit: int | None,
                 timeout: float) -> tuple[LimitedRun, dict[str, Any] | None, str | None]:
    """Run ``python -m module --child SPEC`` in a cgroup of `limit` bytes (None: none); how it ran, its figures
    and, where it refused its settings (`refuse`), its reason.

    The spec goes to ``runs/NAME.spec.json`` with ``out`` naming ``runs/NAME.out.json`` and ``refused``
    ``runs/NAME.refused.txt``; the figures are None where the child wrote none (it failed before its first),
    so the caller says what is missing.
    """
    from .cgroup import run_limited

    runs.mkdir(parents=True, exist_ok=True)
    spec_path, out_path = runs / f"{name}.spec.json", runs / f"{name}.out.json"
    refused_path = runs / f"{name}.refused.txt"
    out_path.unlink(missing_ok=True)
    refused_path.unlink(missing_ok=True)
    spec_path.write_text(json.dumps({**spec, "out": str(out_path), "refused": str(refused_path)}))
    r = run_limited([sys.executable, "-m", module, "--child", str(spec_path)], name=name,
                    limit_bytes=limit, timeout_s=timeout)
    refused = (refused_path.read_text().strip() or None) if refused_path.is_file() else None
    return r, (json.loads(out_path.read_text()) if out_path.is_file() else None), refused


def child_failure(r: LimitedRun, limit: int | None, timeout: float, refused: str | None = None) -> str:
    """Why a child failed, in words: the settings it refused and why (`refuse`), or its exit status; an OOM
    kill in its cgroup, a timeout."""
    why = [f"refused: {refused}" if refused else f"exit status {r.returncode}"]
    if r.oom_kills:
        why.append(f"killed by the OOM killer of its cgroup ({format_bytes(limit or 0)} limit)")
    if r.timed_out:
        why.append(f"timed out after {timeout:.0f} s (--timeout)")
    return ", ".join(why)

"""The README's results table, built from ``docs/results/*.json`` (one file per benchmark).

Each JSON holds one benchmark's current headline figure on one kind of machine and its metadata
(``NAME.json``; ``NAME.MACHINE.json`` for the same benchmark's figure on another kind, e.g.
``stream.h200.json``)::

    {
      "bench": "prepare",                          # the benchmark's name (as `diskflow bench NAME`)
      "what": "offline preparation next to its I/O floor",
      "command": "diskflow bench prepare --json prepare.json",
      "date": "2026-11-27",                        # when it was measured (YYYY-MM-DD)
      "commit": "e5fd04c",                         # optional: the code it measured
      "machine": "2 cores, 24 GiB, virtio disk, no GPU",
      "headline": {
        "metric": "prepare wall time", "value": 10.2, "unit": "s",
        "ratio": {"value": 1.24, "against": "its I/O floor (8.21 s)"},   # optional
        "target": "≤ 1.5x, met",                                         # optional
        "note": "..."                                                    # optional, shown without a ratio
      },
      "figures": {...}                             # optional: the rest of what the run measured
    }

``python -m diskflow.bench.results`` rewrites the table between ``<!-- results:begin -->`` and
``<!-- results:end -->`` in README.md; ``--check`` rewrites nothing and exits 1 when the README's
table differs from what the JSONs give (a test runs it, so the table cannot drift from them).
"""
from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["BEGIN", "END", "ORDER", "REQUIRED", "ROOT", "ResultsError", "load", "main", "render", "splice",
           "write_generated"]

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"
# the table's row order; benchmarks not named here follow, by name
ORDER = ("compare", "prepare", "stream", "stream_gpus", "scale", "reader", "sampler", "plan", "ingest")
REQUIRED = ("bench", "what", "command", "date", "machine", "headline")


class ResultsError(Exception):
    """A results file or the README is not as this script expects; the message names the file."""


def _number(value: Any) -> str:
    """A figure as the table shows it: 71800000 -> 71.8M, 10.2 -> 10.2; strings (ranges) as they are."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"expected a number or a string, got {value!r}")
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e4, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def load(path: Path) -> dict[str, Any]:
    """One results file, checked for the fields the table needs."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ResultsError(f"{path}: {e}") from None
    if not isinstance(data, dict):
        raise ResultsError(f"{path}: expected a JSON object")
    missing = [k for k in REQUIRED if k not in data]
    head = data.get("headline")
    if isinstance(head, dict):
        missing += [f"headline.{k}" for k in ("metric", "value", "unit") if k not in head]
        ratio = head.get("ratio")
        if ratio is not None and not (isinstance(ratio, dict) and {"value", "against"} <= set(ratio)):
            missing.append("headline.ratio.{value,against}")
    elif head is not None:
        missing.append("headline (an object)")
    if missing:
        raise ResultsError(f"{path}: missing {', '.join(missing)}")
    assert isinstance(head, dict)          # a missing or non-object headline is missing above
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", str(data["date"])):
        raise ResultsError(f"{path}: date {data['date']!r} is not YYYY-MM-DD")
    try:
        _number(head["value"])
        if head.get("ratio") is not None:
            _number(head["ratio"]["value"])
    except TypeError as e:
        raise ResultsError(f"{path}: headline: {e}") from None
    return data


def _row(data: dict[str, Any], link: str) -> str:
    head = data["headline"]
    unit = head["unit"]
    value = _number(head["value"]) + ("" if unit in ("", "x", "%") else " ") + unit
    figure = f"{head['metric']}: **{value}**"
    ratio = head.get("ratio")
    if ratio is not None:
        against = f"**{_number(ratio['value'])}x** {ratio['against']}"
    else:
        against = head.get("note", "")
    if head.get("target"):
        against = f"{against} (target: {head['target']})" if against else f"target: {head['target']}"
    cells = [f"[`{data['bench']}`]({link})", data["what"], figure, against or "—", data["date"], data["machine"]]
    return "| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in cells) + " |"


def render(results: Path, link_base: str = "docs/results") -> str:
    """The table (header and one row per JSON in `results`), links relative to the README."""
    files = sorted(results.glob("*.json"))
    if not files:
        raise ResultsError(f"{results}: no results files (*.json)")
    rows = [(load(f), f) for f in files]
    rank = {name: i for i, name in enumerate(ORDER)}
    rows.sort(key=lambda r: (rank.get(r[0]["bench"], len(ORDER)), r[0]["bench"]))
    lines = ["| bench | what it measures | headline | against | date | machine |",
             "|---|---|---|---|---|---|"]
    lines += [_row(data, f"{link_base}/{f.name}") for data, f in rows]
    return "\n".join(lines)


def splice(readme: str, table: str, where: str = "README.md", markers: tuple[str, str] = (BEGIN, END)) -> str:
    """`readme` with the text between the two `markers` replaced by `table` (a generated part of a page)."""
    begin, end = markers
    if readme.count(begin) != 1 or readme.count(end) != 1 or readme.index(begin) > readme.index(end):
        raise ResultsError(f"{where}: expected one {begin} followed by one {end}")
    head, rest = readme.split(begin)
    _, tail = rest.split(end)
    return f"{head}{begin}\n{table}\n{end}{tail}"


def write_generated(path: Path, old: str, new: str, *, check: bool, what: str, source: Path, command: str) -> int:
    """The end of a page generator's run (this module's, `bench.scaling`'s): `path` rewritten from `old` to `new`,
    or with `check` a diff and exit 1 where they differ; `what` names the generated part (plural: "the tables"),
    `command` what rewrites it."""
    plural = what.endswith("s")
    if new == old:
        print(f"{path}: {what} {'match' if plural else 'matches'} {source}")
        return 0
    if check:
        diff = difflib.unified_diff(old.splitlines(), new.splitlines(), str(path), "from the JSONs", lineterm="", n=0)
        print("\n".join(diff), file=sys.stderr)
        print(f"{path}: {what} {'differ' if plural else 'differs'} from {source}; run `{command}` to rewrite "
              f"{'them' if plural else 'it'}", file=sys.stderr)
        return 1
    path.write_text(new)
    print(f"{path}: {what} rewritten from {source}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m diskflow.bench.results", description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true",
                   help="change nothing; exit 1 when the README's table differs from the JSONs")
    p.add_argument("--readme", type=Path, default=ROOT / "README.md", help="the README (default: the repository's)")
    p.add_argument("--results", type=Path, default=None,
                   help="the results folder (default: docs/results beside the README)")
    args = p.parse_args(argv)
    results = args.results if args.results is not None else args.readme.parent / "docs" / "results"
    try:
        link = Path(results.resolve()).relative_to(args.readme.parent.resolve()).as_posix()
    except ValueError:
        link = results.resolve().as_posix()
    try:
        old = args.readme.read_text()
        new = splice(old, render(results, link), str(args.readme))
    except (OSError, ResultsError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return write_generated(args.readme, old, new, check=args.check, what="the results table", source=results,
                           command="python -m diskflow.bench.results")


if __name__ == "__main__":
    sys.exit(main())

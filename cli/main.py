"""The `diskflow` command line's parser and entry point: one subcommand per module of this package."""
from __future__ import annotations

import argparse
import importlib
import logging
import sys
from collections.abc import Sequence

from .. import __version__
from ..operators.formats.errors import DiskflowError, is_disk_full

# Subcommand modules, in the order `diskflow --help` lists them.
COMMANDS = ("demo", "synth", "importers", "ingest", "run", "prepare", "verify", "train", "scheduler", "worker", "report", "bench", "info")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="diskflow",
        description="Out-of-core GNN training as a Dask dataflow. "
        "Start with `diskflow demo`; see `diskflow COMMAND --help` for each step.",
    )
    parser.add_argument("--version", action="version", version=f"diskflow {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages and show tracebacks")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS:
        module = importlib.import_module(f"{__package__}.{name}")
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: parse, run, and turn user mistakes and a full disk into one clear line (exit 2)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except DiskflowError as e:
        if args.verbose:
            raise
        print(f"diskflow {args.command}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        # Writers name their output when the disk fills (DiskFullError, above); this is the net
        # under any write that does not, so a full disk is never a traceback.
        if args.verbose or not is_disk_full(e):
            raise
        print(f"diskflow {args.command}: error: {e.filename or 'a write'}: no space left on device "
              "(free some space, or choose another filesystem)", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"diskflow {args.command}: interrupted", file=sys.stderr)
        return 130

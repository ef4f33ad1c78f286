"""The `diskflow` command line's parser and entry point: one subcommand per module of this package."""
from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from types import ModuleType

from .. import __version__
from ..errors import ConfigError, DiskflowError, is_disk_full
from .logs import FORMAT, log_to_stderr

__all__ = ["COMMANDS", "DESTS", "build_parser", "flag_of", "main"]

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
    modules = _command_modules()
    for name in COMMANDS:
        modules[name].register(sub)
    return parser


def _command_modules() -> dict[str, ModuleType]:
    """The subcommand modules by name, imported now (each has ``register(subparsers)``)."""
    from . import (
        bench,
        demo,
        importers,
        info,
        ingest,
        prepare,
        report,
        run,
        scheduler,
        synth,
        train,
        verify,
        worker,
    )

    return {"demo": demo, "synth": synth, "importers": importers, "ingest": ingest, "run": run, "prepare": prepare,
            "verify": verify, "train": train, "scheduler": scheduler, "worker": worker, "report": report,
            "bench": bench, "info": info}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: parse, run, and turn user mistakes and a full disk into one clear line (exit 2)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING, format=FORMAT)
    command = _command_parser(parser, args)

    def flag(option: str) -> str:
        return flag_of(command, option)

    # the library's progress notes (the Dask dashboard's address) and warnings, options named by their flags
    log_to_stderr(args.verbose, flag)
    try:
        return int(args.func(args) or 0)
    except DiskflowError as e:
        if args.verbose:
            raise
        message = f"{flag(e.option)}: {e.render(flag)}" if isinstance(e, ConfigError) else e
        print(f"diskflow {args.command}: error: {message}", file=sys.stderr)
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


# config fields / API parameters whose command-line argument stores under another name
DESTS = {"store": "dataset", "train_frac": "train", "val_frac": "val", "test_frac": "test"}


def flag_of(parser: argparse.ArgumentParser | None, option: str) -> str:
    """The flag a `ConfigError`'s `option` stands for on the command line: the long flag of `parser`'s argument
    whose ``dest`` is `option` (a config field or API parameter such as ``cpu_memory`` -> ``--cpu-memory``).
    The library names config fields; only the command line knows its flags. An option already written as a
    flag (``--x``), or one no argument stores, is returned as it is; a positional reads as its metavar."""
    if parser is None or option.startswith("-"):
        return option
    for action in parser._actions:
        if action.dest == option and action.option_strings:
            longs = [s for s in action.option_strings if s.startswith("--")]
            return (longs or action.option_strings)[0]
        if action.dest == option and not action.option_strings:     # a positional: as the usage line shows it
            return str(action.metavar or action.dest.upper())
    if option in DESTS:
        return flag_of(parser, DESTS[option])
    return option


def _command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser | None:
    """The parser of the subcommand `args` ran (``bench compare``'s, ``import npy``'s: the innermost one)."""
    found: argparse.ArgumentParser | None = None
    current = parser
    while True:
        subparsers = [a for a in current._actions if isinstance(a, argparse._SubParsersAction)]
        if not subparsers:
            return found
        action = subparsers[0]
        chosen = getattr(args, action.dest, None)
        child = action.choices.get(chosen) if chosen is not None else None
        if child is None:
            return found
        found = current = child

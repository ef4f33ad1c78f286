"""Every command's flags state the defaults of the dataclass fields they set, never a default of their own.

The parser of each command (`diskflow.cli.main.build_parser`) is read flag by flag: where a flag sets a
dataclass field, the parser's default (where it has one) and every ``default X`` its help states must be the
field's default. `diskflow run` passes on only the flags given (their parser default is None), so there the
help's text is what is checked.
"""
from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from dataclasses import MISSING, dataclass, fields
from typing import Any

import pytest
from diskflow.cli.main import build_parser

from diskflow.config import (
    INGEST_MEMORY,
    PREPARE_DEFAULTS,
    RUN_DEFAULTS,
    LinkConfig,
    PrepareConfig,
    StreamConfig,
    SynthConfig,
    TrainConfig,
)
from diskflow.errors import ConfigError
from diskflow.sizes import parse_bytes

_DEFAULT = re.compile(r"\bdefault:?\s+([^\s;,):]+(?:,[0-9-]+)*)")
_WORDS = {"the", "a", "an", "no", "none", "one", "eight", "its"}     # "default: the pipeline's", not a value


def field_defaults(cls: type) -> dict[str, Any]:
    return {f.name: f.default for f in fields(cls) if f.default is not MISSING}


@dataclass
class Command:
    """A command's flags -> the defaults of the fields they set (`dests`: flag dest -> field name)."""

    name: str
    defaults: dict[str, Any]
    dests: dict[str, str]
    text_only: frozenset[str] = frozenset()     # budgets given as text (a share of the features): the help only


def _commands() -> list[Command]:
    train, stream, prep = field_defaults(TrainConfig), field_defaults(StreamConfig), field_defaults(PrepareConfig)
    return [
        Command("prepare", {**prep, "hidden": TrainConfig.hidden, "queue_depth": RUN_DEFAULTS["queue_depth"]},
                {k: k for k in PREPARE_DEFAULTS}, frozenset({"cpu_memory", "gpu_memory", "disk_budget"})),
        Command("train", {**train, "device": PrepareConfig.device, "queue_depth": RUN_DEFAULTS["queue_depth"]},
                {k: k for k in train} | {"device": "device", "queue_depth": "queue_depth"}),
        Command("run", {**stream, **train, "device": PrepareConfig.device, "extractors": RUN_DEFAULTS["extractors"],
                        "hold_memory": RUN_DEFAULTS["hold_memory"], "batches_per_step": TrainConfig.batches_per_step},
                {k: k for k in (*train, *stream, "extractors", "hold_memory")} | {"gpu_wait": "gpu_wait_s"}),
        Command("ingest", {**field_defaults(LinkConfig), "memory_budget": INGEST_MEMORY, "shard_rows": None},
                {"link_split": "split", "disjoint_train_ratio": "disjoint_train_ratio", "link_negatives": "negatives",
                 "link_seed": "seed", "memory_budget": "memory_budget", "shard_rows": "shard_rows"}),
        Command("synth", field_defaults(SynthConfig),
                {**{k: k for k in field_defaults(SynthConfig)}, "nodes": "num_nodes", "dim": "feature_dim",
                 "classes": "num_classes", "train": "train_frac", "val": "val_frac", "test": "test_frac"}),
    ]


def _spellings(value: Any) -> set[str]:
    """How a help text may write `value`."""
    if isinstance(value, (tuple, list)):
        return {",".join(map(str, value))}
    if isinstance(value, bool) or value is None:
        return {str(value)}
    if isinstance(value, float):
        return {str(value), f"{value:g}"}
    return {str(value)}


def _same(flag_default: Any, field_default: Any) -> bool:
    if flag_default == field_default:
        return True
    if isinstance(flag_default, str) and isinstance(field_default, int) and not isinstance(field_default, bool):
        try:
            return parse_bytes(flag_default) == field_default       # a size given as text, "1GiB"
        except ConfigError:
            return False
    return False


def mismatches(parser: argparse.ArgumentParser, command: Command) -> Iterator[str]:
    """Each flag of `parser` that states a default other than its field's."""
    for action in parser._actions:
        field = command.dests.get(action.dest)
        if field is None or field not in command.defaults or not action.option_strings:
            continue
        want = command.defaults[field]
        flag = action.option_strings[-1]
        if action.default is not None and field not in command.text_only and not _same(action.default, want):
            yield f"{command.name} {flag}: parser default {action.default!r}, {field} defaults to {want!r}"
        text = (action.help or "") % {"default": action.default, "prog": parser.prog}
        stated = [s for s in _DEFAULT.findall(text) if s not in _WORDS]
        if field in command.text_only or want is None:
            continue
        if stated and not any(s in _spellings(want) or _same(s, want) for s in stated):
            yield f"{command.name} {flag}: help says default {', '.join(stated)}, {field} defaults to {want!r}"


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("no subcommands")


@pytest.mark.parametrize("command", _commands(), ids=lambda c: c.name)
def test_each_flag_states_its_fields_default(command: Command) -> None:
    parser = _subparsers()[command.name]
    checked = [a for a in parser._actions if command.dests.get(a.dest) in command.defaults]
    assert len(checked) >= 5, f"{command.name}: too few flags map to fields ({[a.dest for a in checked]})"
    assert list(mismatches(parser, command)) == []


def test_a_flag_that_restates_a_default_is_caught() -> None:
    """The check fails for a retyped default, in the parser's default or in the help's text."""
    command = _commands()[2]        # run
    parser = argparse.ArgumentParser(prog="run")
    parser.add_argument("--epochs", default=None, help="training epochs (default 7)")
    parser.add_argument("--superbatch-size", type=int, default=64, help="batches per superbatch")
    parser.add_argument("--lr", help=f"learning rate (default {TrainConfig.lr:g})")
    found = list(mismatches(parser, command))
    assert len(found) == 2, found
    assert "--epochs: help says default 7" in found[0]
    assert "--superbatch-size: parser default 64, superbatch_size defaults to 32" in found[1]


def test_the_history_flags_are_one_definition() -> None:
    """prepare and run take the same --history-* flags, with the same help."""
    sub = _subparsers()
    flags = {name: {a.option_strings[-1]: a.help for a in sub[name]._actions
                    if a.option_strings and a.option_strings[-1].startswith("--history-")} for name in ("prepare", "run")}
    assert flags["prepare"] == flags["run"]
    assert len(flags["run"]) == 6


def test_option_and_input_errors_are_value_errors() -> None:
    """A caller written the PyG way (``except ValueError``) catches diskflow's option and input errors."""
    from diskflow.errors import ConfigError, DiskflowError, InputError

    for error in (ConfigError("batch_size", "must be >= 1"), InputError("store", "not a store")):
        assert isinstance(error, ValueError) and isinstance(error, DiskflowError)

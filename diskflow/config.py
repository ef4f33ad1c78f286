"""The options of each step, their defaults and accepted values, gathered for the commands and for users.

`TrainConfig` (the trainer's), `PrepareConfig` (a packed round's), `StreamConfig` (a streamed run's; both
share `RoundOptions`) and `SynthConfig` (a synthetic graph's) hold the defaults, each stated once, in the
dataclass or, where several share one, in `diskflow.operators.options`; `PREPARE_DEFAULTS` (prepare's
options) and `RUN_DEFAULTS` (the rest of a run's) are read from them. The tuples name the values an option
accepts. The commands take their flags' defaults from here, so a default is never written twice; this
module imports the layers below the API, never the API itself.

    from diskflow.config import PREPARE_DEFAULTS, TrainConfig

    TrainConfig().hidden            # 128, `diskflow train --hidden`'s default
    PREPARE_DEFAULTS["cpu_memory"]  # "10%"
"""
from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from typing import Any

from .errors import ConfigError
from .flow.options import parse_fanouts
from .flow.pipeline import available_pipelines
from .flow.prepare.config import PREPARE_DEFAULTS, PrepareConfig
from .flow.stream.config import StreamConfig
from .operators.formats.rowcodec import ENCODINGS
from .operators.ingest.links import LinkConfig
from .operators.ingest.synth import SynthConfig
from .operators.options import HOLD_MEMORY, INGEST_MEMORY, QUEUE_DEPTH
from .operators.prepare.history import (
    DEFAULT_STALENESS,
    HISTORY_PRUNES,
    HISTORY_SELECTS,
    check_prune,
    check_rule,
)
from .operators.prepare.round import RoundOptions
from .operators.prepare.seeds import BATCH_ORDERS, GROUPINGS
from .operators.prepare.task import NEG_SAMPLINGS, TASKS
from .operators.train.config import DEFAULT_EXTRACTORS, DEFAULT_WINDOW, MODELS, TrainConfig
from .operators.train.modeldef import DATA_ONLY, check_model_option, is_model_file, model_label

# the defaults of options no config dataclass holds: the online pipelines' extractors and lookahead window,
# the historical embedding cache's staleness, the GPU worker's memory for held index and samples, the trainer's
# queue depth
RUN_DEFAULTS = {"extractors": DEFAULT_EXTRACTORS, "online_window": DEFAULT_WINDOW,
                "history_staleness": DEFAULT_STALENESS, "hold_memory": HOLD_MEMORY, "queue_depth": QUEUE_DEPTH}

__all__ = [
    "BATCH_ORDERS",
    "DATA_ONLY",
    "ENCODINGS",
    "GROUPINGS",
    "HISTORY_PRUNES",
    "HISTORY_SELECTS",
    "INGEST_MEMORY",
    "MODELS",
    "NEG_SAMPLINGS",
    "PREPARE_DEFAULTS",
    "RUN_DEFAULTS",
    "TASKS",
    "LinkConfig",
    "PrepareConfig",
    "RoundOptions",
    "StreamConfig",
    "SynthConfig",
    "TrainConfig",
    "argparse_type",
    "available_pipelines",
    "check_model_option",
    "check_prune",
    "check_rule",
    "fanouts_option",
    "is_model_file",
    "model_label",
    "model_option",
    "parse_fanouts",
    "parse_float",
    "parse_shares",
]


def parse_float(option: str, text: str, minimum: float | None = None, inclusive: bool = True) -> float:
    """A number (finite and at least `minimum`, above it unless `inclusive`, where given), or a ConfigError
    naming the option."""
    bound = "" if minimum is None else f" {'>=' if inclusive else '>'} {minimum:g}"
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(option, f"expected a number{bound}, got {text!r}") from None
    if minimum is not None and not (math.isfinite(value) and (value >= minimum if inclusive else value > minimum)):
        raise ConfigError(option, f"expected a number{bound}, got {text!r}")
    return value


def parse_shares(option: str, text: str) -> tuple[float, float]:
    """``VAL,TEST``: two numbers (their ranges are the library's to check)."""
    parts = text.split(",")
    if len(parts) != 2:
        raise ConfigError(option, f"expected two shares VAL,TEST, got {text!r}")
    val, test = (parse_float(option, part) for part in parts)
    return val, test


def argparse_type(option: str, parse: Callable[[str, str], Any]) -> Callable[[str], Any]:
    """`parse(option, text)` as an argparse ``type``: a `ConfigError` becomes argparse's own message."""
    def convert(text: str) -> Any:
        try:
            return parse(option, text)
        except ConfigError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return convert


def fanouts_option(option: str = "--fanouts") -> Callable[[str], tuple[int, ...]]:
    """`parse_fanouts` as an argparse ``type``: a bad value stops parsing with argparse's own message naming
    `option` (every command's and benchmark's ``--fanouts`` reads alike)."""
    def parse(text: str) -> tuple[int, ...]:
        try:
            return parse_fanouts(text, option)
        except ConfigError as e:  # -> argparse's own message format
            raise argparse.ArgumentTypeError(str(e)) from None
    return parse


def model_option(text: str) -> str:
    """A ``--model`` value: a built-in model's name, ``none``, or the path of an existing ``.py`` file that
    defines a `diskflow.Model`, made absolute so that Dask workers find it (imported where the model is built,
    not here).

    Raises:
        ConfigError: naming ``--model``, for anything else.
    """
    check_model_option(text, "--model")
    return os.path.abspath(text) if is_model_file(text) else text

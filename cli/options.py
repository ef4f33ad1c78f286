"""argparse value parsers and shared flags of the commands: each refusal names the flag and the fault.

`positive_int` and `byte_size` build argparse ``type``s (a bad value stops parsing with
argparse's own message; `diskflow.config` has the ones the benchmarks share, `fanouts_option` and
`model_option`); `parse_int`, `parse_float`, `parse_batches` and `parse_history_rule` raise
`ConfigError` for values parsed after argparse (`diskflow run` passes on only the flags given).
"""
from __future__ import annotations

import argparse
import math
from collections.abc import Callable

from ..config import BATCH_ORDERS, check_rule
from ..errors import ConfigError
from ..sizes import parse_bytes


def positive_int(option: str) -> Callable[[str], int]:
    """Parser for an integer >= 1."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{option}: expected an integer, got {text!r}") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"{option}: must be >= 1, got {value}")
        return value
    return parse


def float_at_least(option: str, minimum: float, inclusive: bool = True) -> Callable[[str], float]:
    """Parser for a finite number >= `minimum` (> it unless `inclusive`): `parse_float` as an argparse ``type``."""
    def parse(text: str) -> float:
        try:
            return parse_float(option, text, minimum=minimum, inclusive=inclusive)
        except ConfigError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return parse


def byte_size(option: str) -> Callable[[str], int]:
    """Parser for sizes such as `2GiB`, `512MiB`, `1.5GB`."""
    def parse(text: str) -> int:
        try:
            return parse_bytes(text, option)
        except ConfigError as e:  # -> argparse's own message format
            raise argparse.ArgumentTypeError(str(e)) from None
    return parse


def parse_int(option: str, text: str, minimum: int) -> int:
    """An integer option >= minimum, or a ConfigError naming the option."""
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(option, f"expected an integer >= {minimum}, got {text!r}") from None
    if value < minimum:
        raise ConfigError(option, f"expected an integer >= {minimum}, got {text!r}")
    return value


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


def parse_history_rule(option: str, text: str) -> float:
    """``--history-ramp`` or ``--history-cooldown`` (named by `option`): a number the history planner takes
    (`check_rule`), or a ConfigError naming the flag."""
    value = parse_float(option, text)
    ramp, cooldown = (value, 0.0) if option.endswith("ramp") else (0.0, value)
    try:
        check_rule(ramp, cooldown)
    except ConfigError as e:
        raise ConfigError(option, e.fault) from None
    return value


def history_rule(option: str) -> Callable[[str], float]:
    """`parse_history_rule` as an argparse ``type`` (argparse's own message, naming `option`)."""
    def parse(text: str) -> float:
        try:
            return parse_history_rule(option, text)
        except ConfigError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return parse


def parse_batches(option: str, text: str) -> str:
    """A batch order's name; ``random`` names the shuffled order."""
    name = "shuffled" if text == "random" else text
    if name not in BATCH_ORDERS:
        raise ConfigError(option, f"expected one of {', '.join(BATCH_ORDERS)} (or random), got {text!r}")
    return name


def add_tls_arguments(parser: argparse.ArgumentParser, listens: bool = False) -> None:
    """Add ``--tls-ca-file``, ``--tls-cert`` and ``--tls-key`` to a command's parser (`listens`: a scheduler's
    or a worker's own, else a client's of ``--scheduler tls://...``)."""
    who = "this process's" if listens else "--scheduler tls://...: this client's"
    parser.add_argument("--tls-ca-file", default=None, metavar="FILE",
                        help=("TLS: the CA certificate every process of the cluster trusts (with --tls-cert, "
                              "--tls-key; the scheduler then listens on tls://)") if listens else
                        "--scheduler tls://...: the CA certificate the cluster's certificates are signed by")
    parser.add_argument("--tls-cert", default=None, metavar="FILE", help=f"{who} certificate (PEM)")
    parser.add_argument("--tls-key", default=None, metavar="FILE",
                        help=f"{who} private key (PEM; default: in --tls-cert)")

"""argparse value parsers and shared flags of the commands: each refusal names the flag and the fault.

`integer`, `positive_int` and `byte_size` build argparse ``type``s (a bad value stops parsing with
argparse's own message; `diskflow.config` has the ones the benchmarks share, `fanouts_option` and
`model_option`); `parse_int`, `parse_float`, `parse_batches` and `parse_history_rule` raise
`ConfigError` for values parsed after argparse (`diskflow run` passes on only the flags given).
"""
from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from ..config import (
    BATCH_ORDERS,
    HISTORY_PRUNES,
    HISTORY_SELECTS,
    RoundOptions,
    argparse_type,
    check_prune,
    check_rule,
    parse_float,
)
from ..errors import ConfigError
from ..sizes import parse_bytes

__all__ = ["HISTORY_FLAGS", "ROWS_HELP", "add_history_arguments", "add_rows_argument", "add_task_arguments", "add_tls_arguments", "argparse_type", "byte_size",
           "float_at_least", "integer", "parse_batches", "parse_choice", "parse_float",
           "parse_history_flags", "parse_history_rule", "parse_int", "positive_int"]


def integer(option: str) -> Callable[[str], int]:
    """Parser for an integer, converted only: its range is the library's to check (a `ConfigError` naming the
    field, which the command prints as `option`): `parse_int` as an argparse ``type``."""
    return argparse_type(option, parse_int)


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
    return argparse_type(option, lambda o, text: parse_float(o, text, minimum=minimum, inclusive=inclusive))


def byte_size(option: str) -> Callable[[str], int]:
    """Parser for sizes such as `2GiB`, `512MiB`, `1.5GB`."""
    return argparse_type(option, lambda o, text: parse_bytes(text, o))


def parse_int(option: str, text: str, minimum: int | None = None) -> int:
    """An integer option (>= `minimum` where given; None: the library checks its range), or a ConfigError
    naming the option."""
    bound = "" if minimum is None else f" >= {minimum}"
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(option, f"expected an integer{bound}, got {text!r}") from None
    if minimum is not None and value < minimum:
        raise ConfigError(option, f"expected an integer >= {minimum}, got {text!r}")
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


def parse_choice(option: str, text: str, choices: tuple[str, ...]) -> str:
    """One of `choices`, or a ConfigError naming the option."""
    if text not in choices:
        raise ConfigError(option, f"expected one of {', '.join(choices)}, got {text!r}")
    return text


_R = RoundOptions       # the history rule's defaults, from the one place they are set (a pipeline may set its own)

# the historical embedding cache's flags, shared by `diskflow prepare` and `diskflow run`:
# field -> (flag, metavar, parser of (flag, text), help)
HISTORY_FLAGS: dict[str, tuple[str, str, Callable[[str, str], Any], str]] = {
    "history_memory": ("--history-memory", "SIZE", lambda option, text: text,
                       ("a historical embedding cache (OUTRE) of SIZE bytes or a share of the features (e.g. 64MiB, "
                       "5%%); packed pipelines plan it into the samples, memory/mmap online; 'auto' (packed "
                       "pipelines): the share of --cpu-memory that reads the fewest bytes from disk, the rest for the "
                       "feature cache (default: the pipeline's)")),
    "history_select": ("--history-select", "HOW", lambda option, text: parse_choice(option, text, HISTORY_SELECTS),
                       ("packed pipelines: the embedding cache's nodes, accesses (the round's most frequent one-hop "
                       "nodes, known offline) or degree (the highest in-degree, as memory/mmap choose online) "
                       f"(default {_R.history_select})")),
    "history_staleness": ("--history-staleness", "S", lambda option, text: parse_int(option, text, 1),
                          (f"batches a cached embedding stays usable (default {_R.history_staleness}, or the "
                          "pipeline's own; 1: never reused)")),
    "history_prune": ("--history-prune", "HOW", lambda option, text: check_prune(text, option),
                      (f"what a fresh cached embedding prunes below its node: {', '.join(HISTORY_PRUNES)}; thin: "
                      "its subtree's last hop but one neighbour per node there, for the gradient; last-hop: its "
                      "subtree's last hop, the lower layers stay exact; subtree: all of it, OUTRE's rule, fewer rows "
                      "read, and the seeds' lower layers see that node's features alone "
                      f"(default {_R.history_prune}, or the pipeline's own)")),
    "history_ramp": ("--history-ramp", "R", parse_history_rule,
                     ("the adaptive staleness bound: an embedding computed at batch t stands in for at most "
                     "max(1, R*t) batches, so the early, fast-changing model's expire first; more bytes read, less "
                     f"accuracy lost (default {_R.history_ramp:g}: the fixed bound, or the pipeline's own)")),
    "history_cooldown": ("--history-cooldown", "SHARE", parse_history_rule,
                         ("the share of the round's last batches that prune nothing, so training ends on exact "
                         f"embeddings; more bytes read, less accuracy lost (default {_R.history_cooldown:g}, or "
                         "the pipeline's own)")),
}


def add_history_arguments(parser: argparse.ArgumentParser, defaults: dict[str, Any] | None = None) -> None:
    """Add `HISTORY_FLAGS` to a command's parser. With `defaults` (prepare's), each flag's value is parsed by
    argparse and defaults to the field's entry there; without (`diskflow run`, which passes on only the flags
    given), each defaults to None and the command parses it (`parse_history_flags`)."""
    for name, (flag, metavar, parse, text) in HISTORY_FLAGS.items():
        if defaults is None:
            parser.add_argument(flag, dest=name, default=None, metavar=metavar, help=text)
        else:
            parser.add_argument(flag, dest=name, default=defaults[name], metavar=metavar,
                                type=argparse_type(flag, parse), help=text)


def parse_history_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The history flags given (not None) in `args`, parsed: `diskflow run`'s."""
    return {name: parse(flag, getattr(args, name)) for name, (flag, _, parse, _) in HISTORY_FLAGS.items()
            if getattr(args, name, None) is not None}


ROWS_HELP = ("how feature rows are held in the tiers and packed segments: exact (the store's rows, bit for bit), or "
             "encoded in fewer bytes, float16, bfloat16 or int8 (a scale per row), decoded as each batch is "
             "assembled (default: the pipeline's, exact)")


def add_rows_argument(parser: argparse.ArgumentParser) -> None:
    """``--rows`` (default: the pipeline's)."""
    from ..config import ENCODINGS

    parser.add_argument("--rows", choices=ENCODINGS, default=None, help=ROWS_HELP)


def add_task_arguments(parser: argparse.ArgumentParser, neg_ratio: float, neg_sampling: str) -> None:
    """The round's task flags: ``--task`` (default: the pipeline's), ``--neg-ratio`` and ``--neg-sampling`` with
    these defaults."""
    from ..config import NEG_SAMPLINGS, TASKS

    parser.add_argument("--task", choices=TASKS, default=None,
                        help="node: classify the training nodes; link: score the store's training edges against "
                             "negative pairs (needs a store ingested with an edge split, --link-split) "
                             "(default: the pipeline's, node)")
    parser.add_argument("--neg-ratio", type=float_at_least("--neg-ratio", 0.0), default=neg_ratio, metavar="R",
                        help=f"link task: negative pairs per positive edge in a batch (default {neg_ratio:g})")
    parser.add_argument("--neg-sampling", choices=NEG_SAMPLINGS, default=neg_sampling,
                        help="link task: draw a negative pair's ends uniformly or in proportion to in-degree "
                             f"(default {neg_sampling})")

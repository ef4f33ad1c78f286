"""Option values the library shares: fanouts, byte budgets, the historical embedding cache's settings; each
refusal is a `ConfigError` naming the option and the fault."""
from __future__ import annotations

import logging
from typing import Any

from ..errors import ConfigError, Setting
from ..operators.formats.sizes import format_bytes, parse_bytes
from ..operators.options import CPU_SHARE
from ..operators.prepare.history import (
    DEFAULT_COOLDOWN,
    DEFAULT_PRUNE,
    DEFAULT_RAMP,
    DEFAULT_STALENESS,
    check_prune,
    check_rule,
    refuse_without_cache,
)
from ..operators.prepare.sample import check_fanouts
from ..operators.prepare.typedsample import EdgeFanouts

__all__ = ["DEFAULT_SHARE", "HISTORY_AUTO", "HISTORY_RULE", "DefaultBudget", "byte_budget", "fit_default",
           "history_options", "history_rule", "is_default", "note_raised", "parse_fanouts",
           "pipeline_history"]


def parse_fanouts(text: str, option: str = "fanouts") -> tuple[int, ...]:
    """Per-hop fanouts such as ``10,15,-1`` (-1: all neighbours): the one parser of every command's and
    benchmark's fanouts option; the values are checked by the sampler's own rule (`check_fanouts`). On a
    typed store, fanouts per edge type: ``author__writes__paper=5,5;paper__cites__paper=10,10`` (an
    `EdgeFanouts`; an edge type left out is not sampled).

    Raises:
        ConfigError: naming `option`: a piece that is not an integer, or a value below -1; an edge type's
            lists of different lengths.
    """
    if "=" in text:
        pairs = []
        for piece in (p.strip() for p in text.split(";") if p.strip()):
            name, _, hops = piece.partition("=")
            try:
                pairs.append((name.strip(), [int(t) for t in hops.split(",")]))
            except ValueError:
                raise ConfigError(option, f"{piece!r}: expected EDGE_TYPE=comma-separated integers >= -1") from None
        return EdgeFanouts(pairs, option)
    try:
        return tuple(check_fanouts([int(t) for t in text.split(",")]))
    except (ValueError, ConfigError):
        raise ConfigError(option, f"expected comma-separated integers >= -1, got {text!r}") from None


def byte_budget(value: int | str | None, option: str, whole: int) -> int | None:
    """Bytes from an int, ``"2GiB"``, or a share of `whole` such as ``"10%"``; None stays None."""
    if value is None:
        return None
    if isinstance(value, str) and value.strip().endswith("%"):
        try:
            share = float(value.strip()[:-1]) / 100
        except ValueError:
            raise ConfigError(option, f"not a percentage: {value!r}") from None
        if share < 0:
            raise ConfigError(option, f"must be >= 0, got {value!r}")
        return int(whole * share)
    return parse_bytes(value, option)


class DefaultBudget(str):
    """A budget's default, such as ``"10%"``, told apart from the same text given by the user: a default
    too small for a small store is raised to the smallest budget that works (`fit_default`), where the
    user's is refused naming that budget. Reads, prints and parses as the plain text."""

    __slots__ = ()

    def __repr__(self) -> str:
        return str.__repr__(str(self))


DEFAULT_SHARE = DefaultBudget(f"{CPU_SHARE:.0%}")     # "10%": the feature budgets' default (cpu_memory, cache_memory)


def is_default(value: object) -> bool:
    """Whether `value` is a budget's default (`DefaultBudget`), not a value the user gave."""
    return isinstance(value, DefaultBudget)


def fit_default(value: int | str | None, nbytes: int, least: int, option: str) -> int:
    """`nbytes` (what the budget `value` came to), or `least` (the smallest budget that works) where `value` is
    a default (`DefaultBudget`) below it, which is then logged (`note_raised`). A user's value stays as it is,
    for the caller's check to refuse."""
    if nbytes >= least or not is_default(value):
        return nbytes
    note_raised(option, nbytes, least, str(value))
    return least


def note_raised(option: str, nbytes: int, least: int, default: str = "", detail: str = "") -> None:
    """Log (INFO) that `option`'s default (`default`, `nbytes`) was raised to `least`, the smallest that works."""
    given = f"{default}, {format_bytes(nbytes)}" if default else format_bytes(nbytes)
    logging.getLogger(__name__).info("%s: the default (%s) is too small for this store; using %s, the smallest "
                                     "that works%s", Setting(option), given, format_bytes(least), detail)


HISTORY_AUTO = "auto"       # history_memory="auto": the memory split chooses it (`flow.memsplit`)


# the history cache's rule, and the library's defaults of it (a pipeline states its own: `Pipeline`'s fields)
HISTORY_RULE: dict[str, Any] = {"history_staleness": DEFAULT_STALENESS, "history_prune": DEFAULT_PRUNE,
                                   "history_ramp": DEFAULT_RAMP, "history_cooldown": DEFAULT_COOLDOWN}


def history_rule(defaults: object = None, **given: Any) -> dict[str, Any]:
    """The one resolution of a historical embedding cache's rule (`HISTORY_RULE`'s keys): each option as
    `given` where given (not None), else `defaults`' attribute of that name (a `Pipeline`), else the library's;
    checked, each refusal naming its option."""
    rule = {k: given[k] if given.get(k) is not None else getattr(defaults, k, d) for k, d in HISTORY_RULE.items()}
    staleness = rule["history_staleness"]
    if isinstance(staleness, bool) or not isinstance(staleness, int) or staleness < 1:
        raise ConfigError("history_staleness", f"must be >= 1 (1: never reused), got {staleness!r}")
    rule["history_prune"] = check_prune(rule["history_prune"])
    rule["history_ramp"], rule["history_cooldown"] = check_rule(rule["history_ramp"], rule["history_cooldown"])
    return rule


def history_options(memory: int | str | None, hidden: int, feature_bytes: int, defaults: object = None, *,
                    staleness: int | None = None, prune: str | None = None, ramp: float | None = None,
                    cooldown: float | None = None) -> dict[str, object]:
    """prepare's options for a historical embedding cache of `memory` (bytes, ``"5%"`` of the feature bytes, or
    ``"auto"``: its share of the CPU budget chosen by the memory split; None: `defaults`' ``history_memory``)
    of width `hidden`, its rule resolved by `history_rule` (None: `defaults`', a `Pipeline`'s, else the
    library's). A rule option given without a cache is an error."""
    if memory is None:
        memory = getattr(defaults, "history_memory", None)
    given = {"history_staleness": staleness, "history_prune": prune, "history_ramp": ramp, "history_cooldown": cooldown}
    rule = history_rule(defaults, **given)
    if memory == HISTORY_AUTO:
        return {"history_memory": 0, "history_split": True, "history_dim": hidden, **rule}
    nbytes = byte_budget(memory, "history_memory", feature_bytes) or 0
    if not nbytes:
        own = history_rule(defaults)        # the defaults alone: a value other than these was given
        refuse_without_cache(staleness, prune, default_staleness=own["history_staleness"],
                             default_prune=own["history_prune"], ramp=ramp, cooldown=cooldown)
        return {"history_memory": 0}      # none, even where the pipeline has one
    return {"history_memory": nbytes, "history_dim": hidden, **rule}


def pipeline_history(pipeline: object, options: dict[str, object]) -> dict[str, object]:
    """`options` with `pipeline`'s historical embedding cache and its rule (`history_rule`) where they set none
    of their own, for a pipeline that has one (else `options` as they are): what every loader trains with."""
    memory = getattr(pipeline, "history_memory", None)
    if memory in (None, 0, "0"):
        return options
    return {"history_memory": memory, **options, **history_rule(pipeline, **options)}

"""Option values the library shares: fanouts, byte budgets, the historical embedding cache's settings; each
refusal is a `ConfigError` naming the option and the fault."""
from __future__ import annotations

import logging

from ..errors import ConfigError, Setting
from ..operators.formats.sizes import format_bytes, parse_bytes
from ..operators.prepare.history import (
    DEFAULT_COOLDOWN,
    DEFAULT_PRUNE,
    DEFAULT_RAMP,
    check_prune,
    check_rule,
    refuse_without_cache,
)
from ..operators.prepare.sample import check_fanouts


def parse_fanouts(text: str, option: str = "fanouts") -> tuple[int, ...]:
    """Per-hop fanouts such as ``10,15,-1`` (-1: all neighbours): the one parser of every command's and
    benchmark's fanouts option; the values are checked by the sampler's own rule (`check_fanouts`).

    Raises:
        ConfigError: naming `option`: a piece that is not an integer, or a value below -1.
    """
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


DEFAULT_SHARE = DefaultBudget("10%")    # the default of the feature budgets (cpu_memory, cache_memory)


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


def history_options(memory: int | str | None, staleness: int | None, hidden: int, feature_bytes: int,
                    default_staleness: int, prune: str | None = None,
                    default_prune: str = DEFAULT_PRUNE, *, ramp: float | None = None,
                    cooldown: float | None = None, default_ramp: float = DEFAULT_RAMP,
                    default_cooldown: float = DEFAULT_COOLDOWN) -> dict[str, object]:
    """prepare's options for a historical embedding cache of `memory` (bytes, ``"5%"`` of the feature
    bytes, or ``"auto"``: its share of the CPU budget chosen by the memory split) of width `hidden`;
    `staleness`, `prune`, `ramp` and `cooldown` None take their defaults (the pipeline's); any of them
    given without a cache is an error."""
    r, c = check_rule(default_ramp if ramp is None else ramp, default_cooldown if cooldown is None else cooldown)
    rule = {"history_staleness": staleness or default_staleness,
            "history_prune": check_prune(prune or default_prune), "history_ramp": r, "history_cooldown": c}
    if memory == HISTORY_AUTO:
        return {"history_memory": 0, "history_split": True, "history_dim": hidden, **rule}
    nbytes = byte_budget(memory, "history_memory", feature_bytes) or 0
    if not nbytes:
        refuse_without_cache(staleness, prune, default_staleness=default_staleness, default_prune=default_prune,
                             ramp=ramp, cooldown=cooldown)
        return {"history_memory": 0}      # none, even where the pipeline has one
    return {"history_memory": nbytes, "history_dim": hidden, **rule}


"""Option values the library shares: fanouts, byte budgets, the historical embedding cache's settings; each
refusal is a `ConfigError` naming the option and the fault."""
from __future__ import annotations

from ..operators.formats.errors import ConfigError
from ..operators.formats.files import parse_bytes
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


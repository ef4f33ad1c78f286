"""Dask spans for diskflow's phases: what the Fine Performance Metrics page breaks a run down by.

A span (``distributed.span``) tags the tasks submitted inside it; Dask's scheduler then sums each
span's task time and the measures its tasks report (`flow.dashboard.publish`). diskflow names them:

- ``prepare/<phase>``: each phase of `diskflow prepare` (``prepare/sample``, ``prepare/plan``,
  ``prepare/pack``, ...), and ``ingest/<phase>`` of an ingest: one `flow.progress.compute` each;
- ``stream/superbatch-K`` for everything of superbatch K of a streamed run, holding one span per
  kind of task (``prepare/sample``, ``prepare/plan``, ``prepare/pack``, ``stream/ship``,
  ``stream/train``), so one can filter by a superbatch or by a phase across superbatches;
  ``stream/setup`` holds the run's own tasks (counts, tiers, the base bundle).
"""
from __future__ import annotations

import contextlib
import contextvars
import re
from collections.abc import Iterator, Sequence
from typing import Any

__all__ = ["STREAM_PHASES", "SpannedClient", "command", "phase", "phase_name", "stream_tags"]

# the command whose phases `compute` runs ("prepare", "ingest"); None: a phase is its own span
_COMMAND: contextvars.ContextVar[str | None] = contextvars.ContextVar("diskflow_span_command", default=None)

# a task key's kind of task (the key's prefix) -> its phase's span in a streamed run
STREAM_PHASES = {"sample": "prepare/sample", "hop1": "prepare/sample", "select": "prepare/select",
                 "count": "prepare/count", "tiers": "prepare/tiers", "trace": "prepare/trace", "plan": "prepare/plan",
                 "final": "prepare/plan", "header": "prepare/pack", "pack": "prepare/pack", "ship": "stream/ship",
                 "train": "stream/train", "history": "prepare/sample", "partition": "prepare/partition"}
_SUPERBATCH = re.compile(r"-(e\d+-s\d+)(?:-|$)")


@contextlib.contextmanager
def command(name: str) -> Iterator[None]:
    """The phases `flow.progress.compute` runs inside this context are spans ``name/<phase>``."""
    token = _COMMAND.set(name)
    try:
        yield
    finally:
        _COMMAND.reset(token)


def phase_name(desc: str) -> str:
    """The span of a phase described as `desc` (``"sample"``, ``"ingest: scan"``) under the current command."""
    parts = [p.strip() for p in re.split(r"[:/]", desc) if p.strip()]
    cmd = _COMMAND.get()
    if cmd is not None and (not parts or parts[0] != cmd):
        parts.insert(0, cmd)
    return "/".join(p.replace(" ", "-") for p in parts) or "diskflow"


@contextlib.contextmanager
def phase(desc: str) -> Iterator[None]:
    """Submit inside the span of phase `desc` (`phase_name`); needs distributed (only a client computes in one)."""
    from distributed import span

    with span(phase_name(desc)):
        yield


def stream_tags(key: str, index: dict[str, int]) -> tuple[str, ...]:
    """The span tags of a streamed run's task `key`: (``stream/superbatch-K``, its phase), or
    (``stream/setup``, its phase) for the run's own tasks. `index`: superbatch key -> stream position."""
    kind = key.split("-", 1)[0]
    phase_tag = STREAM_PHASES.get(kind, f"stream/{kind}")
    if kind == "pack" and key.startswith("pack-base") or kind == "ship" and key.startswith("ship-base"):
        phase_tag = "stream/base"
    m = _SUPERBATCH.search(key)
    if m is not None and m.group(1) in index and kind not in ("count", "tiers"):
        return (f"stream/superbatch-{index[m.group(1)]}", phase_tag)
    return ("stream/setup", phase_tag)


class SpannedClient:
    """A `distributed.Client` whose ``submit`` tags each task with its streamed run's spans (`stream_tags`);
    everything else is the client's own. A superbatch's task key ``train-e0-s00012-TOK`` becomes the tuple
    ``("train-e0-s00012-TOK",)`` (see `submit`)."""

    def __init__(self, client: Any, superbatch_keys: Sequence[str]) -> None:
        self._client = client
        self._index = {key: k for k, key in enumerate(superbatch_keys)}

    def submit(self, fn: Any, *args: Any, key: str, **kwargs: Any) -> Any:
        from distributed import span

        tags = stream_tags(str(key), self._index)
        # Dask puts a whole task group in the span of its first task, and a string key's group is its prefix
        # (``train``): a superbatch's tasks get a group of their own as the one-item tuple ``(key,)``, whose
        # group is the key itself while its prefix stays the kind (``train``), as the dashboard shows it
        with span(*tags):
            return self._client.submit(fn, *args, key=(key,) if tags[0] != "stream/setup" else key, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

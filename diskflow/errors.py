"""The errors diskflow raises for problems a user can fix, each one line naming what to fix.

`DiskflowError` is the base (the commands print it as ``diskflow COMMAND: error: ...`` and exit 2);
`ConfigError` names the option (``option``) and the fault (other options it names are `Setting`s: the API's
fields, the commands' flags), `InputError` the file (``path``),
`DiskFullError` the output that did not fit. `is_disk_full` tells a full disk from other I/O errors,
so a caller can say so in one line instead of a traceback.

Every floor raises these (operators, flow, the public API, the command line), so they are defined here, at
the foundation: this module imports nothing from diskflow's subpackages, and any module may import it.
"""
from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable, Sequence

__all__ = ["ConfigError", "DiskFullError", "DiskflowError", "InputError", "Setting", "is_disk_full"]


class DiskflowError(Exception):
    """A problem the user can fix (bad input, bad option, not enough budget)."""


class InputError(DiskflowError, ValueError):
    """Bad input data: names the file (or directory) and the fault. A `ValueError` too, so that a caller
    written the PyG way (``except ValueError``) catches it."""

    def __init__(self, path: str | os.PathLike[str], fault: str) -> None:
        self.path = os.fspath(path)
        self.fault = fault
        super().__init__(f"{self.path}: {fault}")

    def __reduce__(self):  # keep both fields when Dask pickles the error back to the client
        return (type(self), (self.path, self.fault))


class Setting:
    """An option with a value, named in a message: as the API's field (``batch_size=160``) where printed
    as it is, as its flag (``--batch-size 160``) where the command line renders it (`text` with a
    `flag` function, as `ConfigError.render` and the commands' log lines do). No value: the name alone.
    `note`: what a `ConfigError` choice says after it, in parentheses."""

    def __init__(self, name: str, value: object = None, note: str = "") -> None:
        self.name, self.value, self.note = name, value, note

    def named(self, flag: Callable[[str], str] | None) -> bool:
        """Whether `flag` names this option (always, for the API's fields: `flag` None)."""
        return flag is None or flag(self.name).startswith("-")

    def text(self, flag: Callable[[str], str] | None = None) -> str:
        if flag is None or not self.named(flag):    # the API's field (or an option the command has no flag for)
            return self.name if self.value is None else f"{self.name}={self.value!r}"
        shown = flag(self.name)
        if self.value is None or self.value is True:
            return shown
        if isinstance(self.value, (tuple, list)):
            return f"{shown} {','.join(str(v) for v in self.value)}"
        return f"{shown} {self.value}"

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        return f"Setting({self.name!r}, {self.value!r})"

    def __reduce__(self):
        return (type(self), (self.name, self.value, self.note))


class ConfigError(DiskflowError, ValueError):
    """A bad option or configuration value: names the option and the fault. A `ValueError` too, so that a
    caller written the PyG way (``except ValueError``) catches it.

    Other options the fault names are `Setting`s, so the API reads ``field=value`` and the command
    line its flag (`render`): `settings` stand at ``{field}`` in `fault`; `choices` (settings that
    would each do instead) at ``{choices}``, joined by "or", each with its note, less those the
    command has no flag for; where none is left, `no_choice` stands there instead.
    """

    def __init__(self, option: str, fault: str, settings: Sequence[Setting] = (), choices: Sequence[Setting] = (),
                 no_choice: str = "") -> None:
        self.option = option
        self.template = fault
        self.settings, self.choices, self.no_choice = tuple(settings), tuple(choices), no_choice
        self.fault = self.render()
        super().__init__(f"{option}: {self.fault}")

    def render(self, flag: Callable[[str], str] | None = None) -> str:
        """The fault, its settings written by `flag` (an option's flag on the command line; None: fields)."""
        if not (self.settings or self.choices or self.no_choice):
            return self.template
        named = [c for c in self.choices if c.named(flag)]
        choices = " or ".join(c.text(flag) + (f" ({c.note})" if c.note else "") for c in named)
        return self.template.format(choices=choices or self.no_choice, **{s.name: s.text(flag) for s in self.settings})

    def __reduce__(self):
        return (type(self), (self.option, self.template, self.settings, self.choices, self.no_choice))


class DiskFullError(DiskflowError):
    """The filesystem holding `path` has no room for what a command writes (ENOSPC, or a free-space check).

    `needed`/`free` are bytes when a free-space check knew them before writing (else None).
    """

    def __init__(self, path: str | os.PathLike[str], fault: str = "no space left on device",
                 needed: int | None = None, free: int | None = None) -> None:
        self.path = os.fspath(path)
        self.fault = fault
        self.needed = needed
        self.free = free
        super().__init__(f"{self.path}: {fault}")

    def __reduce__(self):
        return (type(self), (self.path, self.fault, self.needed, self.free))


_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_FULL_TEXT = ("no space left on device", "disk quota exceeded")
_SHORT_WRITE = re.compile(r"\d+ requested and \d+ written")   # numpy's tofile: a short write, no errno


def is_disk_full(exc: BaseException | None) -> bool:
    """Whether `exc` (or an exception it was raised from) means the disk or the quota is full.

    Checks `errno` (ENOSPC, EDQUOT) and, for writers that keep only the message (pyarrow's
    `ArrowIOError`, errors re-raised by Dask), the text; numpy's ``tofile`` reports a full disk
    only as a short write ("N requested and M written"). Follows `__cause__`/`__context__`.
    """
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, DiskFullError):
            return True
        if isinstance(exc, OSError) and (exc.errno in _FULL_ERRNOS or any(t in str(exc).lower() for t in _FULL_TEXT)
                                         or (exc.errno is None and _SHORT_WRITE.search(str(exc)))):
            return True
        exc = exc.__cause__ or exc.__context__
    return False

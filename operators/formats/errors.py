"""User-facing errors: the CLI prints these as one clear line, never as a traceback."""
from __future__ import annotations

import errno
import os
import re


class DiskflowError(Exception):
    """A problem the user can fix (bad input, bad option, not enough budget)."""


class InputError(DiskflowError):
    """Bad input data: names the file (or directory) and the fault."""

    def __init__(self, path: str | os.PathLike[str], fault: str) -> None:
        self.path = os.fspath(path)
        self.fault = fault
        super().__init__(f"{self.path}: {fault}")

    def __reduce__(self):  # keep both fields when Dask pickles the error back to the client
        return (type(self), (self.path, self.fault))


class ConfigError(DiskflowError):
    """A bad option or configuration value: names the option and the fault."""

    def __init__(self, option: str, fault: str) -> None:
        self.option = option
        self.fault = fault
        super().__init__(f"{option}: {fault}")

    def __reduce__(self):
        return (type(self), (self.option, self.fault))


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

"""User-facing errors: the CLI prints these as one clear line, never as a traceback."""
from __future__ import annotations

import os


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

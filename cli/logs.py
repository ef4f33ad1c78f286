"""Where the library's log records go on the command line: its progress notes (INFO, such as the Dask
dashboard's address) as plain lines on stderr, its warnings and debug records with their level and logger."""
from __future__ import annotations

import logging
import sys
from collections.abc import Callable

from ..errors import Setting

__all__ = ["FORMAT", "log_to_stderr"]

FORMAT = "%(levelname)s %(name)s: %(message)s"     # warnings and debug records, as the root logger's


class _Stderr(logging.StreamHandler):
    """Writes to the `sys.stderr` of the moment (a test that captures stderr swaps it)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


class _Format(logging.Formatter):
    """INFO records as their message alone; the others as `FORMAT`. A `Setting` among a record's arguments
    is written with its flag (`flag`: the command's flag of an option)."""

    def __init__(self, fmt: str, flag: Callable[[str], str] | None = None) -> None:
        super().__init__(fmt)
        self.flag = flag

    def format(self, record: logging.LogRecord) -> str:
        if self.flag is not None and isinstance(record.args, tuple) and \
                any(isinstance(a, Setting) for a in record.args):
            record = logging.makeLogRecord(record.__dict__)
            record.args = tuple(a.text(self.flag) if isinstance(a, Setting) else a for a in record.args or ())
        if record.levelno == logging.INFO:
            return record.getMessage()
        return super().format(record)


def log_to_stderr(verbose: bool = False, flag: Callable[[str], str] | None = None) -> None:
    """Send the `diskflow` package's log records to stderr: INFO and above (DEBUG too when `verbose`), once
    (they do not also reach the root logger's handler), options named by `flag` (the command's flags).
    Calling it again replaces the handler."""
    logger = logging.getLogger(__name__.split(".")[0])
    for old in [h for h in logger.handlers if isinstance(h, _Stderr)]:
        logger.removeHandler(old)
    handler = _Stderr()
    handler.setFormatter(_Format(FORMAT, flag))
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)
    logger.propagate = False

"""The errors diskflow raises for problems a user can fix, each one line naming what to fix.

`DiskflowError` is the base (the commands print it as ``diskflow COMMAND: error: ...`` and exit 2);
`ConfigError` names the option (``option``) and the fault (other options it names are `Setting`s: the API's
fields, the commands' flags), `InputError` the file (``path``),
`DiskFullError` the output that did not fit. `is_disk_full` tells a full disk from other I/O errors,
so a caller can say so in one line instead of a traceback.
"""
from __future__ import annotations

from .operators.formats.errors import (
    ConfigError,
    DiskflowError,
    DiskFullError,
    InputError,
    Setting,
    is_disk_full,
)

__all__ = ["ConfigError", "DiskFullError", "DiskflowError", "InputError", "Setting", "is_disk_full"]

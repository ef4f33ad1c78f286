"""Importing a user's ``.py`` file (a pipeline, a model) as a fresh module, its faults one line naming it."""
from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType

from ...errors import InputError

__all__ = ["import_user_file"]


def import_user_file(path: str | os.PathLike[str], module_name: str) -> ModuleType:
    """Import the file at `path` as the module `module_name` (registered in `sys.modules`, so pickling by
    reference finds it in this process).

    Raises:
        InputError: (naming the file) it cannot be imported, or running it raised.
    """
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise InputError(path, "cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        sys.modules.pop(module_name, None)
        raise InputError(path, f"failed to import ({type(e).__name__}: {e})") from e
    return module

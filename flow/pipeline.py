"""Finding a pipeline: a module of `diskflow.pipelines` by name, or a user's own `.py` file.

A pipeline is any module with `run(store, run_dir, **options) -> dict` (the report).
`diskflow run inmemory`, `diskflow run pipelines/inmemory.py` and `diskflow run
my_pipeline.py` all work: a path whose file name matches a built-in pipeline and that is
not a file of its own loads the built-in one.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import pkgutil
import sys
from pathlib import Path
from types import ModuleType

from ..operators.formats.errors import ConfigError, InputError

PACKAGE = "diskflow.pipelines"


def available_pipelines() -> list[str]:
    """Names of the built-in pipelines (modules of `diskflow.pipelines`), sorted."""
    package = importlib.import_module(PACKAGE)
    return sorted(m.name for m in pkgutil.iter_modules(package.__path__) if not m.name.startswith("_"))


def load_pipeline(name_or_path: str | os.PathLike[str]) -> ModuleType:
    """Import a pipeline by built-in name or from a `.py` file, checking that it defines `run`.

    Raises:
        ConfigError: unknown name (the message lists the available ones) or no `run`.
        InputError: the file exists but cannot be imported.
    """
    text = os.fspath(name_or_path)
    path = Path(text)
    looks_like_path = text.endswith(".py") or os.sep in text or "/" in text
    builtin = available_pipelines()
    if looks_like_path and path.is_file():
        module = _builtin_at(path, builtin) or _import_file(path)
    elif (path.stem if looks_like_path else text) in builtin:
        module = importlib.import_module(f"{PACKAGE}.{path.stem if looks_like_path else text}")
    else:
        what = f"no such file {text!r}" if looks_like_path else f"unknown pipeline {text!r}"
        raise ConfigError("PIPELINE", f"{what}; available: {', '.join(builtin) or '(none)'}, "
                                      "or the path of a .py file that defines run(store, run_dir, ...)")
    if not callable(getattr(module, "run", None)):
        raise ConfigError("PIPELINE", f"{text!r} defines no run(store, run_dir, ...) function")
    return module


def _builtin_at(path: Path, builtin: list[str]) -> ModuleType | None:
    """The built-in pipeline module whose source file is `path`, if it is one."""
    if path.stem not in builtin:
        return None
    module = importlib.import_module(f"{PACKAGE}.{path.stem}")
    source = getattr(module, "__file__", None)
    if source and Path(source).resolve() == path.resolve():
        return module
    return None


def _import_file(path: Path) -> ModuleType:
    """Import a user's pipeline file as a fresh module."""
    name = f"diskflow_user_pipeline_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise InputError(path, "cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        sys.modules.pop(name, None)
        raise InputError(path, f"failed to import ({type(e).__name__}: {e})") from e
    return module

"""Build script: maps the repository's top-level folders into the `diskflow` package and
compiles the native extension (C++17) from `native/*.cpp`."""
from __future__ import annotations

import ctypes.util
import os
from glob import glob

from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import setup

PACKAGES = {
    "diskflow": "diskflow",
    "diskflow.flow": "flow",
    "diskflow.flow.commands": "flow/commands",
    "diskflow.operators": "operators",
    "diskflow.native": "native",
    "diskflow.pipelines": "pipelines",
    "diskflow.bench": "bench",
}


def _have_liburing() -> bool:
    """True when liburing's header and library are installed (then io_uring is compiled in)."""
    if os.environ.get("DISKFLOW_NO_URING"):
        return False
    headers = ["/usr/include/liburing.h", "/usr/local/include/liburing.h"]
    return any(os.path.exists(h) for h in headers) and ctypes.util.find_library("uring") is not None


macros = [("DISKFLOW_HAVE_LIBURING", "1")] if _have_liburing() else []
libraries = ["uring"] if macros else []

ext = Pybind11Extension(
    "diskflow.native._native",
    sorted(glob("native/*.cpp")),
    cxx_std=17,
    define_macros=macros,
    libraries=libraries,
    extra_compile_args=["-O3", "-Wall", "-Wno-unused-function"],
    extra_link_args=["-pthread"],
)

setup(
    packages=list(PACKAGES),
    package_dir=PACKAGES,
    ext_modules=[ext],
    cmdclass={"build_ext": build_ext},
    zip_safe=False,
)

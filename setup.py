"""Build script: maps the repository's top-level folders into the `diskflow` package and
compiles the native extension (C++17) from `native/*.cpp`. It needs no system library beyond
libc: io_uring is used through the kernel's own headers and system calls (native/uring.h)."""
from __future__ import annotations

from glob import glob

from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import setup

PACKAGES = {
    "diskflow": "diskflow",
    "diskflow.flow": "flow",
    "diskflow.flow.prepare": "flow/prepare",
    "diskflow.flow.stream": "flow/stream",
    "diskflow.flow.dashboard": "flow/dashboard",
    "diskflow.flow.runtimes": "flow/runtimes",
    "diskflow.operators": "operators",
    **{f"diskflow.operators.{stage}": f"operators/{stage}" for stage in ("formats", "ingest", "prepare", "train", "stream")},
    "diskflow.cli": "cli",
    "diskflow.native": "native",
    "diskflow.pipelines": "pipelines",
    "diskflow.bench": "bench",
}


ext = Pybind11Extension(
    "diskflow.native._native",
    sorted(glob("native/*.cpp")),
    cxx_std=17,
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

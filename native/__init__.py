"""Thin Python binding over the C++ kernels in `_native` (built by `pip install`)."""
from __future__ import annotations

from . import _native

HAVE_LIBURING: bool = bool(_native.have_liburing)

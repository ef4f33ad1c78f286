# The compiled extension (native/bindings.cpp) as type checkers see it: every name is Any.
from typing import Any

def __getattr__(name: str) -> Any: ...

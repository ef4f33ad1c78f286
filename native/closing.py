"""`Closing`: a resource whose ``with`` block ends in its own ``close()`` (the reader, the packed dataset, the
loader), so that each says only how it closes, not the context-manager protocol around it again."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["Closing"]


class Closing:
    """``with obj: ...`` returns `obj` and calls ``obj.close()`` on the way out, whatever happened inside."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""Pipeline definitions, one module each (see `diskflow.flow.pipeline`)."""

__all__: list[str] = []

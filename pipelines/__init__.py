"""Pipeline definitions, one module each (see `diskflow.flow.pipeline`)."""

"""Stages as plain functions over files and arrays; testable without Dask (never imports `flow`)."""

__all__: list[str] = []

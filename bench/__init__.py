"""Benchmarks that compare implementations side by side in one run (`diskflow bench ...`)."""

__all__: list[str] = []

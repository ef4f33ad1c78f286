"""Raw data in, store out: read Arrow-partitioned raw datasets (or write them: importers, synthetic
graphs) and build the store: CSC edges, feature shards, labels and splits (docs/design.md, "Formats")."""

__all__: list[str] = []

"""The framework: Dask graphs over operators, the cluster, progress, reports and the CLI.

`flow` composes `operators` into task graphs and knows nothing about GNNs.
"""

"""The `diskflow` command line, the top floor of the package: one module per subcommand, each exposing
`register(subparsers)`, over the public Python API only (`diskflow`, `diskflow.api` and the public
modules beside it: `config`, `sizes`, `datasets`, `runs`, `cluster`, `errors`) and the benchmarks it
runs. `main` is the entry point."""
from .main import COMMANDS, build_parser, main

__all__ = ["COMMANDS", "build_parser", "main"]

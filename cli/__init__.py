"""The `diskflow` command line, the top floor of the package: one module per subcommand, each exposing
`register(subparsers)`, over the public Python API (`diskflow.api`) and the framework below it.
`main` is the entry point."""
from .main import COMMANDS, build_parser, main

__all__ = ["COMMANDS", "build_parser", "main"]

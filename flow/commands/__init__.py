"""One module per `diskflow` subcommand; each exposes `register(subparsers)`."""

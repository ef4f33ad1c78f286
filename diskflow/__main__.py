"""`python -m diskflow` is the `diskflow` command."""
from diskflow.flow.cli import main

raise SystemExit(main())

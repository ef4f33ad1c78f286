"""`python -m diskflow` is the `diskflow` command."""
from diskflow.cli import main

raise SystemExit(main())

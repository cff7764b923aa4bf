"""`python -m singpy` runs the command line."""

from singpy.cli.main import main

raise SystemExit(main())

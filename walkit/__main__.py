"""`python -m walkit` is the `walkit` command line."""

from walkit.cli import main

main()

"""`python -m flowc`: the same command line as the `flowc` script."""

from flowc.cli import main

main(prog_name="flowc")

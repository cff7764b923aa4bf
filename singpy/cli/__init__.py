"""Command line: a fast parser for run/exec/shell (and fastpull.py for pull), typer for everything else."""

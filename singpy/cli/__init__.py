"""Command line: a fast parser for run/exec/shell, typer for everything else."""

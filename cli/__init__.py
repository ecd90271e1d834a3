"""The `ggpo` command line: a thin Typer shell over the ggpo_offline library."""

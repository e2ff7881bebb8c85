"""The `memfit` command: one module per verb group, registered on one typer app.

May import: every package (the CLI is the top floor).
"""

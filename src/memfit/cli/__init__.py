"""The `memfit` command: one module per verb group, registered on one typer app (`app.py`).

Verbs: `estimate.py`; `plan.py` (plan, max-batch, max-seq); `catalog.py` (models, gpus);
`measure.py` (profile, compare); `doctor.py`; `find_batch.py`. Shared by them, in `common/`:
`exits.py` (exit codes, `fail`), `workload_options.py` (the Workload options, declared once),
`pictures.py` (`--timeline`, `--snapshot`), `script.py` (running a user's script). Verb modules
never import `app.py`.

May import: every package (the CLI is the top floor).
"""

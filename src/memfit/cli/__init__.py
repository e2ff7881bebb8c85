"""The `memfit` command: one module per verb group, registered on one typer app (`app.py`).

Verbs: `estimate.py`; `plan.py` (plan, max-batch, max-seq); `catalog.py` (models, gpus);
`measure.py` (profile, compare); `doctor.py`; `find_batch.py`. Shared by them: `_exit.py` (exit
codes, `fail`), `_workload_options.py` (the Workload options, declared once), `_pictures.py`
(`--timeline`, `--snapshot`). Verb modules never import `app.py`.

May import: every package (the CLI is the top floor).
"""

"""A run end to end: the pipeline, its report and the exports to inference engines.

- `pipeline`: `skipsearch run` as one descent: check, load, score, search, re-score, report.
- `search_step`: one strategy's study in the run directory, its scorer and strategy, the finalists' re-score.
- `preflight`: what a run checks without its model, before anything is written.
- `owner`: one command at a time writes a run directory (an OS lock).
- `compare`: `skipsearch compare`, several strategies × seeds sharing one model and cache.
- `importance_file`: the importance ranking and knapsack strategies read, kept in the run.
- `finalists`: the search's best drafts re-scored exactly (`finalists.json`).
- `cost_estimate`: what the search costs, timed as it runs (load, a trial, memory, the budget's total).
- `report`: a run directory's report files (trials.csv, best.json, summary.md, plots).
- `summary_text`: summary.md's words: the best draft, its gain, the verdict (`cost.verdict`).
- `plots`: the plots of a run and of a compare.
- `pyplot`: matplotlib for those plots, its font cache beside the cache, not under HOME.
- `compare_tables`: a compare's tables and convergence plot.
- `export`: a run's best draft as configs other engines read (`skipsearch export`).
- `export_source`: what an export is made of, read from a run directory or its best.json.
- `export_formats`: one writer, reader and set of notes per export format.
- `export_notes`: the notes' prose (`export_notes.md`) read and filled in from the run.
"""

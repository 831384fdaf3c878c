"""Numbers from runs: runs found and grouped, curves and bands, cells and verdicts, outcome classes,
statistics. Never imports matplotlib, so listing runs and the board start fast."""

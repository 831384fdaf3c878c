"""attn: one attention head by hand in numpy, and why QK^T is divided by sqrt(d_k).

The Python API is the functions named in API, each documented in README's
table with what it returns (tests/test_readme.py keeps the two the same).
Importing attn imports none of them: `from attn.config import load_config`.
"""

API = (
    "attn.config.load_config", "attn.schema.describe_schema", "attn.runstate.build", "attn.model.init_params",
    "attn.model.forward", "attn.model.loss_and_grads", "attn.reference.loss_and_grads",
    "attn.gradcheck.check_model", "attn.mechanism.row_statistics", "attn.jobs.create", "attn.jobs.execute",
    "attn.runs.read_metrics", "attn.runs.read_summary", "attn.plots.plot_run", "attn.experiment.load_experiment",
    "attn.sweep.run_experiment", "attn.report.write_report", "attn.verify.verify", "attn.compare.compare",
    "attn.listing.list_runs", "attn.outcomes.classify", "attn.stats.wilson_interval", "attn.stats.km_median",
    "attn.stats.bootstrap_interval", "attn.publish.publish",
)

"""attn: one attention head by hand in numpy, and why QK^T is divided by sqrt(d_k).

The Python API is the functions named in API, each documented in README's
table with what it returns (tests/test_readme.py keeps the two the same).
Importing attn imports none of them: `from attn.config.loading import load_config`.
"""

API = (
    "attn.config.loading.load_config", "attn.config.schema.describe_schema", "attn.store.runstate.build", "attn.model.fast.init_params",
    "attn.model.fast.forward", "attn.model.fast.loss_and_grads", "attn.model.reference.loss_and_grads",
    "attn.model.gradcheck.check_model", "attn.model.mechanism.row_statistics", "attn.train.lifecycle.create", "attn.train.lifecycle.execute",
    "attn.store.runs.read_metrics", "attn.store.runs.read_summary", "attn.train.figures.plot_run", "attn.experiment.spec.load_experiment",
    "attn.experiment.sweep.run_experiment", "attn.report.experiment_report.write_report", "attn.experiment.verify.verify", "attn.report.compare.compare",
    "attn.analysis.listing.list_runs", "attn.analysis.outcomes.classify", "attn.analysis.stats.wilson_interval", "attn.analysis.stats.km_median",
    "attn.analysis.stats.bootstrap_interval", "attn.publish.publish",
)

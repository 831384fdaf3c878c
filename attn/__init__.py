"""attn: one attention head by hand in numpy, and experiments on what dividing QK^T by sqrt(d_k) changes.

The Python API is the names in API, each documented in docs/api.md's table
(tests/test_readme.py keeps the two the same): `import attn; attn.train_run(attn.load_config(None))`.
Each is imported from where it lives on first use (module __getattr__), so
`import attn` alone loads none of attn's modules, numpy or matplotlib.
"""

# name -> the module it lives in (attribute of the same name unless given after ':')
_WHERE = {
    "load_config": "attn.config.loading",
    "describe_schema": "attn.config.schema",
    "train_run": "",  # defined below
    "read_metrics": "attn.store.runs",
    "read_summary": "attn.store.runs",
    "plot_run": "attn.train.figures",
    "list_runs": "attn.analysis.listing",
    "compare": "attn.report.compare",
    "load_experiment": "attn.experiment.spec",
    "sweep": "",  # defined below
    "write_report": "attn.report.experiment_report",
    "verify": "attn.experiment.verify",
    "build_run": "attn.store.runstate:build",
    "init_params": "attn.model.fast",
    "forward": "attn.model.fast",
    "loss_and_grads": "attn.model.fast",
    "check_model": "attn.model.gradcheck",
    "row_statistics": "attn.model.mechanism",
}
API = tuple(_WHERE)


def train_run(config, name: str | None = None):
    """Create a run directory for the config and train it (figures too, if the
    config asks), as `attn train` does; returns the run directory."""
    from attn.train import lifecycle

    run_dir = lifecycle.create(config, name=name)
    lifecycle.execute(config, run_dir)
    return run_dir


def sweep(experiment, workers: int | None = None) -> list:
    """Train every cell of the experiment not yet finished, in `workers` local
    processes (None: one per core), as `attn sweep` does before its report;
    returns what became of each cell (attn.experiment.sweep.CellAction)."""
    from attn.experiment import sweep as sweeps

    executor = sweeps.default_executor(workers)
    try:
        return sweeps.run_experiment(experiment, executor)
    finally:
        executor.shutdown()


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'attn' has no attribute {name!r}")
    import importlib

    module, _, attribute = _WHERE[name].partition(":")
    value = getattr(importlib.import_module(module), attribute or name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(API))

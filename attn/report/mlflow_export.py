"""Runs into an MLflow tracking store: a SQLite file, the backend MLflow recommends, with the artifacts in a
directory beside it, that `mlflow ui --backend-store-uri sqlite:///PATH` opens with no server and no network.

    attn export RUNS ... --mlflow PATH         PATH (SQLite), <PATH without its suffix>-artifacts/<experiment>/...

Written through MLflow's own client (the optional `mlflow` package, attn[mlflow]; mlflow-skinny with SQLAlchemy
and Alembic is enough to write). Each attn experiment (the directory of runs: exports.Found.experiment) is an
MLflow experiment of that name; each run an MLflow run named as its directory, holding:

    params     the flattened config (`model.d_k`, `optim.lr`, ...), each value as YAML writes it
    metrics    each finite metric of each metrics.jsonl record at its step, timed by the run's start plus
               the record's `wall_time`
    tags       `outcome` (summary.json's, once the run has ended), `attn.status`, `attn.run_dir`
    artifacts  config.yaml, summary.json and the run's figures
    status     FINISHED (completed, diverged), FAILED (failed), KILLED (interrupted, stale) or RUNNING

Exporting again finds each run by its tag `attn.key` (its directory's resolved path, hashed) and logs only the
records the earlier export did not hold (tag `attn.exported`: their count and a hash of them), so a run still
training gains its newer steps and a finished one gains nothing. A run whose earlier records or config changed
since (resumed from an earlier checkpoint, extended) is replaced: the old MLflow run deleted (`mlflow gc`
removes it for good), a new one made.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

from attn.config.yamlio import yaml_line
from attn.report.exports import DestinationError, Exported, Found, Written, missing
from attn.store import runs

try:  # the optional mlflow package: write_to_store says how to install it when it is missing
    from mlflow.entities import Metric, Param, RunTag, ViewType
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient
except ImportError:
    MlflowClient = None

SQLITE_HEADER = b"SQLite format 3\x00"
STATUSES = {"completed": "FINISHED", "diverged": "FINISHED", "failed": "FAILED", "interrupted": "KILLED"}
BATCH = 1000  # MLflow takes at most 1000 metrics, 100 params and 100 tags in one log_batch
PARAMS_BATCH = 100


def require_mlflow() -> None:
    """MissingLibrary unless mlflow is installed."""
    if MlflowClient is None:
        raise missing("mlflow", "mlflow")


def tracking_uri(path: Path) -> str:
    return f"sqlite:///{Path(path).resolve()}"


def artifacts_root(path: Path) -> Path:
    path = Path(path).resolve()
    return path.with_name(f"{path.stem}-artifacts")


def params(found: Found) -> dict[str, str]:
    """The flattened config, each value as YAML writes it on one line (`null`, `0.5`, `{}`)."""
    return {key: yaml_line(value) for key, value in found.run.settings.items()}


def run_key(found: Found) -> str:
    return hashlib.sha256(str(found.run.path.resolve()).encode()).hexdigest()[:32]


def records_digest(records: list[dict]) -> str:
    """The records' count and a hash of their content: what an export held."""
    text = "\n".join(json.dumps(record, sort_keys=True) for record in records)
    return f"{len(records)} {hashlib.sha256(text.encode()).hexdigest()[:32]}"


def held_before(exported: str | None, records: list[dict]) -> int | None:
    """How many of the records an earlier export (its `attn.exported` tag) already holds; None if they changed."""
    try:
        count = int((exported or "").split(" ", 1)[0])
    except ValueError:
        return None
    return count if count <= len(records) and records_digest(records[:count]) == exported else None


def status_of(found: Found) -> str:
    return "RUNNING" if found.run.status == "running" else STATUSES.get(found.run.status, "KILLED")


def _experiment_id(client, found: Found, root: Path) -> str:
    experiment = client.get_experiment_by_name(found.experiment)
    if experiment is None:
        location = (root / found.experiment).as_uri()
        return client.create_experiment(found.experiment, artifact_location=location)
    if experiment.lifecycle_stage == "deleted":
        client.restore_experiment(experiment.experiment_id)
    return experiment.experiment_id


def export_run(client, found: Found, root: Path) -> Written:
    """The run into its MLflow experiment: a new MLflow run, or the records and files an earlier export of it
    lacks."""
    experiment_id = _experiment_id(client, found, root)
    key, records, wanted = run_key(found), found.run.records, params(found)
    earlier = client.search_runs(
        [experiment_id], f"tags.`attn.key` = '{key}'", run_view_type=ViewType.ACTIVE_ONLY, max_results=10
    )
    held, run_id = None, None
    for old in earlier:
        count = held_before(old.data.tags.get("attn.exported"), records) if old.data.params == wanted else None
        if count is None or run_id is not None:  # changed since, or a second one (two exports at once)
            client.delete_run(old.info.run_id)
        else:
            held, run_id = count, old.info.run_id
    if run_id is None:
        held = 0
        start = int(found.started * 1000)
        tags = {"attn.key": key}  # from the start, so that an export killed before its end is found and replaced
        run_id = client.create_run(experiment_id, start_time=start, tags=tags, run_name=found.name.name).info.run_id
        pairs = [Param(name, value) for name, value in wanted.items()]
        for at in range(0, len(pairs), PARAMS_BATCH):
            client.log_batch(run_id, params=pairs[at : at + PARAMS_BATCH])
    metrics = [
        Metric(name, float(value), int(found.wall_time(record) * 1000), record["step"])
        for record in records[held:]
        for name, value in record.items()
        if name != "step" and runs.is_finite_number(value)
    ]
    for at in range(0, len(metrics), BATCH):
        client.log_batch(run_id, metrics=metrics[at : at + BATCH])
    tags = {
        "attn.key": key,
        "attn.run_dir": str(found.run.path.resolve()),
        "attn.status": found.run.status,
        "attn.exported": records_digest(records),
    }
    if found.outcome:
        tags["outcome"] = found.outcome
    client.log_batch(run_id, tags=[RunTag(name, value) for name, value in tags.items()])
    for path in [found.run.path / "config.yaml", found.run.path / "summary.json", *found.figures]:
        if path.is_file():
            client.log_artifact(run_id, str(path))
    status = status_of(found)
    if status == "RUNNING":
        client.update_run(run_id, status=status)
    else:
        updated = found.run.summary.get("updated_at")
        end = updated if runs.is_finite_number(updated) else found.wall_time(records[-1]) if records else found.started
        client.set_terminated(run_id, status=status, end_time=int(end * 1000))
    return Written(
        found, f"{found.experiment}/{found.name.name} (MLflow run {run_id})", len(records), len(records) - held
    )


def open_store(path: Path):
    """An MlflowClient on the SQLite store at path (made, with its tables, if it does not exist); DestinationError for
    a path that is no SQLite file or cannot be opened."""
    require_mlflow()
    path = Path(path)
    if path.exists():
        try:
            with open(path, "rb") as file:
                header = file.read(len(SQLITE_HEADER))
        except OSError as err:
            raise DestinationError(f"cannot be read: {runs.describe_os_error(err)}; choose another file") from None
        if header and header != SQLITE_HEADER:
            raise DestinationError(
                "is not an SQLite database (an MLflow store this export wrote is one); choose a new file or a store"
            )
    path.parent.mkdir(parents=True, exist_ok=True)
    for name in ("mlflow", "alembic"):  # their INFO lines (creating tables, migrating) would print
        logging.getLogger(name).setLevel(logging.WARNING)
    client = MlflowClient(tracking_uri=tracking_uri(path))
    try:
        client.search_experiments(max_results=1)  # opens the store, creating its tables in a new one
    except MlflowException as err:
        raise DestinationError(f"cannot be opened as an MLflow store: {' '.join(str(err).split())[:300]}") from None
    return client


def write_to_store(found: list[Found], path: Path) -> Exported:
    """Each run (exports.find_runs) into the SQLite store at path and its artifacts beside it. MissingLibrary
    without mlflow; DestinationError when the store cannot be opened or written."""
    client = open_store(path)
    root = artifacts_root(path)
    written = []
    for one in found:
        try:
            written.append(export_run(client, one, root))
        except MlflowException as err:
            raise DestinationError(f"cannot be written: {' '.join(str(err).split())[:300]}") from None
    return Exported(written, [])

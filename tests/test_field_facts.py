"""Every fact about a config field is declared once, on the field (attn.config.schema.config_field): a field
added to the schema is followed by stacking, forking and grouping as its declaration says, with no list kept
elsewhere."""

import dataclasses
from pathlib import Path

import pytest
from helpers import TINY

from attn.analysis import grouping
from attn.config import loading, schema
from attn.config.yamlio import ConfigError
from attn.train import lifecycle, stack


def add_field(monkeypatch, **facts) -> type:
    """The schema with one more optimiser field, optim.extra, declaring `facts`; returns its Config."""
    extra = schema.config_field(1.0, "a field this test adds", gt=0, **facts)
    optim = dataclasses.make_dataclass(
        "OptimConfig", [("extra", float, extra)], bases=(schema.OptimConfig,), frozen=True
    )
    config = dataclasses.make_dataclass(
        "Config",
        [("optim", optim, dataclasses.field(default_factory=optim, metadata=dict(help="the optimiser")))],
        bases=(schema.Config,),
        frozen=True,
    )
    for module in (schema, loading, lifecycle):
        monkeypatch.setattr(module, "Config", config)
    return config


def with_extra(value: float, *overrides: str):
    return loading.load_config(None, [*TINY, *overrides, f"optim.extra={value}"])


@pytest.mark.parametrize("per_member", [True, False])
def test_stacking_follows_a_new_fields_per_member(monkeypatch, per_member):
    add_field(monkeypatch, per_member=per_member)
    assert ("optim.extra" in schema.per_member_keys()) is per_member
    assert (stack.stack_key(with_extra(1.0)) == stack.stack_key(with_extra(2.0))) is per_member


@pytest.mark.parametrize("forkable", [True, False, "the test says so"])
def test_forking_follows_a_new_fields_forkable(monkeypatch, tmp_path, forkable):
    add_field(monkeypatch, forkable=forkable)
    config = with_extra(1.0, f"runs_dir={tmp_path}", "train.steps=4", "logging.checkpoint_every=2")
    source = lifecycle.create(config, name="source")
    assert lifecycle.execute(config, source)["status"] == "completed"
    if forkable is True:
        assert lifecycle.plan_fork(source, 2, ["optim.extra=2"]).changes == ["optim.extra: 1.0 -> 2.0"]
        return
    with pytest.raises(ConfigError) as info:
        lifecycle.plan_fork(source, 2, ["optim.extra=2"])
    assert "optim.extra: 1.0 -> 2.0" in str(info.value)
    assert (forkable or "shapes") in str(info.value)


@pytest.mark.parametrize("fact", ["neutral", "replicate", None])
def test_grouping_follows_a_new_fields_neutral_and_replicate(monkeypatch, fact):
    add_field(monkeypatch, **({fact: True} if fact else {}))
    settings = loading.flatten_config(schema.to_dict(with_extra(1.0)))
    loaded = [
        grouping.Run(Path(f"runs/{value}"), {**settings, "optim.extra": value, "seed": seed}, [], {}, "completed")
        for seed in (0, 1)
        for value in (1.0, 2.0)
    ]
    groups = grouping.group_runs(loaded)
    assert len(groups) == (1 if fact else 2)
    assert [g.label for g in groups] == (["extra=1", "extra=2"] if fact is None else [groups[0].label])
    columns = grouping.table_keys(loaded)
    assert ("optim.extra" in columns) is (fact != "neutral")
    if fact == "replicate":
        assert columns[-2:] in (["seed", "optim.extra"], ["optim.extra", "seed"])

"""Attention against context length: a trained run asked about longer contexts than it saw.

For a retrieval run, its final model (the last checkpoint, through
attn.store.runstate.prepare) is evaluated on retrieval with P pairs for each P
asked: a fresh batch of EVAL_EXAMPLES sequences drawn with a generator
seeded by (the run's seed, P), so every arm sees the same sequences. On it:
the eval accuracy and the attention mass on the queried key
(attn.model.fast.diagnostics' target_attn). A fixed scale s spreads that mass
over more keys as P grows; a length-aware scale s ln(n) (score mode
log_length) is meant to hold it.

Only a model whose positions do not fix its length can be asked (positional
none or sinusoidal), and P may not exceed task.n_keys (keys are distinct
within a sequence): attn.experiment.report_spec.check_lengths, when the experiment file is read.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from attn.config.loading import build_spec, build_task
from attn.config.schema import Config
from attn.model import fast
from attn.store import runstate

EVAL_EXAMPLES = 512


def at_lengths(run_dir: Path, config: Config, pairs: list[int]) -> dict[int, dict[str, float]]:
    """P -> {accuracy, target_attn} of the run's final model on retrieval with P pairs."""
    state = runstate.prepare(config, run_dir, resume=True)
    out = {}
    for P in pairs:
        longer = dataclasses.replace(config, task=dataclasses.replace(config.task, n_pairs=P))
        task = build_task(longer)
        spec = build_spec(longer, task)
        batch = task.sample(np.random.default_rng([config.seed, P]), EVAL_EXAMPLES)
        _, cache = fast.forward(state.params, spec, batch, buffers=state.buffers)
        stats = fast.diagnostics(cache, batch)
        out[P] = {"accuracy": stats["accuracy"], "target_attn": stats["target_attn"]}
    return out

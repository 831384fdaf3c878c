"""Attention against context length: a trained run asked about longer contexts than it saw.

For a retrieval run, its final model (the last checkpoint, through
attn.train.prepare) is evaluated on retrieval with P pairs for each P
asked: a fresh batch of EVAL_EXAMPLES sequences drawn with a generator
seeded by (the run's seed, P), so every arm sees the same sequences. On it:
the eval accuracy and the attention mass on the queried key
(attn.model.diagnostics' target_attn). A fixed scale s spreads that mass
over more keys as P grows; a length-aware scale s ln(n) (score mode
log_length) is meant to hold it.

Only a model whose positions do not fix its length can be asked (positional
none or sinusoidal), and P may not exceed task.n_keys (keys are distinct
within a sequence).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from attn import model, train
from attn.config import Config
from attn.yamlio import ConfigError

EVAL_EXAMPLES = 512


def check(config: Config, pairs: list[int], source: str) -> None:
    """One line if this run's model cannot be asked about these lengths."""
    if config.task.name != "retrieval" or config.model.positional == "learned":
        raise ConfigError(f"{source}: lengths: a retrieval model whose positions do not fix its length "
                          f"(model.positional none or sinusoidal) is needed; this one is {config.task.name} with "
                          f"positional {config.model.positional}")
    if max(pairs) > config.task.n_keys:
        raise ConfigError(f"{source}: lengths: got {max(pairs)} pairs; expected at most task.n_keys "
                          f"({config.task.n_keys}), since keys are distinct within a sequence")


def at_lengths(run_dir: Path, config: Config, pairs: list[int]) -> dict[int, dict[str, float]]:
    """P -> {accuracy, target_attn} of the run's final model on retrieval with P pairs."""
    state = train.prepare(config, run_dir, resume=True)
    out = {}
    for P in pairs:
        longer = dataclasses.replace(config, task=dataclasses.replace(config.task, n_pairs=P))
        task = train.build_task(longer)
        spec = train.build_spec(longer, task)
        batch = task.sample(np.random.default_rng([config.seed, P]), EVAL_EXAMPLES)
        _, cache = model.forward(state.params, spec, batch, buffers=state.buffers)
        stats = model.diagnostics(cache, batch)
        out[P] = {"accuracy": stats["accuracy"], "target_attn": stats["target_attn"]}
    return out

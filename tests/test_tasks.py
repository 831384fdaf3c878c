"""The task generators: every batch says what the task's docstring says, and
the no-retrieval reference loss is what sampled batches give."""

import math

import numpy as np
import pytest

from attn.tasks import CopyTask, RetrievalTask

B = 256


def retrieval_batch(task: RetrievalTask, seed: int = 0, batch_size: int = B):
    return task.sample(np.random.default_rng(seed), batch_size)


@pytest.fixture
def retrieval():
    return RetrievalTask(n_keys=12, n_values=5, n_pairs=7)


def test_retrieval_shapes_dtypes_and_vocabularies(retrieval):
    batch = retrieval_batch(retrieval)
    T = retrieval.seq_len
    assert T == retrieval.n_pairs + 1 and retrieval.n_classes == retrieval.n_values
    assert batch.tokens.shape == (B, T, len(retrieval.fields)) and batch.tokens.dtype == np.int64
    assert batch.targets.shape == batch.target_mask.shape == batch.target_key.shape == (B, T)
    assert batch.targets.dtype == batch.target_key.dtype == np.int64 and batch.target_mask.dtype == bool
    for f, (_, vocab) in enumerate(retrieval.fields):
        assert 0 <= batch.tokens[..., f].min() and batch.tokens[..., f].max() < vocab
    assert 0 <= batch.targets.min() and batch.targets.max() < retrieval.n_classes


@pytest.mark.parametrize("n_keys, n_pairs", [(12, 7), (6, 6), (9, 1)])
def test_retrieval_keys_are_distinct_within_a_sequence(n_keys, n_pairs):
    batch = retrieval_batch(RetrievalTask(n_keys=n_keys, n_values=3, n_pairs=n_pairs))
    context_keys = np.sort(batch.tokens[:, :n_pairs, 0], axis=1)  # (B, P)
    assert np.all(np.diff(context_keys, axis=1) > 0)


def test_retrieval_query_asks_for_a_context_key_and_the_target_is_its_value(retrieval):
    batch = retrieval_batch(retrieval)
    P = retrieval.n_pairs
    keys, values = batch.tokens[:, :P, 0], batch.tokens[:, :P, 1]  # (B, P)
    query = batch.tokens[:, P, 0]  # (B,)
    matches = keys == query[:, None]  # (B, P)
    assert np.all(matches.sum(axis=1) == 1), "the query key appears exactly once among the context keys"
    where = matches.argmax(axis=1)
    rows = np.arange(B)
    assert np.all(batch.targets[:, P] == values[rows, where])
    assert np.all(batch.target_key[:, P] == where)
    assert np.all(batch.tokens[:, P, 1] == retrieval.n_values), "the query carries the marker, not a value"
    assert np.all(values < retrieval.n_values)


def test_retrieval_only_the_query_position_has_a_target(retrieval):
    batch = retrieval_batch(retrieval)
    expected_mask = np.zeros((B, retrieval.seq_len), dtype=bool)
    expected_mask[:, -1] = True
    assert np.array_equal(batch.target_mask, expected_mask)
    assert np.all(batch.target_key[:, :-1] == -1)


def test_retrieval_asks_for_every_pair_and_uses_every_value(retrieval):
    batch = retrieval_batch(retrieval, batch_size=2000)
    P = retrieval.n_pairs
    assert set(batch.target_key[:, P]) == set(range(P))
    assert set(batch.targets[:, P]) == set(range(retrieval.n_values))
    assert set(batch.tokens[:, :P, 0].ravel()) == set(range(retrieval.n_keys))


@pytest.mark.parametrize("n_values, n_pairs", [(3, 5), (16, 8), (4, 1), (2, 12)])
def test_no_retrieval_loss_matches_sampled_batches(n_values, n_pairs):
    """E[-ln(c / P)], c = how often the target value occurs among the P context values."""
    task = RetrievalTask(n_keys=n_pairs, n_values=n_values, n_pairs=n_pairs)
    batch = retrieval_batch(task, seed=3, batch_size=100_000)
    values = batch.tokens[:, :n_pairs, 1]  # (N, P)
    target = batch.targets[:, n_pairs]  # (N,)
    count = (values == target[:, None]).sum(axis=1)  # (N,) >= 1: the queried pair itself
    losses = -np.log(count / n_pairs)
    standard_error = losses.std() / math.sqrt(losses.size)
    reference = task.reference_losses()
    assert abs(losses.mean() - reference["no_retrieval"]) <= 5 * standard_error
    assert reference["chance"] == pytest.approx(math.log(n_values))
    assert 0 <= reference["no_retrieval"] < reference["chance"]


def expected_copy_targets(tokens: np.ndarray, mode: str, shift: int) -> np.ndarray:
    """What the docstring says, written with array reversal and rolling."""
    if mode == "reverse":
        return tokens[:, ::-1, 0]
    return np.roll(tokens[..., 0], -shift, axis=1)  # result[i] = tokens[(i + shift) mod T]


@pytest.mark.parametrize("mode, shift", [("reverse", 1), ("shift", 1), ("shift", 3), ("shift", 9)])
def test_copy_target_is_the_input_at_the_permutation(mode, shift):
    task = CopyTask(vocab_size=7, length=6, mode=mode, shift=shift)
    batch = task.sample(np.random.default_rng(0), B)
    T = task.seq_len
    assert batch.tokens.shape == (B, T, 1) and batch.tokens.dtype == np.int64
    assert 0 <= batch.tokens.min() and batch.tokens.max() < task.vocab_size == task.n_classes
    assert np.array_equal(batch.targets, expected_copy_targets(batch.tokens, mode, shift))
    assert batch.target_mask.dtype == bool and batch.target_mask.all()
    rows = np.arange(B)[:, None]
    assert np.array_equal(batch.targets, batch.tokens[rows, batch.target_key, 0])
    assert np.array_equal(batch.target_key, np.broadcast_to(task.source_positions(), (B, T)))
    assert sorted(task.source_positions()) == list(range(T)), "a permutation of the positions"
    assert task.reference_losses() == {"chance": pytest.approx(math.log(task.vocab_size))}


@pytest.mark.parametrize(
    "task",
    [RetrievalTask(n_keys=10, n_values=4, n_pairs=6), CopyTask(vocab_size=5, length=7, mode="shift", shift=2)],
    ids=["retrieval", "copy"],
)
def test_same_seed_same_batch_different_seed_different_batch(task):
    np.random.seed(1)
    first = task.sample(np.random.default_rng(42), 64)
    np.random.seed(2)  # the global RNG must play no part
    again = task.sample(np.random.default_rng(42), 64)
    other = task.sample(np.random.default_rng(43), 64)
    for name in ("tokens", "targets", "target_mask", "target_key"):
        assert np.array_equal(getattr(first, name), getattr(again, name)), name
    assert not np.array_equal(first.tokens, other.tokens)


@pytest.mark.parametrize(
    "task",
    [RetrievalTask(16, 16, 8), RetrievalTask(40, 5, 12), CopyTask(10, 16), CopyTask(7, 5, "shift", 2)],
    ids=lambda t: t.name,
)
def test_a_stack_draws_each_members_batch_as_sample_does(task):
    """sample_stack assembles once for the stack; member m's batch is sample's from its own generator."""
    stacked = task.sample_stack([np.random.default_rng(seed) for seed in (4, 5, 6)], 32)
    for m, seed in enumerate((4, 5, 6)):
        alone = task.sample(np.random.default_rng(seed), 32)
        for field in ("tokens", "targets", "target_mask", "target_key"):
            assert np.array_equal(getattr(stacked, field)[m], getattr(alone, field)), field
            assert getattr(stacked, field).dtype == getattr(alone, field).dtype

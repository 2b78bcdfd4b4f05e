"""Tests for the sum tree and the prioritized replay buffer."""

import chex
import gymnasium as gym
import jax
import numpy as np
import pytest
from helpers import BOX4

from jaxasync import DQN, DQNConfig, ReplaySource, Transition
from jaxasync.replay.prioritized import PrioritizedReplayBuffer, linear_beta
from jaxasync.replay.sum_tree import SumTree


def _example():
  return {"x": np.zeros((2,), np.float32), "id": np.zeros((), np.int64)}


def _chunk(ids):
  ids = np.asarray(ids, np.int64)
  return {"x": np.stack([ids, -ids], axis=1).astype(np.float32), "id": ids}


# --- SumTree -----------------------------------------------------------------
def test_find_is_proportional_to_values():
  tree = SumTree(5)  # padded to 8 leaves: padding must never be found
  values = np.array([1.0, 2.0, 3.0, 4.0, 0.0])
  tree.update(np.arange(5), values)
  n = 100_000
  targets = np.random.default_rng(0).uniform(0.0, tree.total, size=n)
  counts = np.bincount(tree.find(targets), minlength=8)
  assert counts.shape == (8,)  # nothing outside [0, capacity)
  assert counts[4] == 0 and counts[5:].sum() == 0
  expected = n * values[:4] / values.sum()
  chi2 = np.sum((counts[:4] - expected) ** 2 / expected)
  assert chi2 < 16.3  # 99.9% quantile of chi-square with 3 degrees of freedom


def test_find_guards_targets_at_or_past_total():
  tree = SumTree(6)
  tree.update(np.arange(6), [0.0, 0.1, 0.2, 0.0, 0.3, 0.0])  # empty first and last leaves
  total = tree.total
  targets = np.array([-1.0, 0.0, total, np.nextafter(total, np.inf), 2 * total, np.inf])
  found = tree.find(targets)
  np.testing.assert_array_equal(found, [1, 1, 4, 4, 4, 4])
  assert np.all(tree.get(found) > 0)


def test_find_on_empty_tree_raises():
  with pytest.raises(ValueError, match="total is 0"):
    SumTree(3).find(np.array([0.0]))


def test_capacity_one_tree():
  tree = SumTree(1)
  tree.update(np.array([0]), np.array([2.5]))
  assert tree.total == 2.5
  np.testing.assert_array_equal(tree.find(np.array([0.0, 2.4, 3.0])), [0, 0, 0])


def test_vectorized_update_matches_naive_with_duplicates():
  rng = np.random.default_rng(1)
  capacity = 37
  tree, naive = SumTree(capacity), np.zeros(capacity)
  written_max = 0.0
  for _ in range(50):
    indices = rng.integers(0, capacity, size=20)  # duplicates are likely
    values = rng.uniform(0.0, 5.0, size=20)
    tree.update(indices, values)
    written_max = max(written_max, values.max())
    for i, v in zip(indices, values):  # sequential writes: the last one wins
      naive[i] = v
    np.testing.assert_array_equal(tree.get(np.arange(capacity)), naive)
  # Every internal node is the sum of its children, recomputed not incremented.
  nodes, width = tree._nodes, tree._width
  np.testing.assert_allclose(nodes[1:width], nodes[2:2 * width:2] + nodes[3:2 * width:2], rtol=0)
  np.testing.assert_allclose(tree.total, naive.sum(), rtol=1e-12)
  assert tree.max == written_max  # running max of every value written


def test_total_after_many_updates():
  rng = np.random.default_rng(2)
  tree, naive = SumTree(1000), np.zeros(1000)
  for _ in range(200):
    indices = rng.choice(1000, size=64, replace=False)
    values = rng.exponential(size=64) * 10.0 ** rng.integers(-6, 6)
    tree.update(indices, values)
    naive[indices] = values
  np.testing.assert_allclose(tree.total, naive.sum(), rtol=1e-12)
  tree.update(np.arange(1000), np.zeros(1000))
  assert tree.total == 0.0  # no drift left behind


def test_tree_rejects_bad_input():
  tree = SumTree(4)
  with pytest.raises(ValueError, match=r"\[0, 4\)"):
    tree.update(np.array([4]), np.array([1.0]))
  with pytest.raises(ValueError, match="finite and >= 0"):
    tree.update(np.array([0]), np.array([-1.0]))
  with pytest.raises(ValueError, match="finite and >= 0"):
    tree.update(np.array([0]), np.array([np.nan]))


# --- PrioritizedReplayBuffer -------------------------------------------------
def test_new_items_enter_at_max_priority():
  buf = PrioritizedReplayBuffer(_example(), capacity=8, alpha=1.0, eps=0.0)
  slots = buf.add(_chunk([0, 1, 2]))
  np.testing.assert_array_equal(buf.sum_tree.get(slots), [1.0, 1.0, 1.0])
  _, indices, _, gens = buf.sample(3)
  buf.update_priorities(indices, np.full(3, 7.0), gens)
  assert buf.max_priority == 7.0
  new = buf.add(_chunk([3, 4]))
  np.testing.assert_array_equal(buf.sum_tree.get(new), [7.0, 7.0])
  buf.update_priorities(new, np.array([0.5, 0.5]), buf.generation[new])
  assert buf.max_priority == 7.0  # a running max: lower priorities do not lower it
  np.testing.assert_array_equal(buf.sum_tree.get(buf.add(_chunk([5]))), [7.0])
  assert buf.sum_tree.get(np.array([6, 7])).sum() == 0.0  # never written


def test_importance_weights_match_hand_computation():
  # alpha = 0.5, eps = 0: priorities 1, 4, 9, 16 are stored as 1, 2, 3, 4, so
  # P = [0.1, 0.2, 0.3, 0.4] and N * P = [0.4, 0.8, 1.2, 1.6] with N = 4.
  buf = PrioritizedReplayBuffer(_example(), capacity=4, alpha=0.5, beta=0.5, eps=0.0)
  slots = buf.add(_chunk([10, 11, 12, 13]))
  buf.update_priorities(slots, np.array([1.0, 4.0, 9.0, 16.0]), buf.generation[slots])
  np.testing.assert_allclose(buf.sum_tree.get(slots), [1.0, 2.0, 3.0, 4.0])
  # (N * P)^-0.5 by hand: 0.4^-0.5, 0.8^-0.5, 1.2^-0.5, 1.6^-0.5.
  unnormalized = np.array([1.5811388, 1.1180340, 0.9128709, 0.7905694])
  seen = set()
  for _ in range(20):
    batch, indices, weights, gens = buf.sample(4)
    chex.assert_shape(weights, (4,))
    chex.assert_type([indices, weights, gens], [np.int64, np.float32, np.int64])
    expected = unnormalized[indices] / unnormalized[indices].max()
    np.testing.assert_allclose(weights, expected, rtol=1e-6)
    assert weights.max() == 1.0
    np.testing.assert_array_equal(batch["id"], 10 + indices)
    np.testing.assert_array_equal(gens, [1, 1, 1, 1])
    seen.update(indices.tolist())
  assert seen == {0, 1, 2, 3}
  # beta = 1 from the argument overrides the attribute: w = 1 / (N P), over max.
  _, indices, weights, _ = buf.sample(4, beta=1.0)
  inv = 1.0 / np.array([0.4, 0.8, 1.2, 1.6])
  np.testing.assert_allclose(weights, inv[indices] / inv[indices].max(), rtol=1e-6)


def test_stratified_sampling_follows_priorities():
  buf = PrioritizedReplayBuffer(_example(), capacity=4, alpha=1.0, eps=0.0)
  slots = buf.add(_chunk([0, 1, 2, 3]))
  buf.update_priorities(slots, np.array([0.0, 0.0, 3.0, 1.0]), buf.generation[slots])
  _, indices, _, _ = buf.sample(4)
  # Stratified: the four equal segments of [0, 4) fall 3 in slot 2 and 1 in slot 3.
  np.testing.assert_array_equal(indices, [2, 2, 2, 3])


def test_eps_keeps_zero_priority_items_sampleable():
  buf = PrioritizedReplayBuffer(_example(), capacity=2, alpha=0.5, eps=1e-2)
  slots = buf.add(_chunk([0, 1]))
  buf.update_priorities(slots, np.zeros(2), buf.generation[slots])
  np.testing.assert_allclose(buf.sum_tree.get(slots), [0.1, 0.1])


def test_update_of_overwritten_slot_is_ignored():
  buf = PrioritizedReplayBuffer(_example(), capacity=4, alpha=1.0, eps=0.0)
  buf.add(_chunk([0, 1, 2, 3]))
  _, indices, _, gens = buf.sample(4)
  before = buf.sum_tree.get(np.arange(4))
  buf.add(_chunk([4, 5, 6, 7]))  # wraps around: every sampled slot now holds a newer item
  np.testing.assert_array_equal(buf.generation, [2, 2, 2, 2])
  assert buf.update_priorities(indices, np.full(4, 100.0), gens) == 0
  np.testing.assert_array_equal(buf.sum_tree.get(np.arange(4)), before)
  assert buf.max_priority == 1.0


def test_partially_overwritten_batch_updates_only_live_slots():
  buf = PrioritizedReplayBuffer(_example(), capacity=4, alpha=1.0, eps=0.0)
  buf.add(_chunk([0, 1, 2, 3]))
  indices = np.array([0, 1, 2, 3])
  gens = buf.generation[indices].copy()
  buf.add(_chunk([4, 5]))  # overwrites slots 0 and 1
  applied = buf.update_priorities(indices, np.array([5.0, 6.0, 7.0, 8.0]), gens)
  assert applied == 2
  np.testing.assert_array_equal(buf.sum_tree.get(indices), [1.0, 1.0, 7.0, 8.0])
  assert buf.max_priority == 8.0
  # A batch drawn with replacement repeats slots: the last entry wins.
  gens = buf.generation[[2, 3, 2]]
  assert buf.update_priorities(np.array([2, 3, 2]), np.array([1.0, 2.0, 3.0]), gens) == 3
  np.testing.assert_array_equal(buf.sum_tree.get(np.array([2, 3])), [3.0, 2.0])


def test_wrap_around_with_chunk_larger_than_capacity():
  buf = PrioritizedReplayBuffer(_example(), capacity=3, alpha=1.0, eps=0.0)
  slots = buf.add(_chunk([0, 1, 2, 3, 4]))  # only 2, 3, 4 survive
  np.testing.assert_array_equal(slots, [0, 1, 2])
  slots = buf.add(_chunk([5, 6]))
  np.testing.assert_array_equal(slots, [0, 1])
  assert len(buf) == 3 and buf.added_total == 7
  np.testing.assert_array_equal(buf.generation, [2, 2, 1])
  assert buf.sum_tree.total == 3.0
  batch, indices, weights, gens = buf.sample(3)
  np.testing.assert_array_equal(batch["id"], np.array([5, 6, 4])[indices])
  np.testing.assert_array_equal(weights, np.ones(3, np.float32))  # equal priorities
  np.testing.assert_array_equal(gens, buf.generation[indices])


def test_bad_arguments_raise():
  buf = PrioritizedReplayBuffer(_example(), capacity=4)
  slots = buf.add(_chunk([0, 1]))
  gens = buf.generation[slots]
  with pytest.raises(ValueError, match="cannot sample 3 items from a replay holding 2"):
    buf.sample(3)
  for bad in (-1.0, np.nan, np.inf):
    with pytest.raises(ValueError, match="finite and >= 0"):
      buf.update_priorities(slots, np.array([1.0, bad]), gens)
  with pytest.raises(ValueError, match="same shape"):
    buf.update_priorities(slots, np.ones(3), gens)
  with pytest.raises(ValueError, match=r"\[0, 4\)"):
    buf.update_priorities(np.array([0, 4]), np.ones(2), np.ones(2, np.int64))
  with pytest.raises(ValueError, match="beta"):
    buf.beta = -0.1
  with pytest.raises(ValueError, match="alpha"):
    PrioritizedReplayBuffer(_example(), capacity=4, alpha=-1.0)


def test_state_dict_round_trip():
  buf = PrioritizedReplayBuffer(_example(), capacity=5, seed=3, alpha=0.7)
  slots = buf.add(_chunk(np.arange(7)))
  buf.update_priorities(slots, np.arange(5, dtype=np.float64) * 2, buf.generation[slots])
  buf.beta = 0.8
  state = buf.state_dict()
  other = PrioritizedReplayBuffer(_example(), capacity=5, seed=99, alpha=0.7)
  other.load_state_dict(state)
  assert other.max_priority == buf.max_priority == 8.0 and other.beta == 0.8
  np.testing.assert_array_equal(other.generation, buf.generation)
  a, b = buf.sample(4), other.sample(4)
  chex.assert_trees_all_equal(a, b)
  with pytest.raises(ValueError, match="alpha"):
    PrioritizedReplayBuffer(_example(), capacity=5, alpha=0.6).load_state_dict(state)


def test_linear_beta():
  assert linear_beta(0, 100, 0.4) == pytest.approx(0.4)
  assert linear_beta(50, 100, 0.4) == pytest.approx(0.7)
  assert linear_beta(100, 100, 0.4) == 1.0
  assert linear_beta(1000, 100, 0.4) == 1.0
  with pytest.raises(ValueError):
    linear_beta(0, 0, 0.4)


def test_each_of_k_batches_is_stratified_over_the_whole_buffer():
  """k batches drawn together are k independent stratified batches: each one spans the
  buffer (not one age band each) and has its own weight normalisation (max 1)."""
  replay = PrioritizedReplayBuffer(_example(), 1000, seed=0, alpha=1.0, eps=0.0)
  replay.add(_chunk(np.arange(1000)))
  replay.update_priorities(np.arange(1000), np.linspace(0.01, 10.0, 1000),
                           replay._generation[np.arange(1000)].copy())
  _, idx, weights, _ = replay.sample(8, beta=1.0, num_batches=4)
  assert idx.shape == weights.shape == (32,)
  mass = np.cumsum(np.linspace(0.01, 10.0, 1000))
  segment = np.searchsorted(mass, mass[-1] * (np.arange(8) + 1) / 8)  # last slot of each stratum
  for j in range(4):
    block = idx[8 * j:8 * (j + 1)]
    # item i of every batch lies in stratum i of the priority mass
    assert np.all(block <= segment) and np.all(block[1:] >= segment[:-1])  # (a slot may
    # straddle two strata)
    assert weights[8 * j:8 * (j + 1)].max() == 1.0
  # One batch from the same RNG state equals the first block of a k-batch draw.
  a = PrioritizedReplayBuffer(_example(), 10, seed=3)
  b = PrioritizedReplayBuffer(_example(), 10, seed=3)
  for r in (a, b):
    r.add(_chunk(np.arange(10)))
  np.testing.assert_array_equal(a.sample_indices(4), b.sample_indices(4, num_batches=3)[:4])


def test_learner_gives_every_sgd_step_its_own_prioritized_batch():
  """The replay source's k x B draw is k stratified batches (each spanning the buffer), not one
  stratified k*B draw cut into age bands."""
  example = Transition(obs=np.zeros(4, np.float32), action=np.zeros((), np.int64),
                       reward=np.zeros((), np.float32), discount=np.zeros((), np.float32),
                       next_obs=np.zeros(4, np.float32))
  replay = PrioritizedReplayBuffer(example, 1000, seed=0)
  replay.add(jax.tree.map(lambda x: np.zeros((1000,) + x.shape, x.dtype), example))
  agent = DQN(DQNConfig(hidden_sizes=(8,), batch_size=8), BOX4, gym.spaces.Discrete(2))
  source = ReplaySource(replay, batch_size=agent.batch_size, updates_per_call=4)
  batch, weights, (idx, _) = source.sample(opt_steps=0)
  assert idx.shape == weights.shape == batch.reward.shape == (4, 8)
  for j in range(4):  # equal priorities: stratum i of 8 is slots [125 i, 125 (i + 1))
    np.testing.assert_array_equal(idx[j] // 125, np.arange(8))
    assert weights[j].max() == 1.0

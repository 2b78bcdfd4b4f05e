"""Tests for the uniform ring-buffer replay."""

import chex
import numpy as np
import pytest

from jaxasync.replay import ReplayBuffer


def _example():
  """One item: nested dict with uint8 image-like, float32 and int64 leaves."""
  return {
      "obs": {"frame": np.zeros((4, 4, 3), np.uint8), "vec": np.zeros((2,), np.float32)},
      "id": np.zeros((), np.int64),
  }


def _chunk(ids):
  """Items whose every leaf encodes their id, so slot contents can be checked exactly."""
  ids = np.asarray(ids, np.int64)
  n = ids.shape[0]
  frame = (ids[:, None, None, None] % 256 * np.ones((n, 4, 4, 3))).astype(np.uint8)
  vec = np.stack([ids, -ids], axis=1).astype(np.float32)
  return {"obs": {"frame": frame, "vec": vec}, "id": ids}


def _sample_many(buf, batch_size, calls):
  """Concatenated ids of many batches (a batch may not exceed what is stored)."""
  return np.concatenate([buf.sample(batch_size)["id"] for _ in range(calls)])


def _assert_slots_hold(buf, slots, ids):
  chex.assert_trees_all_equal(buf.gather(np.asarray(slots)), _chunk(ids))


# --- storage -----------------------------------------------------------------
def test_storage_is_preallocated_from_the_example():
  buf = ReplayBuffer(_example(), capacity=10)
  assert len(buf) == 0 and buf.capacity == 10 and buf.added_total == 0
  everything = buf.gather(np.arange(10))  # zeros before anything is added
  chex.assert_shape(everything["obs"]["frame"], (10, 4, 4, 3))
  chex.assert_shape(everything["obs"]["vec"], (10, 2))
  chex.assert_shape(everything["id"], (10,))
  assert everything["obs"]["frame"].dtype == np.uint8
  assert everything["obs"]["vec"].dtype == np.float32
  assert everything["id"].dtype == np.int64
  assert not any(np.any(x) for x in (everything["obs"]["frame"], everything["obs"]["vec"]))


def test_nbytes_and_bytes_per_item():
  buf = ReplayBuffer(_example(), capacity=10)
  per_item = 4 * 4 * 3 * 1 + 2 * 4 + 8  # uint8 frame + 2 float32 + one int64
  assert per_item == 64
  assert buf.bytes_per_item == 64.0
  assert buf.nbytes == 640


def test_add_chunks_and_read_them_back():
  buf = ReplayBuffer(_example(), capacity=10)
  slots = buf.add(_chunk([7, 8, 9]))
  np.testing.assert_array_equal(slots, [0, 1, 2])
  slots = buf.add(_chunk([10, 11]))
  np.testing.assert_array_equal(slots, [3, 4])
  assert len(buf) == 5 and buf.added_total == 5
  _assert_slots_hold(buf, [0, 1, 2, 3, 4], [7, 8, 9, 10, 11])
  assert buf.gather(np.array([3]))["obs"]["vec"].tolist() == [[10.0, -10.0]]


def test_empty_chunk_is_a_no_op():
  buf = ReplayBuffer(_example(), capacity=5)
  buf.add(_chunk([1]))
  slots = buf.add(_chunk(np.zeros((0,), np.int64)))
  assert slots.shape == (0,)
  assert len(buf) == 1 and buf.added_total == 1


def test_wrap_around():
  buf = ReplayBuffer(_example(), capacity=5)
  np.testing.assert_array_equal(buf.add(_chunk([0, 1, 2])), [0, 1, 2])
  slots = buf.add(_chunk([3, 4, 5, 6]))
  np.testing.assert_array_equal(slots, [3, 4, 0, 1])
  assert len(buf) == 5 and buf.added_total == 7
  _assert_slots_hold(buf, [0, 1, 2, 3, 4], [5, 6, 2, 3, 4])
  # The next write continues after the last slot written.
  np.testing.assert_array_equal(buf.add(_chunk([7])), [2])
  _assert_slots_hold(buf, [0, 1, 2, 3, 4], [5, 6, 7, 3, 4])
  assert len(buf) == 5 and buf.added_total == 8


def test_chunk_larger_than_capacity_keeps_the_newest():
  buf = ReplayBuffer(_example(), capacity=5)
  buf.add(_chunk([0, 1, 2]))
  slots = buf.add(_chunk(np.arange(3, 11)))  # 8 items into 5 slots, starting at slot 3
  np.testing.assert_array_equal(slots, [3, 4, 0, 1, 2])
  assert len(buf) == 5 and buf.added_total == 11
  _assert_slots_hold(buf, [0, 1, 2, 3, 4], [8, 9, 10, 6, 7])
  np.testing.assert_array_equal(np.sort(buf.gather(np.arange(5))["id"]), [6, 7, 8, 9, 10])
  np.testing.assert_array_equal(buf.add(_chunk([11])), [3])  # the oldest (6) goes next


# --- sampling ----------------------------------------------------------------
def test_uniform_sampling_frequencies():
  capacity = 10
  buf = ReplayBuffer(_example(), capacity=capacity, seed=123)
  buf.add(_chunk(np.arange(13)))  # wrapped: ids 3..12 stored
  n = 100_000
  chex.assert_shape(buf.sample(capacity)["id"], (capacity,))
  ids = _sample_many(buf, capacity, n // capacity)
  chex.assert_shape(ids, (n,))
  counts = np.bincount(ids, minlength=13)
  assert counts[:3].sum() == 0  # overwritten items are never sampled
  expected = n / capacity
  chi2 = np.sum((counts[3:] - expected) ** 2 / expected)
  assert chi2 < 27.88  # 99.9% quantile of chi-square with 9 degrees of freedom
  assert np.all(np.abs(counts[3:] - expected) < 6 * np.sqrt(expected))


def test_samples_come_from_stored_items_only_before_full():
  buf = ReplayBuffer(_example(), capacity=100, seed=0)
  buf.add(_chunk([40, 41, 42, 43, 44, 45, 46]))
  slots = np.concatenate([buf.sample_indices(7) for _ in range(500)])
  assert slots.min() == 0 and slots.max() == 6
  for _ in range(50):
    batch = buf.sample(7)
    assert set(batch["id"].tolist()) <= set(range(40, 47))
    # Every leaf of a sampled item belongs to that same item.
    chex.assert_trees_all_equal(batch, _chunk(batch["id"]))
  assert set(_sample_many(buf, 7, 500).tolist()) == set(range(40, 47))


def test_sampling_is_reproducible_with_a_seed():
  a = ReplayBuffer(_example(), capacity=20, seed=7)
  b = ReplayBuffer(_example(), capacity=20, seed=7)
  c = ReplayBuffer(_example(), capacity=20, seed=8)
  for buf in (a, b, c):
    buf.add(_chunk(np.arange(20)))
  sa, sb, sc = a.sample_indices(20), b.sample_indices(20), c.sample_indices(20)
  np.testing.assert_array_equal(sa, sb)
  assert not np.array_equal(sa, sc)


# --- errors ------------------------------------------------------------------
def test_sampling_more_than_stored_raises():
  buf = ReplayBuffer(_example(), capacity=10)
  buf.add(_chunk([1, 2, 3]))
  with pytest.raises(ValueError, match="warmup_period >= batch_size") as e:
    buf.sample(4)
  assert "holding 3" in str(e.value)
  with pytest.raises(ValueError, match="holding 0"):
    ReplayBuffer(_example(), capacity=10).sample(1)


def test_batch_size_zero_raises():
  buf = ReplayBuffer(_example(), capacity=10)
  buf.add(_chunk([1, 2, 3]))
  with pytest.raises(ValueError, match=r"batch_size must be >= 1, got 0"):
    buf.sample(0)


def test_wrong_structure_raises():
  buf = ReplayBuffer(_example(), capacity=10)
  chunk = _chunk([1, 2])
  del chunk["obs"]["vec"]
  with pytest.raises(ValueError, match="push items built like the example"):
    buf.add(chunk)
  assert len(buf) == 0 and buf.added_total == 0


def test_wrong_dtype_raises():
  buf = ReplayBuffer(_example(), capacity=10)
  chunk = _chunk([1, 2])
  chunk["obs"]["vec"] = chunk["obs"]["vec"].astype(np.float64)
  with pytest.raises(ValueError, match="cast it before adding") as e:
    buf.add(chunk)
  assert "float64" in str(e.value) and "float32" in str(e.value)
  assert len(buf) == 0


@pytest.mark.parametrize("bad", ["item_shape", "no_batch_axis", "ragged_batch"])
def test_wrong_shape_raises(bad):
  buf = ReplayBuffer(_example(), capacity=10)
  chunk = _chunk([1, 2])
  if bad == "item_shape":
    chunk["obs"]["vec"] = np.zeros((2, 3), np.float32)
  elif bad == "no_batch_axis":
    chunk = {"obs": {"frame": chunk["obs"]["frame"][0], "vec": chunk["obs"]["vec"][0]},
             "id": chunk["id"][0]}
  else:
    chunk["id"] = np.array([1, 2, 3], np.int64)
  with pytest.raises(ValueError, match="leading batch axis"):
    buf.add(chunk)
  assert len(buf) == 0 and buf.added_total == 0


def test_bad_capacity_and_empty_example_raise():
  with pytest.raises(ValueError, match="pass a positive capacity"):
    ReplayBuffer(_example(), capacity=0)
  with pytest.raises(ValueError, match="no array leaves"):
    ReplayBuffer({}, capacity=3)


# --- checkpointing -----------------------------------------------------------
def test_state_dict_round_trip():
  buf = ReplayBuffer(_example(), capacity=5, seed=3)
  buf.add(_chunk([0, 1, 2]))
  buf.add(_chunk([3, 4, 5, 6]))
  buf.sample(4)  # advance the generator
  state = buf.state_dict()

  other = ReplayBuffer(_example(), capacity=5, seed=99)
  other.load_state_dict(state)
  assert len(other) == 5 and other.added_total == 7
  chex.assert_trees_all_equal(other.gather(np.arange(5)), buf.gather(np.arange(5)))
  # Same sampling stream and same next write slot afterwards.
  np.testing.assert_array_equal(other.sample_indices(5), buf.sample_indices(5))
  np.testing.assert_array_equal(other.add(_chunk([7])), buf.add(_chunk([7])))
  np.testing.assert_array_equal(other.add(_chunk([7])), [3])


def test_state_dict_is_a_copy():
  buf = ReplayBuffer(_example(), capacity=5, seed=3)
  buf.add(_chunk([0, 1, 2]))
  state = buf.state_dict()
  before = buf.gather(np.arange(5))
  for x in state["storage"]:
    x[...] = 1  # scribbling on the snapshot must not touch the buffer
  chex.assert_trees_all_equal(buf.gather(np.arange(5)), before)
  # Adding to the buffer must not change the snapshot either.
  state = buf.state_dict()
  snapshot = [x.copy() for x in state["storage"]]
  buf.add(_chunk([3, 4]))
  for x, y in zip(state["storage"], snapshot):
    np.testing.assert_array_equal(x, y)
  assert state["size"] == 3 and state["next"] == 3 and state["added_total"] == 3


def test_load_state_dict_rejects_mismatch():
  buf = ReplayBuffer(_example(), capacity=5)
  with pytest.raises(ValueError, match="same example and capacity"):
    buf.load_state_dict(ReplayBuffer(_example(), capacity=6).state_dict())


# --- ReplaySource.prefetch ---------------------------------------------------------
def _source(seed):
  from jaxasync.sources.replay import ReplaySource, UpdateCredit
  buf = ReplayBuffer(_example(), capacity=64, seed=seed)
  # (one SGD step of 4 items per env step once 8 are in: border's opt_interval 1)
  return ReplaySource(buf, batch_size=4, updates_per_call=2,
                      limiter=UpdateCredit(1, warmup=8, batch_size=4))


def test_a_prefetched_sample_is_the_sample_the_next_call_would_have_drawn():
  """prefetch draws the call's sample early (the lock-step loop draws it while XLA computes
  the update in flight): the same items, from the same generator, as a source that did not
  prefetch; the credit it spends is spent once, and can_sample stays True while it is held."""
  eager, lazy = _source(3), _source(3)
  for source in (eager, lazy):
    source.add(_chunk(range(8)), version=0, env_steps=8)  # 8 credits: 4 calls of 2 x 4 items
  eager.prefetch(opt_steps=0)
  assert eager.can_sample(0) and eager.sampled == 8 and lazy.sampled == 0
  eager.prefetch(opt_steps=0)  # (already holds one: no second draw)
  assert eager.sampled == 8
  chex.assert_trees_all_equal(eager.sample(0).batch, lazy.sample(0).batch)
  assert eager.sampled == lazy.sampled == 8
  for _ in range(3):  # the generators stayed in step, and the credit ran out together
    chex.assert_trees_all_equal(eager.sample(0).batch, lazy.sample(0).batch)
  assert not eager.can_sample(0) and not lazy.can_sample(0)
  eager.prefetch(opt_steps=0)  # nothing may be sampled: nothing is drawn
  assert eager.sampled == 32 and not eager.can_sample(0)


def test_a_source_holding_a_prefetched_sample_saves_itself_as_before_the_draw():
  """A checkpoint taken while a prefetched sample is held (a run ended by an error before its
  next call) holds the generator and counts of before the draw: restored, the source draws
  that sample again, as the run that never prefetched would."""
  held, plain = _source(5), _source(5)
  for source in (held, plain):
    source.add(_chunk(range(8)), version=0, env_steps=8)
  held.prefetch(opt_steps=0)
  saved, expected = held.state_dict(), plain.state_dict()
  assert saved["sampled"] == expected["sampled"] == 0 and saved["credit"] == expected["credit"]
  assert saved["replay"]["rng"] == expected["replay"]["rng"]
  assert held.rng_states() == plain.rng_states()
  restored = _source(99)  # (another seed: the state brings the generator back)
  restored.load_state_dict(saved)
  chex.assert_trees_all_equal(restored.sample(0).batch, held.sample(0).batch,
                              plain.sample(0).batch)


def test_a_prefetched_prioritized_sample_is_the_one_the_call_would_have_drawn():
  """With priorities: the same items, importance weights and slots (the write-back's info)."""
  from jaxasync.replay import PrioritizedReplayBuffer
  from jaxasync.sources.replay import ReplaySource

  def source():
    buf = PrioritizedReplayBuffer(_example(), capacity=64, alpha=0.6, beta=0.4, seed=2)
    out = ReplaySource(buf, batch_size=4, updates_per_call=2)
    out.add(_chunk(range(16)), version=0, env_steps=16)
    buf.update_priorities(np.arange(16), np.linspace(0.1, 3.0, 16), buf.state_dict()["generation"][:16])
    return out

  eager, lazy = source(), source()
  eager.prefetch(opt_steps=0)
  a, b = eager.sample(0), lazy.sample(0)
  chex.assert_trees_all_equal(a.batch, b.batch)
  np.testing.assert_array_equal(a.weights, b.weights)
  chex.assert_trees_all_equal(a.info, b.info)

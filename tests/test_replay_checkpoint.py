"""Replay checkpoints hold the filled slots only, and a restored replay continues exactly:
the same next samples, the same insertion slots, the same priorities (uniform, prioritized,
frame replays); checkpoints of full-size arrays (as older versions wrote) still load."""

from __future__ import annotations

import chex
import numpy as np
import pytest

from jaxasync.checkpoint import read_tree_dir, write_tree_dir
from jaxasync.collectors.frames import FrameStepProcessor
from jaxasync.replay import PrioritizedReplayBuffer, ReplayBuffer
from jaxasync.replay.frames import _BLANK, FrameReplayBuffer, PrioritizedFrameReplayBuffer
from jaxasync.types import transition_example
from test_frame_replay import GAMMA, concat, make_env, run_stream

CAPACITY = 1_000


def _example():
  return {"x": np.zeros((3, 5), np.float32), "id": np.zeros((), np.int64)}


def _chunk(ids):
  ids = np.asarray(ids, np.int64)
  return {"x": (ids[:, None, None] * np.ones((1, 3, 5))).astype(np.float32), "id": ids}


def _frame_example():
  env = make_env(3, 4, "reset")  # run_stream's env: 3 sub-envs, stacks of 4 frames
  return transition_example(env.single_observation_space, env.single_action_space)


def _frame_chunk(steps: int = 6, seed: int = 7):
  """Records of ``steps`` vector-env steps from a new processor (a new stream)."""
  env = make_env(3, 4, "reset")
  obs, _ = env.reset(seed=seed)
  rng = np.random.default_rng(seed)
  proc = FrameStepProcessor(3, obs[0], np.asarray(env.single_action_space.sample()), 3, GAMMA)
  proc.reset(obs)
  parts = []
  for _ in range(steps):
    actions = rng.integers(0, 3, 3)
    next_obs, reward, terminated, truncated, _ = env.step(actions)
    parts.append(proc.step(actions, reward, next_obs, terminated, truncated))
  return concat(parts)


def _filled(kind: str, items: int, cls=None):
  """A buffer of ``kind`` with ``items`` items added (records, for the frame replays)."""
  if kind == "frames":
    buf, *_ = run_stream(cls, 3, capacity=CAPACITY if items < CAPACITY else 53,
                         steps=items // 18)  # 2 actors x 3 envs x 3 steps per round
    return buf
  cls = PrioritizedReplayBuffer if kind == "prioritized" else ReplayBuffer
  buf = cls(_example(), CAPACITY, seed=3)
  slots = buf.add(_chunk(np.arange(items)))
  if kind == "prioritized":
    buf.update_priorities(slots[::2], np.linspace(0.1, 9.0, slots[::2].size),
                          buf.generation[slots[::2]])
  buf.sample(8)  # the generator moved on from its seed
  return buf


def _fresh(buf):
  """An empty buffer like ``buf``, with another seed."""
  if isinstance(buf, FrameReplayBuffer):
    return type(buf)(_frame_example(), buf.capacity, seed=99)
  return type(buf)(_example(), buf.capacity, seed=99)


def _next_chunk(buf):
  return _frame_chunk() if isinstance(buf, FrameReplayBuffer) else _chunk(np.arange(5) + 10_000)


def _draw(buf):
  out = buf.sample(6)
  return out if isinstance(out, tuple) else (out,)


def _assert_continues_alike(a, b):
  """``b`` samples, inserts and holds what ``a`` does, before and after one more chunk."""
  chex.assert_trees_all_equal(_draw(a), _draw(b))
  chunk = _next_chunk(a)  # (one chunk for both: each frame processor is a new stream)
  np.testing.assert_array_equal(a.add(chunk), b.add(chunk))
  chex.assert_trees_all_equal(_draw(a), _draw(b))
  sa, sb = a.state_dict(), b.state_dict()
  assert sa.keys() == sb.keys()
  chex.assert_trees_all_equal({k: v for k, v in sa.items() if k != "streams"},
                              {k: v for k, v in sb.items() if k != "streams"})
  assert sa.get("streams") == sb.get("streams")
  if isinstance(a, PrioritizedReplayBuffer):
    assert a.sum_tree.total == b.sum_tree.total and a.max_priority == b.max_priority


KINDS = [("uniform", None), ("prioritized", None), ("frames", FrameReplayBuffer),
         ("frames", PrioritizedFrameReplayBuffer)]
IDS = ["uniform", "prioritized", "frames", "prioritized-frames"]


@pytest.mark.parametrize("kind,cls", KINDS, ids=IDS)
def test_a_partly_filled_replay_writes_its_filled_slots_only(tmp_path, kind, cls):
  buf = _filled(kind, 200, cls)
  filled = buf.filled
  assert 0 < filled < CAPACITY // 2
  write_tree_dir(tmp_path / "replay", buf.state_dict())
  arrays = [np.load(p, mmap_mode="r") for p in (tmp_path / "replay" / "arrays").iterdir()]
  assert arrays and all(x.shape[0] == filled for x in arrays)
  on_disk = sum(p.stat().st_size for p in (tmp_path / "replay" / "arrays").iterdir())
  state_bytes = buf.nbytes + (16 * CAPACITY if kind == "prioritized" else 0)
  assert on_disk <= state_bytes * filled / CAPACITY + 128 * len(arrays)  # (+ .npy headers)


@pytest.mark.parametrize("kind,cls", KINDS, ids=IDS)
@pytest.mark.parametrize("items", [200, 2_500])  # partly filled; wrapped (the whole ring)
def test_a_restored_replay_continues_exactly(tmp_path, kind, cls, items):
  buf = _filled(kind, items, cls)
  assert (buf.filled == buf.capacity) == (items > CAPACITY)
  write_tree_dir(tmp_path / "replay", buf.state_dict())
  other = _fresh(buf)
  other.load_state_dict(read_tree_dir(tmp_path / "replay"))
  assert len(other) == len(buf) and other.filled == buf.filled
  _assert_continues_alike(buf, other)


def _as_full_size(state: dict, capacity: int, frames: bool) -> dict:
  """``state`` as the previous version wrote it: full-ring arrays, no ``capacity``."""
  def pad(name, x):
    out = np.full((capacity,) + x.shape[1:], _BLANK.get(name, 0) if frames else 0, x.dtype)
    out[:x.shape[0]] = x
    return out

  old = {k: v for k, v in state.items() if k != "capacity"}
  for name, x in state.items():
    if isinstance(x, np.ndarray):
      old[name] = pad(name, x)
  if "storage" in old:
    old["storage"] = [pad("storage", x) for x in old["storage"]]
  return old


@pytest.mark.parametrize("kind,cls", KINDS, ids=IDS)
def test_full_size_checkpoints_still_load(kind, cls):
  buf = _filled(kind, 200, cls)
  old = _as_full_size(buf.state_dict(), buf.capacity, kind == "frames")
  other = _fresh(buf)
  other.load_state_dict(old)
  _assert_continues_alike(buf, other)


@pytest.mark.parametrize("kind,cls", KINDS, ids=IDS)
def test_loading_blanks_the_slots_a_checkpoint_does_not_hold(kind, cls):
  """A used buffer loaded with an empty one's state equals a fresh buffer, slot for slot."""
  used = _filled(kind, 200, cls)
  empty = _fresh(used)
  used.load_state_dict(empty.state_dict())
  assert len(used) == used.filled == 0
  if isinstance(used, FrameReplayBuffer):
    for name, x in used._arrays().items():
      np.testing.assert_array_equal(x, empty._arrays()[name], err_msg=name)
  else:
    chex.assert_trees_all_equal(used.gather(np.arange(CAPACITY)), empty.gather(np.arange(CAPACITY)))
  if isinstance(used, PrioritizedReplayBuffer):
    assert used.sum_tree.total == 0.0
    np.testing.assert_array_equal(used.generation, 0)


@pytest.mark.parametrize("kind,cls", KINDS, ids=IDS)
def test_a_state_of_another_capacity_is_refused(kind, cls):
  state = _filled(kind, 200, cls).state_dict()
  if kind == "frames":
    other = cls(_frame_example(), CAPACITY + 1)
  else:
    cls = PrioritizedReplayBuffer if kind == "prioritized" else ReplayBuffer
    other = cls(_example(), CAPACITY + 1)
  with pytest.raises(ValueError, match="same example and capacity"):
    other.load_state_dict(state)


def test_the_size_a_run_can_fill_is_bounded_by_its_env_steps():
  """What the trainer's auto ``save_replay`` weighs: the filled part a run can reach."""
  from jaxasync.sources.replay import ReplaySource
  uniform = ReplaySource(ReplayBuffer(_example(), CAPACITY), batch_size=1)
  assert uniform.nbytes_within(100) == 100 * uniform.replay.bytes_per_item
  assert uniform.nbytes_within(10 * CAPACITY) == uniform.nbytes
  frames = ReplaySource(FrameReplayBuffer(_frame_example(), CAPACITY), batch_size=1)
  # (an episode of T steps is T + K records: K + 1 per step at most, K = 4)
  assert frames.nbytes_within(100) == 500 * frames.replay.bytes_per_item
  assert frames.nbytes_within(CAPACITY) == frames.nbytes


def test_a_replay_saved_with_float64_observations_restores_into_float32_storage():
  """Observations of float64 spaces (MuJoCo's) were stored as float64 before
  ``types.storage_dtype``: such a checkpoint restores, cast, into this version's float32."""
  old = ReplayBuffer({"x": np.zeros((3, 5), np.float64), "id": np.zeros((), np.int64)}, CAPACITY)
  chunk = _chunk(range(50))
  old.add({"x": chunk["x"].astype(np.float64) + 0.25, "id": chunk["id"]})
  new = ReplayBuffer(_example(), CAPACITY)
  new.load_state_dict(old.state_dict())
  state = new.state_dict()
  x = next(v for v in state["storage"] if v.ndim == 3)
  assert len(new) == 50 and x.dtype == np.float32
  np.testing.assert_array_equal(x, chunk["x"] + 0.25)
  with pytest.raises(ValueError, match="int64"):  # (only float64 into float32 is widened)
    ReplayBuffer({"x": np.zeros((3, 5), np.float32), "id": np.zeros((), np.int32)},
                 CAPACITY).load_state_dict(old.state_dict())

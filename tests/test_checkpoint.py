"""Tests for atomic msgpack checkpoints of pytrees."""

import os
from pathlib import Path

import chex
import gymnasium as gym
import jax
import numpy as np
import pytest

from jaxasync import DQN, DQNConfig, Transition, restore_checkpoint, save_checkpoint

BOX4 = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)


def _agent(hidden=(8,)):
  return DQN(DQNConfig(hidden_sizes=hidden, learning_rate=1e-2), BOX4, gym.spaces.Discrete(2))


def _batch(rng, k=1, b=8):
  return Transition(
      obs=rng.normal(size=(k, b, 4)).astype(np.float32),
      action=rng.integers(0, 2, size=(k, b)),
      reward=rng.normal(size=(k, b)).astype(np.float32),
      discount=np.full((k, b), 0.99, np.float32),
      next_obs=rng.normal(size=(k, b, 4)).astype(np.float32))


def _trained_state(agent, updates=2, seed=0):
  state = agent.init(jax.random.PRNGKey(seed))
  rng = np.random.default_rng(seed)
  for _ in range(updates):
    state, _, _ = agent.update(state, _batch(rng), None)
  return jax.device_get(state)


def _leftovers(directory):
  return sorted(p.name for p in Path(directory).iterdir()
                if p.name.startswith(".") or p.name.endswith(".tmp"))


def test_round_trip_of_a_dqn_state(tmp_path):
  agent = _agent()
  state = _trained_state(agent)
  assert int(state.opt_steps) == 2
  out = save_checkpoint(tmp_path / "ckpt", state, {"opt_steps": 2})
  assert out == tmp_path / "ckpt"
  assert sorted(p.name for p in out.iterdir()) == ["meta.json", "state.msgpack"]
  template = agent.init(jax.random.PRNGKey(123))  # other values, same structure
  restored, meta = restore_checkpoint(out, template)
  assert type(restored) is type(state)
  chex.assert_trees_all_equal_structs(restored, state)
  chex.assert_trees_all_equal(restored, state)
  chex.assert_trees_all_equal_dtypes(restored, state)
  assert meta == {"opt_steps": 2}
  # The restored state is usable: it updates exactly like the original.
  rng = np.random.default_rng(5)
  batch = _batch(rng)
  a, _, _ = agent.update(jax.tree.map(np.array, state), batch, None)
  b, _, _ = agent.update(restored, batch, None)
  chex.assert_trees_all_equal(jax.device_get(a), jax.device_get(b))
  assert int(b.opt_steps) == 3


def test_meta_round_trip(tmp_path):
  rng = np.random.default_rng(7)
  rng.random(3)
  meta = {
      "opt_steps": np.int64(400), "best_eval_reward": np.float32(12.5), "name": "CartPole-v1",
      "returns": np.arange(3), "model_dir": tmp_path, "nested": {"a": [1, 2.5, None]},
      "rng": rng.bit_generator.state,
  }
  save_checkpoint(tmp_path / "ckpt", {"x": np.ones(2)}, meta)
  _, restored = restore_checkpoint(tmp_path / "ckpt", {"x": np.zeros(2)})
  assert restored == {
      "opt_steps": 400, "best_eval_reward": 12.5, "name": "CartPole-v1", "returns": [0, 1, 2],
      "model_dir": str(tmp_path), "nested": {"a": [1, 2.5, None]},
      "rng": rng.bit_generator.state}
  other = np.random.default_rng(0)
  other.bit_generator.state = restored["rng"]
  np.testing.assert_array_equal(other.random(4), rng.random(4))


def test_missing_meta_defaults_to_empty(tmp_path):
  save_checkpoint(tmp_path / "ckpt", {"x": np.ones(2)})
  (tmp_path / "ckpt" / "meta.json").unlink()
  state, meta = restore_checkpoint(tmp_path / "ckpt", {"x": np.zeros(2)})
  assert meta == {}
  np.testing.assert_array_equal(state["x"], [1.0, 1.0])


def test_overwrite_replaces_the_previous_checkpoint(tmp_path):
  save_checkpoint(tmp_path / "ckpt", {"x": np.ones(2)}, {"v": 1})
  save_checkpoint(tmp_path / "ckpt", {"x": np.full(2, 2.0)}, {"v": 2})
  state, meta = restore_checkpoint(tmp_path / "ckpt", {"x": np.zeros(2)})
  np.testing.assert_array_equal(state["x"], [2.0, 2.0])
  assert meta == {"v": 2}
  assert _leftovers(tmp_path / "ckpt") == []


@pytest.mark.parametrize("fail_at", ["fsync", "replace"])
def test_failed_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch, fail_at):
  agent = _agent()
  old = _trained_state(agent, updates=1)
  new = _trained_state(agent, updates=3)
  directory = tmp_path / "ckpt"
  save_checkpoint(directory, old, {"opt_steps": 1})
  old_bytes = (directory / "state.msgpack").read_bytes()

  def boom(*args, **kwargs):
    raise OSError("disk pulled mid-save")

  monkeypatch.setattr(os, fail_at, boom)
  with pytest.raises(OSError, match="disk pulled"):
    save_checkpoint(directory, new, {"opt_steps": 3})
  monkeypatch.undo()

  assert (directory / "state.msgpack").read_bytes() == old_bytes
  assert _leftovers(directory) == []  # no temp file left behind
  restored, meta = restore_checkpoint(directory, agent.init(jax.random.PRNGKey(1)))
  chex.assert_trees_all_equal(restored, old)
  assert meta == {"opt_steps": 1}


def test_save_failing_between_state_and_meta_keeps_them_consistent(tmp_path, monkeypatch):
  """A checkpoint is one directory: a failed save must not pair new arrays with old meta."""
  directory = tmp_path / "ckpt"
  save_checkpoint(directory, {"x": np.ones(2)}, {"opt_steps": 1})
  import jaxasync.checkpoint as checkpoint
  real_write = checkpoint._write

  def write(path, data):
    if Path(path).name == "meta.json":  # the state file went through; the meta file does not
      raise OSError("killed between the two files")
    return real_write(path, data)

  monkeypatch.setattr(checkpoint, "_write", write)
  with pytest.raises(OSError, match="killed between"):
    save_checkpoint(directory, {"x": np.full(2, 3.0)}, {"opt_steps": 3})
  monkeypatch.undo()
  state, meta = restore_checkpoint(directory, {"x": np.zeros(2)})
  # The old checkpoint, whole: the new one's files never replaced it.
  assert (float(state["x"][0]), meta["opt_steps"]) == (1.0, 1), (state, meta)
  assert _leftovers(tmp_path) == []  # its temporary directory was removed


def test_restore_into_a_mismatching_template_names_the_leaf(tmp_path):
  save_checkpoint(tmp_path / "ckpt", _trained_state(_agent(hidden=(8,))))
  template = _agent(hidden=(16,)).init(jax.random.PRNGKey(0))
  with pytest.raises(ValueError) as e:
    restore_checkpoint(tmp_path / "ckpt", template)
  message = str(e.value)
  assert "['Dense_0']['kernel']" in message or "['Dense_0']['bias']" in message, message
  assert "expected" in message
  # The named leaf is one whose shape really differs.
  paths = {jax.tree_util.keystr(p): x.shape
           for p, x in jax.tree_util.tree_flatten_with_path(template)[0]}
  named = [k for k in paths if k in message]
  assert len(named) == 1 and str(paths[named[0]]) in message


def test_restore_with_a_missing_leaf_or_other_dtype_raises(tmp_path):
  save_checkpoint(tmp_path / "ckpt", {"a": np.zeros(3, np.float32)})
  with pytest.raises(ValueError, match=r"has no leaf \['b'\]"):
    restore_checkpoint(tmp_path / "ckpt", {"a": np.zeros(3, np.float32), "b": np.zeros(1)})
  with pytest.raises(ValueError, match=r"leaf \['a'\] is \(3,\) float32, expected \(3,\) int32"):
    restore_checkpoint(tmp_path / "ckpt", {"a": np.zeros(3, np.int32)})


def test_a_dqn_checkpoint_saved_before_the_value_bound_loads_with_its_initial_value(tmp_path):
  # A bounded agent's state, saved as a checkpoint of the code before DQNState.value_bound
  # (its arrays without that key) would have been.
  from flax import serialization
  from jaxasync import QLearning
  agent = DQN(DQNConfig(hidden_sizes=(8,), loss=QLearning(bound_targets=True)), BOX4,
              gym.spaces.Discrete(2))
  state = _trained_state(agent)
  assert np.isfinite(state.value_bound)  # (0.99-discounted normal rewards: a finite bound)
  save_checkpoint(tmp_path / "ckpt", state, {"opt_steps": 2})
  path = tmp_path / "ckpt" / "state.msgpack"
  payload = serialization.msgpack_restore(path.read_bytes())
  del payload["arrays"][".value_bound"]
  path.write_bytes(serialization.msgpack_serialize(payload))
  restored, _ = restore_checkpoint(tmp_path / "ckpt", agent.init(jax.random.PRNGKey(1)))
  assert float(restored.value_bound) == 0.0
  chex.assert_trees_all_equal(restored.params, state.params)
  chex.assert_trees_all_equal(restored.opt_state, state.opt_state)
  # The next update call takes the bound up again from its batch.
  new, _, _ = agent.update(restored, _batch(np.random.default_rng(5)), None)
  assert np.isfinite(float(new.value_bound))
  # Another missing leaf is still an error.
  del payload["arrays"][".opt_steps"]
  path.write_bytes(serialization.msgpack_serialize(payload))
  with pytest.raises(ValueError, match=r"has no leaf \.opt_steps"):
    restore_checkpoint(tmp_path / "ckpt", agent.init(jax.random.PRNGKey(1)))

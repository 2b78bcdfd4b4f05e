"""The multi-device learner, checked on 4 forced CPU devices.

Not collected by the main session (no ``test_`` prefix): ``test_multidevice.py`` runs it in
its own pytest process with ``XLA_FLAGS=--xla_force_host_platform_device_count=4`` set before
JAX starts (the device count cannot change inside a running process).
"""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import jax
import numpy as np
import pytest

import jaxasync as ja
from contract_agents import env_factory, factories
from jaxasync.collectors.unrolls import Unroll
from jaxasync.param_store import to_cpu
from jaxasync.sharding import DataParallel, learner_devices
from jaxasync.sources.base import Sample

REPO = Path(__file__).resolve().parents[1]
K = 2  # SGD steps per update call
UNROLL_ENVS = 6  # sub-envs per unroll: a batch of 2 unrolls holds 12 columns, split by 2 and 4

if len(jax.devices()) < 4:
  pytest.fail(f"needs XLA_FLAGS=--xla_force_host_platform_device_count=4 set before JAX starts; "
              f"this process sees {jax.devices()}", pytrace=False)


def random_batch(agent: ja.Agent, seed: int) -> tuple:
  """One update call's ``(batch, weights)`` in the shapes of the agent's data pipeline, random
  values (boundaries, terminations and importance weights included)."""
  rng = np.random.default_rng(seed)
  space = agent.action_space
  floats = lambda shape: rng.normal(size=shape).astype(np.float32)

  def actions(shape):
    if isinstance(space, gym.spaces.Discrete):
      return rng.integers(0, space.n, shape).astype(space.dtype)
    return rng.uniform(space.low, space.high, shape + space.shape).astype(space.dtype)

  if isinstance(agent.data, ja.UnrollConfig):
    shape = (K, agent.data.unroll_length + 1, agent.batch_size * UNROLL_ENVS)
    first = rng.random(shape) < 0.2
    extras = jax.tree.map(lambda e: floats(shape + np.shape(e)), agent.extras_example())
    if isinstance(extras, dict) and "raw_action" in extras:
      # A Gaussian head's: a sample of that behaviour policy (random log-stds and samples far
      # from their means would overflow the ratio pi / mu).
      extras["log_std"] = 0.3 * extras["log_std"]
      extras["raw_action"] = extras["mean"] + np.exp(extras["log_std"]) * extras["raw_action"]
    return Unroll(obs=floats(shape + agent.obs_space.shape), action=actions(shape), extras=extras,
                  reward=floats(shape), discount=(rng.random(shape) > 0.2).astype(np.float32),
                  first=first, last=np.roll(first, -1, axis=1)), None
  shape = (K, agent.batch_size)
  extras = jax.tree.map(lambda e: floats(shape + np.shape(e)), agent.extras_example())
  batch = ja.Transition(obs=floats(shape + agent.obs_space.shape), action=actions(shape),
                        reward=floats(shape),
                        discount=0.97 * (rng.random(shape) > 0.2).astype(np.float32),
                        next_obs=floats(shape + agent.obs_space.shape), extras=extras)
  return batch, rng.uniform(0.3, 1.0, shape).astype(np.float32)


class FixedSource:
  """Serves a fixed list of samples, in order (what ``Learner.step`` needs of a source)."""

  def __init__(self, samples):
    self.samples, self.updates_per_call = list(samples), K

  def sample(self, opt_steps: int) -> Sample:
    batch, weights = self.samples.pop(0)
    return Sample(batch=batch, weights=weights, info=None)


def train(name: str, num_devices: int, calls: int = 3) -> tuple[ja.Learner, dict]:
  agent = factories()[name]()
  source = FixedSource(random_batch(agent, seed) for seed in range(calls))
  learner = ja.Learner(agent, seed=0, devices=jax.devices()[:num_devices])
  for _ in range(calls):
    learner.step(source)
  return learner, learner.metrics()


@pytest.mark.parametrize("name", sorted(factories()))
def test_update_on_2_and_4_devices_equals_1_device(name):
  """Three update calls (``k`` = 2 SGD steps each) on the same batches: the state after them
  (params, optimizer, targets, keys) and the last metrics agree to 1e-5 on 1, 2 and 4 devices;
  the state stays replicated on every learner device."""
  one, metrics_one = train(name, 1)
  reference = jax.device_get(one.state)
  for n in (2, 4):
    learner, metrics = train(name, n)
    for leaf in jax.tree.leaves(learner.state):
      assert leaf.sharding.is_fully_replicated and len(leaf.sharding.device_set) == n, leaf.sharding
    jax.tree.map(functools.partial(np.testing.assert_allclose, rtol=1e-5, atol=1e-5),
                 jax.device_get(learner.state), reference)
    np.testing.assert_allclose([metrics[k] for k in sorted(metrics)],
                               [metrics_one[k] for k in sorted(metrics)], rtol=1e-5, atol=1e-5)
    assert learner.opt_steps == one.opt_steps == 3 * K


@pytest.mark.parametrize("name", sorted(factories()))
def test_the_batch_stays_split_inside_the_update(name):
  """The compiled 4-device update never gathers the batch onto every device (no all-gather
  of anything with a feature axis):
  each device computes on its own quarter, and all-reduces combine the gradients."""
  agent = factories()[name]()
  parallel = DataParallel(jax.devices(), agent.data.batch_axis)
  state = parallel.place_state(agent.init(jax.random.PRNGKey(0)))
  batch, weights = parallel.place_batch(*random_batch(agent, 0))
  assert all(len(x.sharding.device_set) == 4 and not x.sharding.is_fully_replicated
             for x in jax.tree.leaves(batch))
  update = getattr(agent, "_jitted_update", None) or agent._update  # (LinearPG's jit)
  args = (state, batch) if isinstance(agent.data, ja.UnrollConfig) else (state, batch, weights)
  with jax.set_mesh(parallel.mesh):
    hlo = update.lower(*args).compile().as_text()
  # The only gathers allowed are of one scalar per item (the median of DQN's action gaps):
  # nothing with a feature axis, such as observations or Q-values.
  gathered = re.findall(r"= (\w+)\[([\d,]*)\][^=]* all-gather(?:-start)?\(", hlo)
  assert all(shape.count(",") == 0 for _, shape in gathered), gathered
  assert re.search(r"\ball-reduce(-start)?\(", hlo)


def test_published_params_are_one_host_copy():
  learner, _ = train("dqn", 4, calls=1)
  info = learner.model_info()
  for leaf, device_leaf in zip(jax.tree.leaves(info.params),
                               jax.tree.leaves(learner.policy_params())):
    assert isinstance(leaf, np.ndarray)
    np.testing.assert_array_equal(leaf, np.asarray(device_leaf))


@pytest.mark.parametrize("num_devices", [1, 4])
def test_device_publications_survive_the_donating_update(num_devices):
  """An in-process store's publication (``model_info(host=False)``: device copies) keeps the
  values it was published with after the next update call donates the learner's state, and
  the actor adopts it on the CPU without a host round trip."""
  agent = factories()["dqn"]()
  source = FixedSource(random_batch(agent, seed) for seed in range(2))
  learner = ja.Learner(agent, seed=0, devices=jax.devices()[:num_devices])
  learner.step(source)
  info = learner.model_info(host=False)
  assert info.version == K and all(isinstance(x, jax.Array) for x in jax.tree.leaves(info.params))
  published = jax.device_get(info.params)
  learner.step(source)  # donates the state the publication was copied from
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(info.params), published)
  moved = jax.tree.leaves(jax.device_get(learner.policy_params()))
  assert any(not np.array_equal(a, b) for a, b in zip(moved, jax.tree.leaves(published)))
  adopted = to_cpu(info.params, published=True)
  assert all(x.devices() == {jax.devices("cpu")[0]} for x in jax.tree.leaves(adopted))
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(adopted), published)


def test_batches_that_do_not_split_are_refused_with_the_fix():
  make = factories()
  dqn = make["dqn"]()  # batch_size 16
  config = ja.RunConfig(max_opts=10, progress=False, learner_devices=3)
  with pytest.raises(ja.ConfigError, match=r"16 items .*3 learner devices.*multiple of 3"):
    ja.Trainer(dqn, env_factory("dqn"), config)
  impala = make["impala"]()  # 2 unrolls x 3 envs = 6 columns: 4 devices cannot split them
  config = ja.RunConfig(max_opts=10, progress=False, learner_devices=4)
  with pytest.raises(ja.ConfigError, match=r"2 unrolls x 3 envs.*multiple of 4"):
    ja.Trainer(impala, env_factory("impala"), config, ja.ActorsConfig(num_envs=3))
  with pytest.raises(ja.ConfigError, match=r"learner_devices=5 but this process sees 4"):
    learner_devices(5)
  assert learner_devices(None) == jax.devices()[:1]  # the CPU: one device unless asked


def test_a_sync_run_on_two_devices_checkpoints_and_resumes(tmp_path):
  """A lock-step DQN run with the learner on 2 devices saves; the resumed run's state is
  replicated on the 2 devices again and continues to max_opts."""
  def trainer(max_opts, resume=False):
    agent = factories()["dqn"]()  # (its replay: 64 env steps of warmup)
    assert agent.data.warmup_period == 64
    config = ja.RunConfig(max_opts=max_opts, eval_interval=0, save_interval=64,
                          record_interval=0, progress=False, logdir=str(tmp_path),
                          learner_devices=2)
    return ja.Trainer(agent, env_factory("dqn"), config, resume=resume)

  first = trainer(128)
  assert first.train()["opt_steps"] == 128
  saved = jax.device_get(first.learner.state)
  resumed = trainer(192, resume=True)
  jax.tree.map(np.testing.assert_array_equal, jax.device_get(resumed.learner.state), saved)
  for leaf in jax.tree.leaves(resumed.learner.state):
    assert len(leaf.sharding.device_set) == 2 and leaf.sharding.is_fully_replicated
  summary = resumed.train()
  assert summary["opt_steps"] == 192 and summary["learner_devices"] == 2


def test_dqn_learns_cartpole_with_the_learner_on_two_devices(tmp_path):
  """``python experiments/dqn.py --learner-devices 2`` (the default settings, lock-step so the
  run is bounded and deterministic) solves CartPole-v1."""
  logdir = tmp_path / "run"
  out = subprocess.run([sys.executable, "experiments/dqn.py", "--learner-devices", "2",
                        "--mode", "sync", "--target-eval-reward", "475", "--max-opts", "40000",
                        "--no-progress", "--logdir", str(logdir)],
                       cwd=REPO, capture_output=True, text=True, timeout=400)
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
  summary = json.loads((logdir / "summary.json").read_text())
  assert summary["learner_devices"] == 2
  assert summary["best_eval_reward"] >= 475, [round(e["eval_reward"]) for e in summary["evals"]]


@pytest.mark.parametrize("num_devices", [1, 2])
def test_the_lockstep_actor_acts_where_one_device_params_live(num_devices):
  """The lock-step actor (``acts_on_published_device``, which the sync ``Trainer`` sets) acts on
  a one-device learner's publication where it lives (here cpu:1, as a GPU learner's would stay
  on the GPU) and copies a publication split over several devices to the CPU; its greedy
  actions are a CPU copy's."""
  from jaxasync.actor import Actor, ActorConfig, ActorShared
  from jaxasync.param_store import ThreadParamStore
  from jaxasync.train import dqn as dqn_job

  env = ja.EnvFactory("CartPole-v1")
  agent = ja.DQN(dqn_job.cartpole_agent(), *ja.envs.spaces_of(env), "CartPole-v1")
  learner = ja.Learner(agent, seed=0, devices=jax.devices()[1:1 + num_devices])
  learner.step(FixedSource([random_batch(agent, 0)]))  # (params that are not the init's)
  store = ThreadParamStore()
  store.publish(learner.model_info(host=False))
  actors = [Actor(0, agent, env(4, seed=0), ActorConfig(num_envs=4, chunk_steps=1), store,
                  ActorShared(np.zeros(1, np.int64), np.full(1, -1, np.int64)), seed=0,
                  acts_on_published_device=where) for where in (True, False)]
  for actor in actors:
    actor.adopt_latest()
  published = jax.tree.leaves(store.get().params)
  adopted = jax.tree.leaves(actors[0].params)
  if num_devices == 1:
    assert all(a is p for a, p in zip(adopted, published))
    assert {d for x in adopted for d in x.devices()} == {jax.devices()[1]}
  else:
    assert all(x.devices() == {jax.devices("cpu")[0]} for x in adopted)
  assert all(x.devices() == {jax.devices("cpu")[0]} for x in jax.tree.leaves(actors[1].params))
  obs = np.random.default_rng(1).normal(size=(64, 4)).astype(np.float32)
  greedy = [np.asarray(agent.policy(a.params, obs, np.random.default_rng(0), False))
            for a in actors]
  np.testing.assert_array_equal(greedy[0], greedy[1])
  assert len(np.unique(greedy[0])) == 2  # (both actions: the comparison says something)
  sync = ja.Trainer(agent, env, ja.RunConfig(max_opts=8, progress=False, eval_interval=0),
                    ja.ActorsConfig(mode="sync", num_envs=2), recorder=ja.MemoryRecorder())
  assert sync.feed.actor.acts_on_published_device

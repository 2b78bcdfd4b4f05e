"""Observation normalisation: the running statistics and ``normalize`` by hand, the
actor-critics' learner-side statistics (counted once per observation, seen by the loss and by
``policy``), a lock-step PPO run whose statistics are those of exactly the observations it
trained on and travel with the published params and the checkpoint, and the option off
(no statistics anywhere)."""

from __future__ import annotations

import pickle

import chex
import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxasync as ja
from jaxasync.agents.actor_critic import NormalizedPolicyParams
from jaxasync.agents.normalization import (RunningMeanStd, init_running_stats, normalize,
                                           update_running_stats)
from jaxasync.collectors.unrolls import Unroll
from jaxasync.param_store import SharedParamStore
from jaxasync.types import ModelInfo
from helpers import host

OBS3 = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
ACT2 = gym.spaces.Discrete(2)


def _numpy_stats(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  rows = np.asarray(rows, np.float64)
  return rows.mean(0), rows.var(0)


def test_running_stats_equal_numpy_over_uneven_masked_batches():
  rng = np.random.default_rng(0)
  shape = (2, 3)  # (any observation shape)
  stats = init_running_stats(shape)
  chex.assert_shape((stats.mean, stats.var), shape)
  np.testing.assert_array_equal(stats.var, np.ones(shape))
  assert float(stats.count) == 0.0
  update = jax.jit(update_running_stats)
  kept = []
  # Uneven sizes, different scales and offsets per batch; one batch with nothing counted.
  for size, masked in [(1, False), (7, True), (40, True), (5, None), (3, "none"), (64, False)]:
    x = (rng.normal(size=(size,) + shape) * rng.uniform(0.5, 3.0)
         + rng.normal(size=shape) * 5.0).astype(np.float32)
    if masked is None or masked is False:
      mask = None if masked is None else np.ones(size, bool)
    elif masked == "none":
      mask = np.zeros(size, bool)
    else:
      mask = rng.random(size) < 0.6
    stats = update(stats, x, mask)
    kept.append(x if mask is None else x[mask])
    rows = np.concatenate(kept)
    mean, var = _numpy_stats(rows)
    assert float(stats.count) == len(rows)
    np.testing.assert_allclose(stats.mean, mean, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(stats.var, var, rtol=1e-4, atol=1e-6)
  # A first batch with nothing counted leaves the identity statistics (var stays 1, not 0).
  empty = update_running_stats(init_running_stats((3,)), np.ones((4, 3), np.float32),
                               np.zeros(4, bool))
  chex.assert_trees_all_equal(empty, init_running_stats((3,)))
  with pytest.raises(AssertionError):
    update_running_stats(init_running_stats((3,)), np.ones((4, 2), np.float32))


def test_normalize_by_hand_with_clipping():
  stats = RunningMeanStd(mean=jnp.array([1.0, -2.0, 0.0]), var=jnp.array([4.0, 0.25, 0.0]),
                         count=jnp.array(10.0))
  x = np.array([[3.0, -2.5, 0.0], [1.0, 10.0, 1e-3], [-9.0, -3.0, -1.0]], np.float32)
  eps = 1e-8
  by_hand = (x - np.array([1.0, -2.0, 0.0])) / np.sqrt(np.array([4.0, 0.25, 0.0]) + eps)
  # [[1, -1, 0], [0, 24 -> 10, 1e-3 / 1e-4 = 10], [-5, -2, -1e4 -> -10]]
  np.testing.assert_allclose(normalize(stats, x), np.clip(by_hand, -10, 10), rtol=1e-5)
  np.testing.assert_allclose(normalize(stats, x)[:, 1], [-1.0, 10.0, -2.0], rtol=1e-5)
  np.testing.assert_allclose(normalize(stats, x, clip=3.0),
                             np.clip(by_hand, -3, 3), rtol=1e-5)
  np.testing.assert_allclose(normalize(stats, x, clip=3.0)[2], [-3.0, -2.0, -3.0], rtol=1e-6)
  # Leading axes of any rank; float32 out.
  out = jax.jit(normalize)(stats, np.broadcast_to(x, (2, 3, 3)).astype(np.float64))
  chex.assert_shape(out, (2, 3, 3))
  assert out.dtype == jnp.float32
  # The initial statistics are (to eps) the identity.
  np.testing.assert_allclose(normalize(init_running_stats((3,)), x), x, rtol=1e-6)


def _unrolls(rng, k, T, N, shared_boundary=True) -> Unroll:
  """``k`` consecutive unrolls ``[k, T + 1, N]`` of a Discrete-action env with observations of
  scale 3 around 5 (unroll ``i + 1`` starts at unroll ``i``'s last observation)."""
  obs = (5.0 + 3.0 * rng.normal(size=(k, T + 1, N, 3))).astype(np.float32)
  if shared_boundary:
    obs[1:, 0] = obs[:-1, -1]
  return Unroll(obs=obs, action=rng.integers(0, 2, (k, T + 1, N)),
                extras={"logits": rng.normal(size=(k, T + 1, N, 2)).astype(np.float32)},
                reward=rng.normal(size=(k, T + 1, N)).astype(np.float32),
                discount=np.ones((k, T + 1, N), np.float32),
                first=rng.random((k, T + 1, N)) < 0.1, last=np.zeros((k, T + 1, N), bool))


AGENTS = [(ja.PPO, ja.PPOConfig, dict(num_epochs=2, num_minibatches=2)),
          (ja.IMPALA, ja.IMPALAConfig, {})]


@pytest.mark.parametrize("cls, config_cls, extra", AGENTS)
def test_actor_critics_learn_and_act_on_observations_normalised_by_the_learners_statistics(
    cls, config_cls, extra):
  T, N = 6, 3
  on = cls(config_cls(hidden_sizes=(8,), normalize_observations=True, observation_clip=4.0,
                      data=ja.UnrollConfig(unroll_length=T), **extra), OBS3, ACT2)
  off = cls(config_cls(hidden_sizes=(8,), data=ja.UnrollConfig(unroll_length=T), **extra),
            OBS3, ACT2)
  batch = _unrolls(np.random.default_rng(1), 2, T, N)  # two consecutive unrolls
  state = on.init(jax.random.PRNGKey(0))
  chex.assert_trees_all_equal(state.obs_stats, init_running_stats((3,)))
  new_state, metrics, _ = on.update(state, batch)
  assert all(np.isfinite(float(v)) for v in metrics.values())
  # Each observation once: obs[:-1] of each unroll (obs[T] is the next one's obs[0]).
  mean, var = _numpy_stats(batch.obs[:, :-1].reshape(-1, 3))
  assert float(new_state.obs_stats.count) == 2 * T * N
  np.testing.assert_allclose(new_state.obs_stats.mean, mean, rtol=1e-5)
  np.testing.assert_allclose(new_state.obs_stats.var, var, rtol=1e-4)
  # The statistics are updated before each SGD step (PPO: iteration), and the loss sees the
  # observations normalised by them: the same steps as the plain agent's on a batch whose
  # unroll i is normalised by the statistics of unrolls 0..i.
  first = update_running_stats(init_running_stats((3,)), batch.obs[0, :-1].reshape(-1, 3))
  normalised = batch._replace(obs=np.stack([
      np.asarray(normalize(first, batch.obs[0], clip=4.0)),
      np.asarray(normalize(new_state.obs_stats, batch.obs[1], clip=4.0))]))
  assert np.abs(normalised.obs).max() <= 4.0 and np.abs(normalised.obs).mean() < 1.5
  plain, _, _ = off.update(off.init(jax.random.PRNGKey(0)), normalised)
  chex.assert_trees_all_close(host(new_state.params), host(plain.params), rtol=1e-5, atol=1e-6)
  # The published params carry the statistics of the same state, and ``policy`` applies them.
  published = host(on.policy_params(new_state))
  assert isinstance(published, NormalizedPolicyParams)
  chex.assert_trees_all_equal(published.obs_stats, host(new_state.obs_stats))
  chex.assert_trees_all_equal(published.params, host(new_state.params))
  obs = batch.obs[1, 2]
  got = on.policy(published, obs, np.random.default_rng(0))
  want = on.network.apply(published.params, normalize(published.obs_stats, obs, clip=4.0))[0]
  np.testing.assert_allclose(got, want, rtol=1e-5)
  # Process actors rebuild the published pytree from shared memory by its (pickled) treedef.
  treedef = pickle.loads(pickle.dumps(jax.tree_util.tree_structure(published)))
  store = SharedParamStore(published)
  store.publish(ModelInfo(3, published))
  info = store.get()
  assert info.version == 3 and isinstance(info.params, NormalizedPolicyParams)
  chex.assert_trees_all_equal(info.params, published)
  chex.assert_trees_all_equal(jax.tree_util.tree_unflatten(treedef, jax.tree.leaves(published)),
                              published)
  # Off: no statistics anywhere (no leaves, so checkpoints are those of before) and the
  # published params are the network's own. (Its updates were compared with a record taken
  # before the option existed: one PPO, two IMPALA and one Gaussian PPO update and policy
  # calls on fixed CartPole/Pendulum batches, 291 arrays, bit for bit.)
  state = off.init(jax.random.PRNGKey(0))
  assert state.obs_stats is None and off.policy_params(state) is state.params
  assert len(jax.tree.leaves(state)) == len(jax.tree.leaves(
      (state.params, state.opt_state, state.opt_steps, state.key,
       getattr(state, "target_params", None))))
  state, _, _ = off.update(state, batch)
  assert state.obs_stats is None
  assert not any("obs_stats" in jax.tree_util.keystr(p)
                 for p, _ in jax.tree_util.tree_leaves_with_path(state))


@pytest.mark.parametrize("cls, config_cls, extra", AGENTS)
def test_actor_critics_scale_rewards_by_the_spread_of_the_discounted_return(cls, config_cls,
                                                                            extra):
  """``normalize_rewards``: the learner's return statistics are the mean and variance of the
  batch's discounted returns (rows 1..T, first timesteps left out), and the loss sees the
  rewards divided by their standard deviation and clipped: the same SGD steps as the plain
  agent's on a batch whose rewards were scaled by hand."""
  T, N = 6, 3
  on = cls(config_cls(hidden_sizes=(8,), normalize_rewards=True, reward_clip=2.0,
                      data=ja.UnrollConfig(unroll_length=T), **extra), OBS3, ACT2)
  off = cls(config_cls(hidden_sizes=(8,), data=ja.UnrollConfig(unroll_length=T), **extra),
            OBS3, ACT2)
  assert on.unroll_return_discount() == on.config.gamma and off.unroll_return_discount() is None
  rng = np.random.default_rng(2)
  batch = _unrolls(rng, 2, T, N)
  batch = batch._replace(reward=batch.reward * 20.0,  # (some clipped at 2 once scaled)
                         discounted_return=(20.0 + 8.0 * rng.normal(size=batch.reward.shape)
                                            ).astype(np.float32))
  state = on.init(jax.random.PRNGKey(0))
  chex.assert_trees_all_equal(state.return_stats, init_running_stats(()))
  new_state, _, _ = on.update(state, batch)
  counted = [batch.discounted_return[i, 1:][~batch.first[i, 1:]] for i in range(2)]
  stats = new_state.return_stats
  assert float(stats.count) == sum(len(c) for c in counted) < 2 * T * N
  np.testing.assert_allclose(stats.mean, np.concatenate(counted).mean(), rtol=1e-5)
  np.testing.assert_allclose(stats.var, np.concatenate(counted).var(), rtol=1e-4)
  # Unroll i's rewards scaled by the statistics of unrolls 0..i (updated before each step).
  first_var = np.var(counted[0])
  scaled = np.stack([np.clip(batch.reward[0] / np.sqrt(first_var + 1e-8), -2, 2),
                     np.clip(batch.reward[1] / np.sqrt(float(stats.var) + 1e-8), -2, 2)])
  assert (np.abs(scaled) == 2.0).any() and (np.abs(scaled) < 2.0).any()
  plain, _, _ = off.update(off.init(jax.random.PRNGKey(0)),
                           batch._replace(reward=scaled.astype(np.float32)))
  chex.assert_trees_all_close(host(new_state.params), host(plain.params), rtol=1e-5, atol=1e-6)
  # Rewards enter only the loss: the published params are the network's own.
  assert on.policy_params(new_state) is new_state.params
  # A batch without the return (no collector tracked it) is refused, naming the option.
  with pytest.raises(ValueError, match="normalize_rewards needs unrolls with discounted_return"):
    on.update(on.init(jax.random.PRNGKey(0)), batch._replace(discounted_return=None))


def test_the_pipeline_builds_collectors_that_track_the_agents_return():
  on = ja.PPO(ja.PPOConfig(gamma=0.9, normalize_rewards=True), OBS3, ACT2)
  off = ja.PPO(ja.PPOConfig(gamma=0.9), OBS3, ACT2)
  obs, action = np.zeros(3, np.float32), np.zeros((), np.int64)
  assert on.data.collector_factory(on)(2, obs, action).return_discount == 0.9
  assert off.data.collector_factory(off)(2, obs, action).return_discount is None


def test_bad_input_is_refused_in_one_line():
  with pytest.raises(ja.ConfigError, match="observation_clip must be > 0"):
    ja.PPO(ja.PPOConfig(normalize_observations=True, observation_clip=0.0), OBS3, ACT2)
  frames = gym.spaces.Box(0, 255, (8,), np.uint8)
  with pytest.raises(ja.ConfigError) as info:
    ja.IMPALA(ja.IMPALAConfig(normalize_observations=True), frames, ACT2, "Frames-v0")
  message = str(info.value)
  assert "\n" not in message and "Frames-v0" in message and "IMPALA" in message
  assert "--agent.normalize-observations" in message
  ja.IMPALA(ja.IMPALAConfig(), frames, ACT2, "Frames-v0")  # (off: accepted as before)
  with pytest.raises(ja.ConfigError, match="reward_clip must be > 0"):
    ja.PPO(ja.PPOConfig(normalize_rewards=True, reward_clip=-1.0), OBS3, ACT2)


def test_the_mujoco_preset_normalises_observations():
  import ppo  # experiments/ppo.py
  mujoco = ppo.parse(["--preset", "mujoco"])
  assert mujoco.agent.normalize_observations and mujoco.agent.observation_clip == 10.0
  assert mujoco.agent.normalize_rewards and mujoco.agent.reward_clip == 10.0
  assert not ppo.parse([]).agent.normalize_rewards
  assert not ppo.parse([]).agent.normalize_observations
  assert not ppo.parse(["--preset", "pendulum"]).agent.normalize_observations
  assert not ppo.parse(["--preset", "mujoco", "--agent.no-normalize-observations"]
                       ).agent.normalize_observations


class _Recorder:
  """Wraps an agent's ``update`` and ``policy`` (instance attributes): the batches trained on,
  the statistics each update call starts from and ends with (by the version it publishes),
  and the statistics of every ``policy`` call (by its batch size: actor or evaluator)."""

  def __init__(self, agent):
    self.batches, self.before, self.after, self.events = [], [], {}, []
    update, policy = agent.update, agent.policy

    def recording_update(state, batch, weights=None):
      self.batches.append(np.asarray(batch.obs))
      self.before.append(host(state.obs_stats))  # (a copy: the update donates the state)
      state, metrics, feedback = update(state, batch, weights)
      stats = host(state.obs_stats)
      self.after[int(state.opt_steps)] = stats
      self.events.append(("update", stats))
      return state, metrics, feedback

    def recording_policy(params, obs, rng, explore=True):
      self.events.append((obs.shape[0], host(params.obs_stats)))
      return policy(params, obs, rng, explore)

    agent.update, agent.policy = recording_update, recording_policy


def _pendulum_trainer(agent, logdir, max_env_steps, resume=False):
  run = ja.RunConfig(max_opts=1_000, max_env_steps=max_env_steps, updates_per_call=1,
                     eval_interval=4, eval_episodes=3, record_interval=0, logdir=str(logdir),
                     progress=False, seed=1)
  return ja.Trainer(agent, ja.EnvFactory("Pendulum-v1"), run, ja.ActorsConfig(num_envs=2),
                    resume=resume)


def test_a_sync_ppo_run_normalises_with_the_statistics_it_trained_on_and_resumes_them(tmp_path):
  """The issue's done-when: in a lock-step PPO run on Pendulum-v1 the learner's statistics are
  the mean and variance of exactly the observations it trained on, the actor and the evaluator
  act with the statistics of the version they adopted, and a resumed run restores them."""
  agent = ja.PPO(ja.PPOConfig(hidden_sizes=(16,), num_epochs=2, num_minibatches=2,
                              normalize_observations=True,
                              data=ja.UnrollConfig(unroll_length=64)),
                 gym.spaces.Box(-8.0, 8.0, (3,), np.float32),
                 gym.spaces.Box(-2.0, 2.0, (1,), np.float32), "Pendulum-v1")
  rec = _Recorder(agent)
  trainer = _pendulum_trainer(agent, tmp_path / "run", 2048)
  summary = trainer.train()
  assert summary["opt_steps"] == 16  # 2048 env steps / (64 steps x 2 envs)
  stats = host(trainer.learner.state.obs_stats)
  trained = np.concatenate([b[0, :-1].reshape(-1, 3) for b in rec.batches])
  assert len(rec.batches) == 16 and float(stats.count) == len(trained) == 2048
  mean, var = _numpy_stats(trained)
  np.testing.assert_allclose(stats.mean, mean, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(stats.var, var, rtol=1e-4)
  assert np.all(var > 0.05) and np.abs(mean).max() < 8  # (a real spread: the test can tell)
  # Each update started from the previous one's statistics (nothing else writes them).
  chex.assert_trees_all_equal(rec.before[0], host(init_running_stats((3,))))
  for i in range(1, 16):
    chex.assert_trees_all_equal(rec.before[i], rec.after[i])
  # Lock-step: every call of the actor (batch 2) and of the evaluator (batch 3) used the
  # statistics of the version published last before it: the last update's, none other.
  latest, calls = host(init_running_stats((3,))), {2: 0, 3: 0}
  for who, s in rec.events:
    if who == "update":
      latest = s
    else:
      chex.assert_trees_all_equal(s, latest)
      calls[who] += 1
  assert calls[2] == 16 * 64 and calls[3] >= 4 * 200 and len(summary["evals"]) >= 4
  assert rec.events[-1][0] == 3  # (the final evaluation, of the final params)
  # The final publication is the learner's state, and the actor ends holding it.
  published = trainer.param_store.get()
  assert published.version == 16 == trainer.feed.actor.version
  chex.assert_trees_all_equal(host(published.params.obs_stats), stats)
  chex.assert_trees_all_equal(host(trainer.feed.actor.params.obs_stats), stats)
  # Resume: the checkpoint holds the statistics, and the resumed run starts from them.
  # (The same agent, its compiled calls reused; a fresh learner state, then the checkpoint's.)
  calls = len(rec.before)
  resumed = _pendulum_trainer(agent, tmp_path / "run", 2048 + 256, resume=True)
  chex.assert_trees_all_equal(host(resumed.learner.state.obs_stats), stats)
  resumed.train()
  assert len(rec.before) == calls + 2
  chex.assert_trees_all_equal(rec.before[calls], stats)
  assert float(rec.after[17].count) == 2048 + 128


def test_a_sync_ppo_run_scales_rewards_by_the_return_its_actor_continued_across_unrolls(
    tmp_path):
  """``normalize_rewards`` through the real pipeline: the actor's collector continues each
  sub-env's discounted return across unroll boundaries (Pendulum's 200-step episodes span
  several 64-step unrolls), the learner's statistics are those of exactly the returns of the
  steps it trained on, and a resumed run restores them from the checkpoint."""
  gamma = 0.9
  agent = ja.PPO(ja.PPOConfig(hidden_sizes=(16,), num_epochs=1, num_minibatches=2, gamma=gamma,
                              normalize_rewards=True, data=ja.UnrollConfig(unroll_length=64)),
                 gym.spaces.Box(-8.0, 8.0, (3,), np.float32),
                 gym.spaces.Box(-2.0, 2.0, (1,), np.float32), "Pendulum-v1")
  batches, update = [], agent.update

  def recording_update(state, batch, weights=None):
    batches.append(jax.tree.map(lambda x: np.asarray(x)[0], batch))  # (k = 1)
    return update(state, batch, weights)

  agent.update = recording_update
  trainer = _pendulum_trainer(agent, tmp_path / "run", 1024)
  trainer.train()
  assert len(batches) == 8  # 1024 env steps / (64 steps x 2 envs)
  # By hand over the whole timeline (consecutive unrolls share their boundary row).
  reward = np.concatenate([batches[0].reward[:1]] + [b.reward[1:] for b in batches])
  first = np.concatenate([batches[0].first[:1]] + [b.first[1:] for b in batches])
  running, by_hand = np.zeros(2), []
  for r, f in zip(reward, first):
    running = np.where(f, 0.0, gamma * running + r)
    by_hand.append(running)
  by_hand = np.asarray(by_hand)
  got = np.concatenate([batches[0].discounted_return[:1]]
                       + [b.discounted_return[1:] for b in batches])
  np.testing.assert_allclose(got, by_hand, rtol=1e-5, atol=1e-4)
  assert first[1:].sum() == 2 * 2 and (by_hand < -20).any()  # (2 episodes ended per sub-env)
  counted = by_hand[1:][~first[1:]]
  stats = host(trainer.learner.state.return_stats)
  assert float(stats.count) == len(counted) == 1024 - 4  # (the autoreset steps are no steps)
  np.testing.assert_allclose(stats.mean, counted.mean(), rtol=1e-4)
  np.testing.assert_allclose(stats.var, counted.var(), rtol=1e-3)
  resumed = _pendulum_trainer(agent, tmp_path / "run", 1024 + 128, resume=True)
  chex.assert_trees_all_equal(host(resumed.learner.state.return_stats), stats)

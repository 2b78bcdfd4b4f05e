"""SAC: its maths against hand computations, its wiring, its errors, and that it learns Pendulum."""

from __future__ import annotations

import dataclasses
import functools
import math
import subprocess
import sys
import threading

import chex
import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxasync as ja
from jaxasync.agents.continuous import scale_actions, squashed_gaussian, unscale_actions
from jaxasync.agents.sac import actor_objective, soft_q_target, temperature_loss
from continuous_helpers import (ASYM, OBS3, PENDULUM, REPO, UNSUITABLE_ACTION_SPACES,
                                assert_refused_with_the_fix, continuous_batch,
                                pendulum_run_in_sync)
from helpers import assert_no_strays, host

TINY = ja.SACConfig(hidden_sizes=(16, 16), batch_size=8)


# --- the maths --------------------------------------------------------------------------------
def test_soft_q_target_by_hand():
  reward = jnp.array([1.0, 2.0])
  discount = jnp.array([0.99, 0.0])  # the second episode terminated: no bootstrap at all
  next_q = jnp.array([[3.0, 4.0], [5.0, 1.0]])  # [2 critics, B]: min = [3, 1]
  next_log_prob = jnp.array([0.5, -1.0])
  y = soft_q_target(reward, discount, next_q, next_log_prob, 0.2)
  # 1 + 0.99 * (3 - 0.2 * 0.5) = 1 + 0.99 * 2.9 = 3.871; 2 + 0 = 2
  np.testing.assert_allclose(y, [3.871, 2.0], rtol=1e-6)


def test_actor_objective_by_hand():
  log_prob = jnp.array([0.1, -0.2])
  q = jnp.array([[1.0, 2.0], [0.0, 5.0]])  # min over critics: [0, 2]
  # mean(0.5 * 0.1 - 0, 0.5 * -0.2 - 2) = mean(0.05, -2.1) = -1.025
  np.testing.assert_allclose(actor_objective(log_prob, q, 0.5), -1.025, rtol=1e-6)


def test_temperature_loss_gradient_by_hand():
  log_prob = jnp.array([0.2, 0.4])  # entropy estimate -0.3
  # d/d log(alpha) = -(mean(log_prob) + target) = -(0.3 - 1.0) = 0.7 > 0: entropy -0.3 is above
  # the target -1, so gradient descent lowers alpha.
  grad = jax.grad(temperature_loss)(jnp.float32(0.3), log_prob, -1.0)
  np.testing.assert_allclose(grad, 0.7, rtol=1e-6)
  # Below the target (entropy -3 < -1): alpha rises.
  assert jax.grad(temperature_loss)(0.0, jnp.array([3.0]), -1.0) < 0


def test_squashed_gaussian_log_prob_matches_the_change_of_variables():
  mean, log_std = jnp.array([0.3, -1.2]), jnp.array([-0.5, 0.4])
  dist = squashed_gaussian(mean, log_std)
  action, log_prob = dist.sample_and_log_prob(seed=jax.random.PRNGKey(3), sample_shape=(5,))
  chex.assert_shape(action, (5, 2))
  assert np.all(np.abs(action) < 1)
  u = np.arctanh(np.asarray(action, np.float64))
  std = np.exp(np.asarray(log_std, np.float64))
  normal = -0.5 * ((u - np.asarray(mean)) / std) ** 2 - np.log(std) - 0.5 * np.log(2 * np.pi)
  expected = np.sum(normal - np.log(1 - np.tanh(u) ** 2), axis=-1)
  np.testing.assert_allclose(log_prob, expected, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(dist.log_prob(action), expected, rtol=1e-3, atol=1e-3)


def test_squashed_gaussian_density_is_the_derivative_of_its_cdf():
  """1-D numerical check: P(a <= x) = Phi((atanh(x) - m) / s), so the density is its slope."""
  m, s = 0.4, 0.7
  dist = squashed_gaussian(jnp.array([m]), jnp.log(jnp.array([s])))
  phi = lambda z: 0.5 * (1 + math.erf(z / math.sqrt(2)))
  cdf = lambda x: phi((math.atanh(x) - m) / s)
  for x in (-0.9, -0.2, 0.3, 0.8):
    h = 1e-5
    numeric = (cdf(x + h) - cdf(x - h)) / (2 * h)
    np.testing.assert_allclose(float(jnp.exp(dist.log_prob(jnp.array([x])))), numeric, rtol=1e-3)


def test_action_scaling_on_an_asymmetric_box():
  low, high = ASYM.low, ASYM.high
  unit = np.array([[-1.0, -1.0], [1.0, 1.0], [0.0, 0.0], [0.5, -0.5]], np.float32)
  env = scale_actions(unit, low, high)
  np.testing.assert_allclose(env, [[-1, 0], [3, 10], [1, 5], [2, 2.5]], rtol=1e-6)
  np.testing.assert_allclose(unscale_actions(env, low, high), unit, atol=1e-6)
  # A stored action an ulp outside the Box maps back inside [-1, 1].
  assert float(unscale_actions(np.array([3.0000002, 10.000001]), low, high).max()) == 1.0


def test_policy_actions_stay_in_the_box_and_evaluation_is_the_scaled_tanh_mean():
  agent = ja.SAC(TINY, OBS3, ASYM)
  params = agent.policy_params(agent.init(jax.random.PRNGKey(0)))
  obs = np.random.default_rng(0).normal(size=(64, 3)).astype(np.float32)
  rng = np.random.default_rng(1)
  sampled = agent.policy(params, obs, rng)
  chex.assert_shape(sampled, (64, 2))
  assert sampled.dtype == np.float32
  assert np.all(sampled >= ASYM.low) and np.all(sampled <= ASYM.high)
  assert not np.allclose(sampled, agent.policy(params, obs, rng))  # fresh noise per call
  mean, _ = agent.actor.apply(params, obs)
  np.testing.assert_allclose(agent.policy(params, obs, rng, explore=False),
                             scale_actions(np.tanh(mean), ASYM.low, ASYM.high), rtol=1e-5)
  past_warmup = agent.initial_actor_state(ja.ActorContext(env_steps=10 ** 9))
  actions, extras, state = agent.act(params, obs, past_warmup, rng)
  assert extras is None and actions.shape == (64, 2)
  assert state.env_steps == past_warmup.env_steps + 1


def test_random_actions_during_the_warmup_then_the_policy():
  """Uniform random actions over the Box while the run's env steps (this actor's times the
  actors) are within the data's warmup_period, then the policy's own samples; the evaluator
  never; with random_warmup off, the policy at once (the preset's 5k random steps were the
  policy's before: its initial actor is near bang-bang on HalfCheetah)."""
  config = dataclasses.replace(TINY, data=ja.ReplayConfig(n_step=1, warmup_period=100))
  agent = ja.SAC(config, OBS3, ASYM)
  params = agent.policy_params(agent.init(jax.random.PRNGKey(0)))
  obs = np.zeros((500, 3), np.float32)  # one obs: the policy's samples share one mean and std
  rng = np.random.default_rng(0)
  state = agent.initial_actor_state(ja.ActorContext(num_actors=2, num_envs=10))
  assert (state.random_steps, state.steps_per_call) == (100, 20)
  seen = []
  for _ in range(7):  # run steps 0, 20, ..., 120: random below 100
    random_now = agent.actor_metrics(state)["random_actions"]
    policy_actions = agent.policy(params, obs, rng)
    env, _, state = agent.select(policy_actions, state, rng)
    seen.append((random_now, env, policy_actions))
  assert [r for r, _, _ in seen] == [1.0] * 5 + [0.0] * 2
  for _, env, policy_actions in seen[:5]:  # uniform over [-1, 3] x [0, 10]
    assert np.all(env >= ASYM.low) and np.all(env <= ASYM.high)
    # (5 standard errors of a mean of 500: 4 / 12 ** 0.5 / 500 ** 0.5 = 0.052, 0.13 for 10)
    assert np.all(np.abs(env.mean(0) - [1.0, 5.0]) < [0.26, 0.65]), env.mean(0)
    np.testing.assert_allclose(env.std(0), [4 / 12 ** 0.5, 10 / 12 ** 0.5], rtol=0.1)
  for _, env, policy_actions in seen[5:]:
    np.testing.assert_array_equal(env, policy_actions)
  evaluator = agent.initial_actor_state(ja.ActorContext(evaluation=True))
  env, _, _ = agent.select(policy_actions, evaluator, rng)
  np.testing.assert_array_equal(env, policy_actions)
  # A restarted actor continues: 3 actors, 40 env steps each before -> the run is at 120.
  assert agent.initial_actor_state(ja.ActorContext(num_actors=3, env_steps=40)).env_steps == 120
  no_warmup = ja.SAC(dataclasses.replace(config, random_warmup=False), OBS3, ASYM)
  state = no_warmup.initial_actor_state(ja.ActorContext())
  np.testing.assert_array_equal(no_warmup.select(policy_actions, state, rng)[0], policy_actions)
  # A lock-step checkpoint from before the warmup existed holds no actor state: the policy.
  np.testing.assert_array_equal(agent.select(policy_actions, None, rng)[0], policy_actions)


# --- the update's wiring ------------------------------------------------------------------------
def test_critic_loss_is_the_soft_td_of_the_target_critics():
  """The loss through the agent equals one built from its parts: target critics (not the
  online ones) at a' ~ pi(.|s'), the temperature from the state, stored actions unscaled, the
  importance weights applied, discount 0 removing the bootstrap."""
  agent = ja.SAC(dataclasses.replace(TINY, init_temperature=0.3), OBS3, ASYM)
  state = agent.init(jax.random.PRNGKey(0))
  # Make the targets differ from the online critics, so using the wrong ones would show.
  state = state.replace(target_critic_params=jax.tree.map(lambda x: x * 0.5,
                                                          state.critic_params))
  rng = np.random.default_rng(0)
  batch = continuous_batch(rng, (8,))
  weights = rng.uniform(0.5, 1.5, 8).astype(np.float32)
  key = jax.random.PRNGKey(7)
  loss, (abs_td, _) = agent.critic_loss(state.critic_params, state, batch, weights, key)

  mean, log_std = agent.actor.apply(state.actor_params, batch.next_obs)
  a_next, logp_next = squashed_gaussian(mean, log_std).sample_and_log_prob(seed=key)
  q_next = np.asarray(agent.critic.apply(state.target_critic_params, batch.next_obs, a_next))
  y = batch.reward + batch.discount * (q_next.min(0) - 0.3 * np.asarray(logp_next))
  unit = 2 * (batch.action - ASYM.low) / (ASYM.high - ASYM.low) - 1
  q = np.asarray(agent.critic.apply(state.critic_params, batch.obs, unit))
  chex.assert_shape(q, (2, 8))
  expected = 0.5 * sum(np.mean(weights * (q[i] - y) ** 2) for i in range(2))
  np.testing.assert_allclose(loss, expected, rtol=1e-5)
  np.testing.assert_allclose(abs_td, np.abs(q - y).mean(0), rtol=1e-5)
  terminated = batch.discount == 0
  assert terminated.any()
  np.testing.assert_allclose(y[terminated], batch.reward[terminated], rtol=1e-6)


def test_update_moves_every_part_and_polyak_averages_the_targets():
  config = dataclasses.replace(TINY, tau=0.1)
  agent = ja.SAC(config, OBS3, ASYM)
  before = host(agent.init(jax.random.PRNGKey(0)))
  batch = continuous_batch(np.random.default_rng(0), (1, 8))
  after, metrics, feedback = agent.update(jax.tree.map(jnp.asarray, before), batch)
  after = host(after)
  chex.assert_shape(feedback, (1, 8))
  assert int(after.opt_steps) == 1
  for name in ("actor_params", "critic_params", "log_temperature"):
    assert not jax.tree.all(jax.tree.map(np.allclose, getattr(before, name), getattr(after, name))), name
  # target' = 0.1 * online' + 0.9 * target (the target was a copy of the online critic).
  expected = jax.tree.map(lambda new, old: 0.1 * new + 0.9 * old, after.critic_params,
                          before.target_critic_params)
  chex.assert_trees_all_close(after.target_critic_params, expected, rtol=1e-5, atol=1e-6)
  assert set(metrics) >= {"critic_loss", "actor_loss", "temperature", "entropy", "q_mean"}
  # Twin critics are two independent networks, not one twice.
  kernel = before.critic_params["params"]["MLPTorso_0"]["Dense_0"]["kernel"]
  assert kernel.shape[0] == 2 and not np.allclose(kernel[0], kernel[1])


def test_fixed_temperature_and_policy_delay():
  config = dataclasses.replace(TINY, autotune_temperature=False, init_temperature=0.05,
                               policy_delay=2)
  agent = ja.SAC(config, OBS3, ASYM)
  rng = np.random.default_rng(0)
  state = agent.init(jax.random.PRNGKey(0))
  actors = []
  for _ in range(3):  # SGD steps 0, 1, 2: the actor moves at 0 and 2, not at 1
    before = host(state.actor_params)
    state, metrics, _ = agent.update(state, continuous_batch(rng, (1, 8)))
    actors.append(not jax.tree.all(jax.tree.map(np.allclose, before, host(state.actor_params))))
  assert actors == [True, False, True]
  np.testing.assert_allclose(float(metrics["temperature"]), 0.05, rtol=1e-6)
  # Over k=2 steps with one actor step, the actor metrics are that step's, not halved.
  state, metrics, _ = agent.update(state, continuous_batch(rng, (2, 8)))
  assert float(metrics["entropy"]) != 0.0


def test_update_and_policy_never_retrace():
  agent = ja.SAC(TINY, OBS3, ASYM)
  # The agent's own update function, traced under chex's counter: state dtypes and shapes must
  # come back exactly as they went in, or every call would compile again.
  update = jax.jit(chex.assert_max_traces(agent._update, n=1), donate_argnums=0)
  sample = jax.jit(chex.assert_max_traces(agent._sample_actions, n=1))
  rng = np.random.default_rng(0)
  state = agent.init(jax.random.PRNGKey(0))
  for _ in range(4):
    state, _, _ = update(state, continuous_batch(rng, (3, 8)))
    sample(agent.policy_params(state), rng.normal(size=(4, 3)).astype(np.float32),
           np.uint32(rng.integers(2 ** 31)))
  for _ in range(3):
    state, _, _ = agent.update(state, continuous_batch(rng, (3, 8)))
    agent.policy(agent.policy_params(state), rng.normal(size=(4, 3)).astype(np.float32), rng)
  assert agent._jitted_update._cache_size() == 1
  assert agent.sample_actions._cache_size() == 1


def test_image_observations_use_a_cnn_torso():
  grid = gym.spaces.Box(0, 1, (10, 10, 4), np.float32)
  agent = ja.SAC(TINY, grid, ASYM)
  state = agent.init(jax.random.PRNGKey(0))
  assert "MinAtarCNN_0" in state.actor_params["params"]
  rng = np.random.default_rng(0)
  batch = ja.Transition(
      obs=rng.random((1, 8, 10, 10, 4), np.float32), action=np.ones((1, 8, 2), np.float32),
      reward=np.zeros((1, 8), np.float32), discount=np.full((1, 8), 0.99, np.float32),
      next_obs=rng.random((1, 8, 10, 10, 4), np.float32))
  state, metrics, _ = agent.update(state, batch)
  assert np.isfinite(float(metrics["critic_loss"]))
  chex.assert_shape(agent.policy(agent.policy_params(state), batch.obs[0], rng), (8, 2))


# --- errors -------------------------------------------------------------------------------------
@pytest.mark.parametrize("space, words", UNSUITABLE_ACTION_SPACES)
def test_unsuitable_action_spaces_are_refused_with_the_fix(space, words):
  assert_refused_with_the_fix(ja.SAC, TINY, space, words)


def test_bad_settings_are_refused():
  for bad in (dict(policy_delay=0), dict(tau=0.0), dict(critic_learning_rate=float("nan")),
              dict(log_std_min=3.0), dict(torso="resnet")):
    with pytest.raises(ja.ConfigError):
      ja.SAC(dataclasses.replace(TINY, **bad), OBS3, ASYM)


def test_experiment_refuses_a_discrete_env(tmp_path):
  out = subprocess.run([sys.executable, "experiments/sac.py", "--env-id", "CartPole-v1",
                        "--logdir", str(tmp_path / "run")], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
  assert out.returncode == 2, out.stderr[-2000:]
  assert "error:" in out.stderr and "DQN" in out.stderr


# --- learning -----------------------------------------------------------------------------------
def _pendulum_config(tmp_path, **kw):
  base = dict(max_opts=20_000, max_env_steps=6_000, eval_interval=1_000, eval_episodes=5,
              seed=0, progress=False, logdir=str(tmp_path))
  return ja.RunConfig(**{**base, **kw})


def _pendulum_data(**kw):
  return ja.ReplayConfig(**{**dict(warmup_period=500, n_step=1), **kw})


@pytest.mark.slow
def test_experiment_learns_pendulum_in_sync(tmp_path):
  """experiments/sac.py's defaults (sync, cut to 6k env steps): a random policy scores about
  -1200; SAC reaches about -150 within 4-5k env steps here."""
  summary = pendulum_run_in_sync("experiments/sac.py", tmp_path / "run")
  evals = [round(e["eval_reward"]) for e in summary["evals"]]
  assert summary["best_eval_reward"] >= -250, evals


@pytest.mark.slow
def test_sac_learns_pendulum_with_process_actors(tmp_path):
  before = {t.ident for t in threading.enumerate()}
  config = _pendulum_config(tmp_path, max_env_steps=8_000)
  agent_config = ja.SACConfig(hidden_sizes=(128, 128), batch_size=128,
                              data=_pendulum_data(samples_per_insert=128.0))
  factory = functools.partial(ja.SAC, agent_config, *ja.envs.spaces_of(PENDULUM),
                              PENDULUM.env_id)
  trainer = ja.Trainer(factory(), PENDULUM, config,
                       ja.ActorsConfig(mode="process", num_envs=4, sync_interval=10),
                       agent_factory=factory)
  summary, stats = trainer.train(), trainer.actor_stats
  evals = [round(e["eval_reward"]) for e in summary["evals"]]
  assert summary["best_eval_reward"] >= -250, evals
  assert stats[0].env_steps > 0
  assert_no_strays(before)


def test_cli_presets():
  from jaxasync.train.sac import parse
  pendulum = parse(["--seed", "3"])
  assert (pendulum.env_id, pendulum.run.seed, pendulum.agent.batch_size) == ("Pendulum-v1", 3, 128)
  mujoco = parse(["--preset", "mujoco", "--env-id", "Hopper-v5", "--agent.batch-size", "128"])
  assert mujoco.env_id == "Hopper-v5" and mujoco.agent.batch_size == 128  # a flag after the preset wins
  # Tianshou's mujoco_sac.py: Adam 1e-3 for both, a fixed alpha of 0.2, 10k random steps
  assert (mujoco.agent.actor_learning_rate, mujoco.agent.critic_learning_rate) == (1e-3, 1e-3)
  assert not mujoco.agent.autotune_temperature and mujoco.agent.init_temperature == 0.2
  assert (mujoco.agent.data.warmup_period, mujoco.agent.data.replay_capacity) == (10_000, 1_000_000)
  assert mujoco.agent.policy_delay == 1 and mujoco.agent.hidden_sizes == (256, 256)
  assert mujoco.run.max_env_steps == 1_000_000 and mujoco.run.eval_interval == 10_000


class Float64Pendulum:
  """A ``VectorEnvFactory`` of Pendulum-v1 with float64 observations (as MuJoCo's)."""

  env_id, frame_skip = "Pendulum-v1", 1

  def __call__(self, num_envs, seed=None):
    space = gym.spaces.Box(-8.0, 8.0, (3,), np.float64)
    env = gym.make_vec("Pendulum-v1", num_envs=num_envs, vectorization_mode="sync", wrappers=[
        lambda e: gym.wrappers.TransformObservation(e, lambda o: o.astype(np.float64), space)])
    env.reset(seed=seed)
    return env


def test_float64_observations_are_stored_as_float32(tmp_path):
  """JAX computes in float32 (x64 off): the replay, the actor's collector and the chunks keep
  float64 observations as float32, half the bytes, and the run learns from them as before."""
  from jaxasync.envs import spaces_of
  from jaxasync.types import storage_dtype
  assert storage_dtype(np.float64) == np.float32 and storage_dtype(np.uint8) == np.uint8
  assert storage_dtype(np.float32) == np.float32
  factory = Float64Pendulum()
  assert factory(1, seed=0).single_observation_space.dtype == np.float64
  agent = ja.SAC(ja.SACConfig(hidden_sizes=(16,), batch_size=32,
                              data=ja.ReplayConfig(warmup_period=64, n_step=1)),
                 *spaces_of(factory), "Pendulum-v1")
  run = ja.RunConfig(max_opts=50, max_env_steps=10_000, updates_per_call=1, eval_interval=0,
                     record_interval=0, logdir=str(tmp_path / "run"), progress=False)
  trainer = ja.Trainer(agent, factory, run, ja.ActorsConfig(num_envs=2))
  summary = trainer.train()
  assert summary["opt_steps"] == 50
  # obs and next_obs 3 x 4 bytes each, action, reward and discount 4 each (float64: 60).
  assert trainer.replay.bytes_per_item == 36
  assert trainer.feed.actor.collector.obs.dtype == np.float32

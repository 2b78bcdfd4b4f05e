"""PQN: Q(lambda) returns against hand computations (terminated and truncated boundaries),
the loss's mask, the learner's wiring of an unroll into targets, acting, and learning."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import chex
import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxasync as ja
from jaxasync.agents.pqn import QLambdaBatch, q_lambda_loss, q_lambda_returns
from jaxasync.collectors.unrolls import Unroll


def _column(x):
  """``[T]`` -> ``[T, 1]`` (one sub-env)."""
  return jnp.asarray(x, jnp.float32)[:, None]


def _q_with_max(v):
  """Q-values ``[T, 1, 2]`` whose maximum over the two actions is ``v`` ``[T]``."""
  v = jnp.asarray(v, jnp.float32)
  return jnp.stack([v - 1.0, v], axis=-1)[:, None]


def test_q_lambda_returns_stop_at_a_termination_and_at_a_reset_pair():
  # Pairs: 0 -> 1 real, 1 -> 2 terminates (discount 0), 2 -> 3 is the reset pair (no
  # transition), 3 -> 4 real. gamma 0.9, lambda 0.5.
  r = _column([1.0, 2.0, 0.0, 3.0])
  d = _column([0.9, 0.0, 0.9, 0.9])
  mask = jnp.array([True, True, False, True])[:, None]
  v = [10.0, 7.0, 5.0, 4.0]  # max_a Q of each pair's next observation
  g = q_lambda_returns(r, d, mask, _q_with_max(v), 0.5)
  chex.assert_shape(g, (4, 1))
  g3 = 3.0 + 0.9 * 4.0  # the unroll's end bootstraps fully
  g1 = 2.0  # terminated: nothing bootstrapped, and nothing of the next episode
  g0 = 1.0 + 0.9 * (0.5 * 10.0 + 0.5 * g1)
  np.testing.assert_allclose(np.asarray(g)[[0, 1, 3], 0], [g0, g1, g3], rtol=1e-6)


def test_a_truncated_episode_bootstraps_from_its_final_observation_only():
  # Pair 0 -> 1 is truncated (discount gamma, the next pair is the reset pair): its return
  # is r + gamma max_a Q(final obs), whatever the next episode's return is.
  r = _column([1.0, 0.0, 5.0])
  d = _column([0.9, 0.9, 0.9])
  mask = jnp.array([True, False, True])[:, None]
  v = [10.0, 100.0, 2.0]
  g = np.asarray(q_lambda_returns(r, d, mask, _q_with_max(v), 0.5))
  np.testing.assert_allclose(g[0, 0], 1.0 + 0.9 * 10.0, rtol=1e-6)
  np.testing.assert_allclose(g[2, 0], 5.0 + 0.9 * 2.0, rtol=1e-6)


@pytest.mark.parametrize("q_lambda", [0.0, 1.0])
def test_lambda_0_is_one_step_q_learning_and_lambda_1_the_discounted_return(q_lambda):
  r = _column([1.0, 2.0, 3.0])
  d = _column([0.5, 0.5, 0.5])
  mask = jnp.ones((3, 1), bool)
  v = [4.0, 6.0, 8.0]
  g = np.asarray(q_lambda_returns(r, d, mask, _q_with_max(v), q_lambda))[:, 0]
  if q_lambda == 0.0:
    np.testing.assert_allclose(g, [1 + 0.5 * 4, 2 + 0.5 * 6, 3 + 0.5 * 8], rtol=1e-6)
  else:
    g2 = 3 + 0.5 * 8
    np.testing.assert_allclose(g, [1 + 0.5 * (2 + 0.5 * g2), 2 + 0.5 * g2, g2], rtol=1e-6)


def test_the_loss_is_half_the_squared_error_over_real_transitions():
  q = jnp.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
  batch = QLambdaBatch(obs=jnp.zeros((3, 1)), action=jnp.array([1, 0, 1]),
                       target=jnp.array([4.0, 3.0, 100.0]), mask=jnp.array([True, True, False]))
  loss, metrics = q_lambda_loss(q, batch)
  np.testing.assert_allclose(loss, (0.5 * (4.0 - 2.0) ** 2 + 0.0) / 2, rtol=1e-6)
  np.testing.assert_allclose(metrics["q_mean"], (2.0 + 3.0) / 2, rtol=1e-6)


def test_the_huber_loss_is_quadratic_up_to_delta_and_linear_beyond():
  q = jnp.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
  # Errors: 2.5 (beyond delta 1), 0.5 (within), and a masked pair.
  batch = QLambdaBatch(obs=jnp.zeros((3, 1)), action=jnp.array([1, 0, 1]),
                       target=jnp.array([4.5, 3.5, 100.0]), mask=jnp.array([True, True, False]))
  loss, _ = q_lambda_loss(q, batch, huber_delta=1.0)
  np.testing.assert_allclose(loss, ((2.5 - 0.5) + 0.5 * 0.5 ** 2) / 2, rtol=1e-6)


def _agent(**kwargs):
  space = gym.spaces.Box(-10.0, 10.0, (2,), np.float32)
  return ja.PQN(ja.PQNConfig(hidden_sizes=(8,), **kwargs), space, gym.spaces.Discrete(2))


def test_the_agents_loss_takes_its_configs_huber_delta():
  batch = QLambdaBatch(obs=jnp.array([[0.5, -1.0], [2.0, 3.0]]), action=jnp.array([0, 1]),
                       target=jnp.array([40.0, -30.0]), mask=jnp.array([True, True]))
  for delta in (0.0, 1.0):
    agent = _agent(huber_delta=delta)
    params = agent.init(jax.random.PRNGKey(0)).params
    loss, _ = agent.loss(params, batch)
    expected, _ = q_lambda_loss(agent.network.apply(params, batch.obs), batch, delta)
    np.testing.assert_allclose(loss, expected, rtol=1e-6)
  # Errors of 30-40: Huber's (delta 1) is about their mean absolute value, the square's hundreds.
  assert float(loss) < 50.0 < float(_agent().loss(params, batch)[0])


def test_an_unroll_becomes_flat_targets_from_the_learners_network():
  agent = _agent(gamma=0.9, q_lambda=0.5)
  # Q(obs) = obs (two actions, two features), so max_a Q(obs) = max(obs).
  agent.network = types.SimpleNamespace(apply=lambda params, obs: obs)
  # T = 3 pairs, N = 2 sub-envs. Sub-env 0 terminates on arriving at timestep 2, then resets
  # at timestep 3; sub-env 1 runs on.
  obs = jnp.array([[[0, 1], [0, 1]], [[0, 2], [0, 2]], [[0, 9], [0, 3]], [[0, 5], [0, 4]]],
                  jnp.float32)
  reward = jnp.array([[0, 0], [1, 1], [1, 1], [0, 1]], jnp.float32)
  discount = jnp.array([[1, 1], [1, 1], [0, 1], [1, 1]], jnp.float32)
  first = jnp.array([[1, 1], [0, 0], [0, 0], [1, 0]], bool)
  unroll = Unroll(obs=obs, action=jnp.array([[1, 0], [0, 1], [1, 1], [0, 0]]), extras=None,
                  reward=reward, discount=discount, first=first, last=jnp.zeros((4, 2), bool))
  batch = agent.iteration_batch(None, unroll)
  chex.assert_shape([batch.action, batch.target, batch.mask], (6,))
  # Batch-major: sub-env 0's three pairs, then sub-env 1's.
  np.testing.assert_array_equal(batch.mask, [True, True, False, True, True, True])
  np.testing.assert_array_equal(batch.action, [1, 0, 1, 0, 1, 1])
  env1 = [None, None, 1 + 0.9 * 4.0]
  env1[1] = 1 + 0.9 * (0.5 * 3.0 + 0.5 * env1[2])
  env1[0] = 1 + 0.9 * (0.5 * 2.0 + 0.5 * env1[1])
  env0_1 = 1.0  # terminated at timestep 2
  env0_0 = 1 + 0.9 * (0.5 * 2.0 + 0.5 * env0_1)
  np.testing.assert_allclose(np.asarray(batch.target)[[0, 1, 3, 4, 5]],
                             [env0_0, env0_1, *env1], rtol=1e-6)


@pytest.mark.parametrize("truncation_as_termination", [False, True])
def test_a_time_limit_ends_the_return_only_when_asked(truncation_as_termination):
  agent = _agent(gamma=0.9, q_lambda=0.5, truncation_as_termination=truncation_as_termination)
  agent.network = types.SimpleNamespace(apply=lambda params, obs: obs)  # max_a Q = max(obs)
  # One sub-env, T = 3 pairs: the episode is cut by its time limit on arriving at timestep 1
  # (last, discount 1), the next one starts at timestep 2 and runs on.
  obs = jnp.array([[[0, 1]], [[0, 6]], [[0, 3]], [[0, 4]]], jnp.float32)
  unroll = Unroll(obs=obs, action=jnp.zeros((4, 1), jnp.int32), extras=None,
                  reward=jnp.array([[0], [1], [0], [2]], jnp.float32),
                  discount=jnp.ones((4, 1), jnp.float32),
                  first=jnp.array([[1], [0], [1], [0]], bool),
                  last=jnp.array([[0], [1], [0], [0]], bool))
  batch = agent.iteration_batch(None, unroll)
  np.testing.assert_array_equal(batch.mask, [True, False, True])
  cut = 1.0 if truncation_as_termination else 1.0 + 0.9 * 6.0
  np.testing.assert_allclose(np.asarray(batch.target)[[0, 2]], [cut, 2.0 + 0.9 * 4.0],
                             rtol=1e-6)


def test_actors_explore_on_the_schedule_and_evaluate_greedily():
  agent = _agent(eps_start=1.0, eps_end=0.0, eps_decay_steps=100, eval_epsilon=0.0)
  params = agent.policy_params(agent.init(jax.random.PRNGKey(0)))
  obs = np.zeros((64, 2), np.float32)
  rng = np.random.default_rng(0)
  greedy = agent.policy(params, obs, rng)
  chex.assert_shape(greedy, (64,))
  training = agent.initial_actor_state(ja.ActorContext(num_envs=64))
  actions, extras, training = agent.select(greedy, training, rng)
  assert extras is None and training.env_steps == 64
  assert 0 < np.mean(actions != greedy) < 1  # epsilon 1: uniform actions, half of them differ
  evaluation = agent.initial_actor_state(ja.ActorContext(num_envs=64, evaluation=True))
  actions, _, _ = agent.select(greedy, evaluation, rng)
  np.testing.assert_array_equal(actions, greedy)


def test_pqn_acts_as_dqn_does():
  """One epsilon-greedy acting for both (exploration.EpsilonGreedyActing), checked against the
  schedule by hand: a training actor starts at its env steps times the actors and counts
  num_envs x num_actors per call; an evaluation explores with eval_epsilon and counts too."""
  from jaxasync.agents.exploration import EpsilonGreedyActing
  settings = dict(eps_start=0.9, eps_end=0.1, eps_decay_steps=200, eval_epsilon=0.05)
  cartpole = gym.make("CartPole-v1")
  pqn = ja.PQN(ja.PQNConfig(**settings), cartpole.observation_space, cartpole.action_space)
  dqn = ja.DQN(ja.DQNConfig(**settings), cartpole.observation_space, cartpole.action_space)
  assert isinstance(pqn, EpsilonGreedyActing) and isinstance(dqn, EpsilonGreedyActing)
  greedy = np.arange(8, dtype=np.int32) % 2
  by_hand = lambda steps: 0.9 - 0.8 * min(steps, 200) / 200  # linear, then flat at 0.1
  for agent in (pqn, dqn):
    state = agent.initial_actor_state(
        ja.ActorContext(actor_id=1, num_actors=2, num_envs=8, env_steps=30))
    assert (state.env_steps, state.steps_per_call, state.fixed) == (60, 16, None)
    rng = np.random.default_rng(5)
    for call in range(1, 11):
      actions, extras, state = agent.select(greedy, state, rng)
      assert extras is None and actions.dtype == cartpole.action_space.dtype
      assert state.env_steps == 60 + 16 * call
      np.testing.assert_allclose(agent.actor_metrics(state)["epsilon"],
                                 by_hand(60 + 16 * call), rtol=1e-12)
    assert agent.actor_metrics(state)["epsilon"] == pytest.approx(0.1)  # (220 steps: flat)
    evaluation = agent.initial_actor_state(ja.ActorContext(num_envs=8, evaluation=True))
    for call in range(1, 4):
      _, _, evaluation = agent.select(greedy, evaluation, rng)
      assert evaluation.env_steps == 8 * call and evaluation.fixed == 0.05
    assert agent.actor_metrics(evaluation) == {"epsilon": 0.05}
  # Epsilon 0.05 over 20,000 draws: about 2.5 % of actions leave the greedy one (half the
  # random actions are the greedy one), far from the schedule's start.
  rng = np.random.default_rng(0)
  many = np.zeros(20_000, np.int32)
  actions, _, _ = pqn.select(many, pqn.fixed_epsilon(0.05), rng)
  assert 0.02 < np.mean(actions != many) < 0.03


def test_update_runs_epochs_of_minibatches_and_counts_iterations():
  agent = _agent(num_epochs=2, num_minibatches=3, data=ja.UnrollConfig(unroll_length=5))
  state = agent.init(jax.random.PRNGKey(0))
  t1, n = 6, 3  # 5 pairs x 3 sub-envs = 15 transitions, 3 minibatches of 5
  rng = np.random.default_rng(1)
  unroll = Unroll(obs=rng.normal(size=(1, t1, n, 2)).astype(np.float32),
                  action=rng.integers(0, 2, (1, t1, n)).astype(np.int64), extras=None,
                  reward=np.ones((1, t1, n), np.float32), discount=np.ones((1, t1, n), np.float32),
                  first=np.zeros((1, t1, n), bool), last=np.zeros((1, t1, n), bool))
  before = jax.tree.map(np.array, state.params)
  state, metrics, feedback = agent.update(state, unroll)
  assert int(state.opt_steps) == 1 and feedback is None
  assert np.isfinite(float(metrics["loss"])) and float(metrics["grad_norm"]) > 0
  changed = jax.tree.map(lambda a, b: not np.allclose(a, b), before, state.params)
  assert all(jax.tree.leaves(changed))
  with pytest.raises(ja.ConfigError, match="num_minibatches=4 does not divide"):
    _agent(num_minibatches=4, data=ja.UnrollConfig(unroll_length=5)).update(
        agent.init(jax.random.PRNGKey(0)), unroll)


@pytest.mark.parametrize("field, value, message", [
    ("q_lambda", 1.5, "q_lambda must be in"),
    ("huber_delta", -1.0, "huber_delta must be a finite number >= 0"),
    ("huber_delta", float("inf"), "huber_delta must be a finite number >= 0"),
    ("learning_rate", float("nan"), "learning_rate must be"),
    ("num_epochs", 0, "num_epochs and num_minibatches"),
    ("eps_end", 2.0, "eps_start and eps_end"),
])
def test_bad_settings_are_refused_naming_the_field(field, value, message):
  with pytest.raises(ja.ConfigError, match=message):
    _agent(**{field: value})


def test_a_continuous_action_space_is_refused_with_the_fix():
  space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
  with pytest.raises(ja.ConfigError, match="PQN needs a Discrete action space"):
    ja.PQN(ja.PQNConfig(), space, gym.spaces.Box(-1.0, 1.0, (1,), np.float32))


@pytest.mark.slow
def test_pqn_learns_cartpole_in_sync(tmp_path):
  logdir = tmp_path / "run"
  out = subprocess.run([sys.executable, "experiments/pqn.py", "--mode", "sync", "--no-progress",
                        "--max-env-steps", "300000", "--logdir", str(logdir), "--seed", "1"],
                       capture_output=True, text=True, timeout=900)
  assert out.returncode == 0, out.stderr[-2000:]
  summary = json.loads((logdir / "summary.json").read_text())
  evals = [round(e["eval_reward"]) for e in summary["evals"]]
  assert summary["best_eval_reward"] >= 475, evals


def test_publishing_less_often_than_the_lag_bound_is_refused_before_the_run():
  # Params published every 50 SGD steps with unrolls dropped beyond a lag of 4: every unroll
  # goes stale before the actors see new params, and the learner stops after a few steps.
  data = ja.UnrollConfig(unroll_length=8, max_policy_lag=4)
  agent = types.SimpleNamespace(batch_size=1)
  with pytest.raises(ja.ConfigError, match="sync_interval=50 .* max_policy_lag=4"):
    data.make_source(agent, ja.RunConfig(), ja.ActorsConfig(mode="process", sync_interval=50))
  source = data.make_source(agent, ja.RunConfig(), ja.ActorsConfig(mode="process",
                                                                  sync_interval=4))
  assert source.max_policy_lag == 4
  # The lock-step actor acts on the params of the last update call, whatever sync_interval.
  data.make_source(agent, ja.RunConfig(), ja.ActorsConfig(mode="sync"))


def test_the_preset_run_by_a_process_actor_learns_from_every_unroll(tmp_path):
  # The preset's actors (a queue of one unroll, params after every iteration) keep the
  # unrolls within max_policy_lag: the run makes the iterations its env steps pay for. With
  # the class's queue of 4 and params every 50 SGD steps, 190 of 196 unrolls were dropped and
  # the run stopped at 5; with the queue of 4 alone, a sixth were (here: 10 dropped, 29
  # iterations). The dropped_stale bound is the guard against those. With another job on
  # the machine, one unroll in a run can arrive a lag past the bound and is dropped (2 of 13
  # runs beside a MinAtar benchmark; none in CI).
  logdir = tmp_path / "run"
  out = subprocess.run([sys.executable, "experiments/pqn.py", "--mode", "process",
                        "--no-progress", "--max-env-steps", "20480", "--eval-interval", "20",
                        "--eval-episodes", "2", "--logdir", str(logdir)],
                       capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  summary = json.loads((logdir / "summary.json").read_text())
  assert summary["mode"] == "async-process"
  assert summary["dropped_stale"] <= 1
  # 40 iterations' env steps (16 envs x 32 steps each); the unrolls in flight when the actor
  # reaches the env-step limit, and a dropped one, are not learnt from.
  assert 20480 // 512 - 2 - summary["dropped_stale"] <= summary["opt_steps"] <= 20480 // 512

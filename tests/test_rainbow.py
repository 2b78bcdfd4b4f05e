"""Tests for noisy nets (NoisyDense, noisy DQN acting and updates) and the Rainbow experiment."""

import dataclasses

import chex
import flax
import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import BOX4, rainbow_module
from helpers import host as _host
from helpers import random_batch as _random_batch

from jaxasync import (DQN, Categorical, ConfigError, DQNConfig, QLearning, ReplayBuffer,
                      restore_checkpoint, save_checkpoint)
from jaxasync.agents.q_network import (NoisyDense, QNetwork, factorized_noise,
                                       factorized_noise_scale)


def _agent(num_actions=2, **config):
  config.setdefault("hidden_sizes", (8,))
  config.setdefault("noisy", True)
  return DQN(DQNConfig(**config), BOX4, gym.spaces.Discrete(num_actions))


# --- NoisyDense ------------------------------------------------------------------
IN, OUT = 5, 3


def _layer(sigma0=0.5):
  layer = NoisyDense(OUT, sigma0)
  params = layer.init(jax.random.PRNGKey(0), jnp.zeros((1, IN)), deterministic=True)
  return layer, params


def test_noisy_dense_params_and_init():
  _, params = _layer()
  p = params["params"]
  chex.assert_shape([p["kernel"], p["sigma_kernel"]], (IN, OUT))
  chex.assert_shape([p["bias"], p["sigma_bias"]], (OUT,))
  bound = 1 / np.sqrt(IN)
  assert np.all(np.abs(p["kernel"]) <= bound) and np.all(np.abs(p["bias"]) <= bound)
  assert np.std(p["kernel"]) > 0  # random, not constant
  np.testing.assert_allclose(p["sigma_kernel"], 0.5 / np.sqrt(IN), rtol=1e-6)
  np.testing.assert_allclose(p["sigma_bias"], 0.5 / np.sqrt(IN), rtol=1e-6)


def test_noisy_dense_keys():
  layer, params = _layer()
  x = np.random.default_rng(0).normal(size=(7, IN)).astype(np.float32)
  y1 = layer.apply(params, x, rngs={"noise": jax.random.PRNGKey(1)})
  y1_again = layer.apply(params, x, rngs={"noise": jax.random.PRNGKey(1)})
  y2 = layer.apply(params, x, rngs={"noise": jax.random.PRNGKey(2)})
  np.testing.assert_array_equal(y1, y1_again)  # same key, same output
  assert np.abs(np.asarray(y1) - np.asarray(y2)).max() > 1e-3  # another key, other noise


def test_noisy_dense_deterministic_is_the_mean_layer():
  layer, params = _layer()
  x = np.random.default_rng(0).normal(size=(7, IN)).astype(np.float32)
  p = params["params"]
  expected = x @ np.asarray(p["kernel"]) + np.asarray(p["bias"])
  np.testing.assert_allclose(layer.apply(params, x, deterministic=True), expected,
                             rtol=1e-5, atol=1e-6)
  # With zero sigmas the noisy layer is the mean layer whatever the key.
  zero = {"params": {**p, "sigma_kernel": jnp.zeros_like(p["sigma_kernel"]),
                     "sigma_bias": jnp.zeros_like(p["sigma_bias"])}}
  np.testing.assert_allclose(layer.apply(zero, x, rngs={"noise": jax.random.PRNGKey(3)}),
                             expected, rtol=1e-5, atol=1e-6)


def test_noisy_dense_needs_an_explicit_key():
  layer, params = _layer()
  with pytest.raises(flax.errors.InvalidRngError):
    layer.apply(params, np.ones((1, IN), np.float32))


def test_factorized_noise_transform():
  x = np.array([-4.0, -0.25, 0.0, 0.25, 9.0], np.float32)
  np.testing.assert_allclose(factorized_noise_scale(x), [-2.0, -0.5, 0.0, 0.5, 3.0], rtol=1e-6)
  eps_in, eps_out = factorized_noise(jax.random.PRNGKey(0), IN, OUT)
  chex.assert_shape([eps_in, eps_out], [(IN,), (OUT,)])
  # f(z) for z ~ N(0, 1): mean 0, E[f(z)^2] = E|z| = sqrt(2 / pi), symmetric.
  draws = jnp.concatenate([jnp.concatenate(factorized_noise(k, 50, 50))
                           for k in jax.random.split(jax.random.PRNGKey(1), 200)])
  draws = np.asarray(draws)
  assert abs(draws.mean()) < 0.02
  assert abs(np.mean(draws ** 2) - np.sqrt(2 / np.pi)) < 0.02
  assert abs(np.mean(draws > 0) - 0.5) < 0.01


def test_noisy_dense_noise_is_factorized():
  """The effective weight noise of one call is the outer product f(eps_in) f(eps_out)^T,
  and the bias noise is f(eps_out)."""
  layer, params = _layer()
  p = jax.tree.map(np.asarray, params["params"])
  key = jax.random.PRNGKey(7)
  # One noise sample per call, shared by the batch: recover the effective weights.
  x = np.concatenate([np.zeros((1, IN)), np.eye(IN)]).astype(np.float32)
  y = np.asarray(layer.apply(params, x, rngs={"noise": key}), np.float64)
  b_eff, w_eff = y[0], y[1:] - y[0]
  eps_b = (b_eff - p["bias"]) / p["sigma_bias"]
  eps_w = (w_eff - p["kernel"]) / p["sigma_kernel"]
  assert np.linalg.matrix_rank(eps_w, tol=1e-4) == 1
  # eps_w[i, j] = eps_in[i] * eps_out[j] with eps_out = eps_b.
  eps_in = eps_w[:, 0] / eps_b[0]
  np.testing.assert_allclose(eps_w, np.outer(eps_in, eps_b), rtol=1e-3, atol=1e-4)
  # The noise has the magnitude of f(N(0, 1)) samples, not zero.
  assert 0.05 < np.abs(eps_b).mean() < 3 and 0.05 < np.abs(eps_in).mean() < 3


# --- QNetwork ---------------------------------------------------------------------
@pytest.mark.parametrize("dueling", [False, True])
def test_noisy_qnetwork_heads(dueling):
  net = QNetwork(num_actions=3, hidden_sizes=(8,), dueling=dueling, num_atoms=5, noisy=True)
  params = net.init(jax.random.PRNGKey(0), jnp.zeros((1, 4)), deterministic=True)
  noisy = [k for k in params["params"] if k.startswith("NoisyDense")]
  assert len(noisy) == (2 if dueling else 1)
  assert not any(k.startswith("Dense") for k in params["params"])  # every head layer is noisy
  obs = np.ones((2, 4), np.float32)
  out = net.apply(params, obs, rngs={"noise": jax.random.PRNGKey(1)})
  chex.assert_shape(out, (2, 3, 5))
  assert not np.allclose(out, net.apply(params, obs, deterministic=True))


# --- DQN with noisy nets ------------------------------------------------------------
def test_epsilon_is_zero_for_noisy_agents():
  agent = _agent(eps_start=1.0, eps_end=0.1, eps_decay_steps=100)
  assert all(agent.epsilon(t) == 0.0 for t in (0, 50, 100, 10_000))
  assert _agent(noisy=False, eps_start=1.0).epsilon(0) == 1.0


def test_init_state_has_a_key():
  state = _agent().init(jax.random.PRNGKey(0))
  assert state.key.dtype == jnp.uint32 and state.key.shape == (2,)
  # A typed key works too and is stored as raw data (checkpointable).
  typed = _agent().init(jax.random.key(0))
  assert typed.key.dtype == jnp.uint32 and typed.key.shape == (2,)


@pytest.mark.parametrize("config", [
    dict(),
    dict(dueling=True, loss=Categorical(num_atoms=11, v_min=0.0, v_max=10.0)),
    dict(loss=QLearning(double_q=False)),
])
def test_noisy_update(config):
  agent = _agent(learning_rate=1e-2, **config)
  state = agent.init(jax.random.PRNGKey(0))
  before = _host(state)
  batch = _random_batch(np.random.default_rng(0), (3, 8))
  new, metrics, priority = agent.update(state, batch, np.ones((3, 8), np.float32))
  assert int(new.opt_steps) == 3
  chex.assert_shape(priority, (3, 8))
  assert set(metrics) == {"loss", "q_mean", "grad_norm", "noise_sigma_mean", "action_gap", "q_max"}
  assert all(np.isfinite(float(v)) for v in metrics.values())
  changed = jax.tree.map(lambda a, b: not np.allclose(a, b), before.params, _host(new.params))
  assert all(jax.tree.leaves(changed))  # sigmas learn too
  assert not np.array_equal(before.key, _host(new.key))
  assert new.key.dtype == jnp.uint32 and new.key.shape == (2,)
  # Noise is a function of the state's key: three single steps give the same result.
  state = agent.init(jax.random.PRNGKey(0))
  for i in range(3):
    state, _, p = agent.update(state, jax.tree.map(lambda x: x[i:i + 1], batch), None)
    np.testing.assert_allclose(p[0], priority[i], rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_close(_host(state), _host(new), rtol=1e-5, atol=1e-6)
  assert agent._jitted_update._cache_size() == 2  # one shape each for k=3 and k=1, no retracing


def test_update_uses_independent_noise_for_each_forward_pass():
  agent = _agent()
  state = agent.init(jax.random.PRNGKey(0))
  batch = _random_batch(np.random.default_rng(0), (8,))
  weights = np.ones(8, np.float32)
  keys = []
  apply = agent.apply

  def recording_apply(params, obs, key=None):
    keys.append(None if key is None else np.asarray(key))
    return apply(params, obs, key)

  agent.apply = recording_apply
  agent.loss(state.params, state.target_params, batch, weights, jax.random.PRNGKey(5))
  assert len(keys) == 3 and all(k is not None for k in keys)  # online(obs), target, online(next)
  assert len({k.tobytes() for k in keys}) == 3
  keys.clear()
  agent.loss(state.params, state.target_params, batch, weights)  # no key: the mean networks
  assert keys == [None, None, None]
  agent.apply = apply
  # The noise matters to the loss, and is reproducible from the key.
  loss = lambda key: float(agent.loss(state.params, state.target_params, batch, weights, key)[0])
  assert loss(jax.random.PRNGKey(5)) == loss(jax.random.PRNGKey(5))
  assert loss(jax.random.PRNGKey(5)) != loss(jax.random.PRNGKey(6))
  # Successive SGD steps draw fresh noise: the state's key moves every step.
  seen = {np.asarray(state.key).tobytes()}
  for i in range(3):
    state = agent.update(state, _random_batch(np.random.default_rng(i), (1, 8)), None)[0]
    seen.add(np.asarray(state.key).tobytes())
  assert len(seen) == 4


def test_non_noisy_update_leaves_the_key_alone():
  agent = _agent(noisy=False)
  state = agent.init(jax.random.PRNGKey(0))
  key = np.asarray(state.key)
  state, metrics, _ = agent.update(state, _random_batch(np.random.default_rng(0), (2, 8)), None)
  np.testing.assert_array_equal(state.key, key)
  assert "noise_sigma_mean" not in metrics


def test_noisy_act_explores_with_noise_and_evaluates_with_the_mean_network():
  agent = _agent(num_actions=6, hidden_sizes=(16,))
  params = agent.init(jax.random.PRNGKey(0)).params
  obs = np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32)
  rng = np.random.default_rng(1)
  mean_q = agent.network.apply(params, obs, deterministic=True)
  mean_greedy = np.argmax(np.asarray(mean_q), axis=-1)
  assert len(np.unique(mean_greedy)) > 1
  # explore=False: the mean network, every call; epsilon 0 means no random actions.
  for _ in range(3):
    np.testing.assert_array_equal(agent.act(params, obs, agent.fixed_epsilon(0.0), rng, explore=False)[0], mean_greedy)
  np.testing.assert_array_equal(agent.greedy_actions(params, obs), mean_greedy)
  # explore=True (the default): a fresh noise sample per call, even with epsilon = 0.
  draws = np.stack([agent.act(params, obs, agent.fixed_epsilon(0.0), rng)[0] for _ in range(10)])
  assert draws.dtype == np.int64 and draws.shape == (10, 64)
  assert len({d.tobytes() for d in draws}) > 1  # the same obs get different actions
  assert np.any(draws != mean_greedy)
  assert np.mean(draws == mean_greedy) > 0.3  # noise perturbs the mean network, not replaces it
  # Reproducible from the numpy generator's state; one compiled function for noisy acting.
  a = agent.act(params, obs, agent.fixed_epsilon(0.0), np.random.default_rng(7))[0]
  np.testing.assert_array_equal(a, agent.act(params, obs, agent.fixed_epsilon(0.0), np.random.default_rng(7))[0])
  assert agent.noisy_greedy_actions._cache_size() == 1


def test_noisy_act_still_applies_epsilon():
  agent = _agent(num_actions=3)
  params = agent.init(jax.random.PRNGKey(0)).params
  obs = np.zeros((3000, 4), np.float32)
  for explore in (True, False):
    actions = agent.act(params, obs, agent.fixed_epsilon(1.0), np.random.default_rng(0), explore=explore)[0]
    counts = np.bincount(actions, minlength=3)
    assert counts.min() > 800, counts  # uniform, whatever the network says


def test_noisy_state_checkpoint_roundtrip(tmp_path):
  agent = _agent(dueling=True)
  state = agent.update(agent.init(jax.random.PRNGKey(0)),
                       _random_batch(np.random.default_rng(0), (2, 8)), None)[0]
  state = _host(state)
  save_checkpoint(tmp_path / "ckpt", state, {"opt_steps": 2})
  restored, meta = restore_checkpoint(tmp_path / "ckpt", agent.init(jax.random.PRNGKey(1)))
  chex.assert_trees_all_equal(_host(restored), state)
  assert meta["opt_steps"] == 2


def test_bad_sigma0_is_rejected():
  with pytest.raises(ConfigError, match="noisy_sigma0"):
    _agent(noisy_sigma0=-1.0)


# --- experiments/rainbow.py -------------------------------------------------------------
def test_rainbow_cartpole_preset_has_every_component():
  rb = rainbow_module()
  args = rb.parse([])
  a = args.agent
  assert args.preset == "cartpole" and args.env_id == "CartPole-v1"
  assert a.noisy and a.dueling and a.loss.double_q and a.loss.num_atoms > 1
  assert a.noisy_sigma0 == 0.5
  assert a.loss.v_min == 0.0 and a.loss.v_max >= 1 / (1 - a.data.gamma) - 1e-6
  assert a.data.n_step == 3 and a.data.prioritized
  assert (a.data.priority_alpha, a.data.priority_beta) == (0.5, 0.4)


def test_rainbow_flags_switch_components_off():
  rb = rainbow_module()
  args = rb.parse(["--no-noisy", "--n-step", "1", "--no-dueling", "--no-prioritized",
                   "--mode", "sync", "loss:q-learning", "--loss.no-double-q"])
  a = args.agent
  assert not (a.noisy or a.dueling or a.loss.double_q or a.data.prioritized)
  assert a.loss.num_atoms == 1 and a.data.n_step == 1 and args.actors.mode == "sync"
  assert rb.components(args) == "none (plain DQN)"
  agent = DQN(a, BOX4, gym.spaces.Discrete(2))
  # (The replay comes from the agent's data now: the plain uniform one, as the trainer's
  # default was when rainbow.make_replay returned None.)
  assert type(agent.data.make_replay(agent, 0)) is ReplayBuffer
  assert agent.epsilon(0) == 1.0  # epsilon-greedy is back without noisy nets


def test_rainbow_atari_preset():
  rb = rainbow_module()
  args = rb.parse(["--preset", "atari"])
  a = args.agent
  assert (a.learning_rate, a.adam_eps, a.batch_size, a.loss.num_atoms) == (6.25e-5, 1.5e-4, 32, 51)
  d = a.data
  assert (a.loss.v_min, a.loss.v_max, d.reward_clip) == (-10.0, 10.0, 1.0)
  assert (d.n_step, d.gamma, d.replay_capacity, d.warmup_period) == (
      3, 0.99, 1_000_000, 20_000)
  assert d.opt_interval == 4.0
  assert a.target_update.period * d.opt_interval * 4 == 32_000  # frames, 4 per env step
  assert (d.priority_alpha, d.priority_beta) == (0.5, 0.4)
  # A flag after the preset overrides it.
  assert rb.parse(["--preset", "atari", "--learning-rate", "1e-4"]).agent.learning_rate == 1e-4
  pytest.importorskip("ale_py")
  from jaxasync.envs import spaces_of
  from jaxasync.replay.frames import PrioritizedFrameReplayBuffer
  env, eval_env = rb.atari_factories(args)
  assert env.env_id == "ALE/Pong-v5" and not eval_env.episodic_life
  agent = DQN(a, *spaces_of(env), env.env_id)
  replay = dataclasses.replace(a.data, replay_capacity=1000).make_replay(agent, args.run.seed)
  assert isinstance(replay, PrioritizedFrameReplayBuffer)


@pytest.mark.slow
def test_rainbow_cartpole_learns(tmp_path):
  """The CartPole preset (all six components) reaches an evaluation of 475 within 30k env
  steps (~60 s on 2 quiet cores; bounded by env steps, not seconds, so a loaded machine makes
  it slower, not flaky)."""
  rb = rainbow_module()
  args = rb.parse(["--mode", "sync", "--target-eval-reward", "475", "--no-progress",
                   "--save-interval", "0", "--max-env-steps", "30000", "--duration", "600",
                   "--logdir", str(tmp_path)])
  summary = rb.main(args)
  assert summary["solved_at"] is not None, summary["evals"]
  assert summary["best_eval_reward"] >= 475

"""PPO and IMPALA on Box actions: the diagonal Gaussian head against closed-form numbers, acting
(samples clipped to the Box for the env, the raw sample kept for the learner), the space
checks, updates on a Box env, the presets and a bounded Pendulum learning run."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import chex
import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxasync as ja
from jaxasync.agents.actor_critic import (CategoricalHead, GaussianHead, GaussianParams,
                                          PolicyHead, gaussian_entropy, gaussian_kl,
                                          gaussian_log_prob, unroll_pairs)
from jaxasync.collectors.unrolls import Unroll
from helpers import host

REPO = Path(__file__).resolve().parents[1]
OBS3 = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
# Asymmetric, and different per dimension: a clip to [-1, 1] or to one shared bound fails here.
BOX2 = gym.spaces.Box(np.array([-1.0, 0.0], np.float32), np.array([3.0, 0.5], np.float32))


def test_heads_keep_the_contract():
  assert issubclass(GaussianHead, PolicyHead) and issubclass(CategoricalHead, PolicyHead)
  with pytest.raises(TypeError, match="abstract"):
    PolicyHead()


def test_gaussian_log_prob_and_entropy_by_hand():
  rng = np.random.default_rng(0)
  mean = rng.normal(size=(4, 3))
  log_std = rng.normal(size=(4, 3)) * 0.5
  action = rng.normal(size=(4, 3)) * 2.0
  std = np.exp(log_std)
  # log N(a; m, s^2) = -(a - m)^2 / (2 s^2) - log s - log(2 pi) / 2, summed over dimensions.
  expected = np.sum(-(action - mean) ** 2 / (2 * std ** 2) - np.log(std)
                    - 0.5 * np.log(2 * np.pi), axis=-1)
  params = GaussianParams(jnp.asarray(mean, jnp.float32), jnp.asarray(log_std, jnp.float32))
  got = gaussian_log_prob(params, jnp.asarray(action, jnp.float32))
  chex.assert_shape(got, (4,))
  np.testing.assert_allclose(got, expected, rtol=1e-5)
  # H = sum(log s + (1 + log 2 pi) / 2); a standard normal's is 1.4189 per dimension.
  np.testing.assert_allclose(gaussian_entropy(params),
                             np.sum(np.log(std) + 0.5 * (1 + np.log(2 * np.pi)), -1), rtol=1e-5)
  unit = GaussianParams(jnp.zeros((1, 1)), jnp.zeros((1, 1)))
  np.testing.assert_allclose(gaussian_entropy(unit), [0.5 * math.log(2 * math.pi * math.e)],
                             rtol=1e-6)
  np.testing.assert_allclose(gaussian_log_prob(unit, jnp.zeros((1, 1))),
                             [-0.5 * math.log(2 * math.pi)], rtol=1e-6)


def test_kl_divergences_by_hand():
  rng = np.random.default_rng(1)
  p = GaussianParams(*(jnp.asarray(rng.normal(size=(5, 2)), jnp.float32) for _ in range(2)))
  q = GaussianParams(*(jnp.asarray(rng.normal(size=(5, 2)), jnp.float32) for _ in range(2)))
  sp, sq = np.exp(np.asarray(p.log_std)), np.exp(np.asarray(q.log_std))
  mp, mq = np.asarray(p.mean), np.asarray(q.mean)
  # KL(N(m_p, s_p^2) || N(m_q, s_q^2)) = log(s_q / s_p) + (s_p^2 + (m_p - m_q)^2) / (2 s_q^2) - 1/2
  expected = np.sum(np.log(sq / sp) + (sp ** 2 + (mp - mq) ** 2) / (2 * sq ** 2) - 0.5, -1)
  got = GaussianHead.for_box(BOX2).kl_divergence(p, q)
  chex.assert_shape(got, (5,))
  np.testing.assert_allclose(got, expected, rtol=1e-4)
  np.testing.assert_allclose(gaussian_kl(p, p), np.zeros(5), atol=1e-6)
  # Categorical: sum_a p(a) log(p(a) / q(a)) of the softmaxes.
  lp, lq = rng.normal(size=(5, 3)), rng.normal(size=(5, 3))
  pp = np.exp(lp) / np.exp(lp).sum(-1, keepdims=True)
  pq = np.exp(lq) / np.exp(lq).sum(-1, keepdims=True)
  np.testing.assert_allclose(
      CategoricalHead(3).kl_divergence(jnp.asarray(lp, jnp.float32), jnp.asarray(lq, jnp.float32)),
      np.sum(pp * np.log(pp / pq), -1), rtol=1e-4)


def _ppo(action_space=BOX2, **overrides) -> ja.PPO:
  config = ja.PPOConfig(hidden_sizes=(8,), **overrides)
  return ja.PPO(config, OBS3, action_space, "Box-v0")


def test_env_actions_are_clipped_to_the_box_and_extras_keep_the_raw_sample():
  agent = _ppo()
  n = 4000
  mean = np.tile(np.array([[2.5, 0.25]], np.float32), (n, 1))
  log_std = np.full((n, 2), np.log(2.0), np.float32)  # std 2: many samples outside the Box
  rng = np.random.default_rng(0)
  state = agent.initial_actor_state(ja.ActorContext())
  actions, extras, _ = agent.select(GaussianParams(mean, log_std), state, rng)
  raw = extras["raw_action"]
  chex.assert_shape((actions, raw, extras["mean"], extras["log_std"]), (n, 2))
  assert actions.dtype == np.float32 and raw.dtype == np.float32
  np.testing.assert_array_equal(actions, np.clip(raw, BOX2.low, BOX2.high))
  assert all(BOX2.contains(a) for a in actions[:100])
  # The raw sample is N(mean, 2^2), unclipped: it leaves the Box on both sides of both axes.
  assert (raw < BOX2.low).any(axis=0).all() and (raw > BOX2.high).any(axis=0).all()
  np.testing.assert_allclose(raw.mean(0), [2.5, 0.25], atol=0.1)
  np.testing.assert_allclose(raw.std(0), [2.0, 2.0], atol=0.1)
  np.testing.assert_array_equal(extras["mean"], mean)
  np.testing.assert_array_equal(extras["log_std"], log_std)
  # Greedy evaluation: the mean, clipped.
  greedy = agent.initial_actor_state(ja.ActorContext(evaluation=True))
  means = np.array([[5.0, -1.0], [0.5, 0.1]], np.float32)
  actions, extras, _ = agent.select(GaussianParams(means, np.zeros_like(means)), greedy, rng)
  np.testing.assert_array_equal(actions, np.array([[3.0, 0.0], [0.5, 0.1]], np.float32))
  np.testing.assert_array_equal(extras["raw_action"], means)
  # The policy call gives float32 numpy dist params, log-std 0 at the start for every state.
  params = agent.policy_params(agent.init(jax.random.PRNGKey(0)))
  out = agent.policy(params, np.zeros((5, 3), np.float32), rng)
  chex.assert_shape((out.mean, out.log_std), (5, 2))
  assert out.mean.dtype == np.float32
  np.testing.assert_array_equal(out.log_std, np.zeros((5, 2)))
  assert {k: v.shape for k, v in agent.extras_example().items()} == {
      "mean": (2,), "log_std": (2,), "raw_action": (2,)}


def _box_unroll(rng, k, T, N, log_std=-0.5) -> Unroll:
  """Unrolls ``[k, T + 1, N]`` whose behaviour policy is a Gaussian near the initial one, and
  whose env actions are the raw samples clipped to ``BOX2``."""
  mean = 0.1 * rng.normal(size=(k, T + 1, N, 2)).astype(np.float32)
  log_std = np.full_like(mean, log_std)
  raw = (mean + np.exp(log_std) * rng.normal(size=mean.shape)).astype(np.float32)
  return Unroll(obs=rng.normal(size=(k, T + 1, N, 3)).astype(np.float32),
                action=np.clip(raw, BOX2.low, BOX2.high),
                extras={"mean": mean, "log_std": log_std, "raw_action": raw},
                reward=rng.normal(size=(k, T + 1, N)).astype(np.float32),
                discount=(rng.random((k, T + 1, N)) > 0.05).astype(np.float32),
                first=rng.random((k, T + 1, N)) < 0.1, last=np.zeros((k, T + 1, N), bool))


def test_the_learner_takes_the_log_prob_of_the_raw_sample_under_the_behaviour_policy():
  """The ratio's denominator is log mu(raw sample): the clipped env action's would be wrong
  wherever the clip binds (here the raw samples are made to leave the Box)."""
  agent = _ppo(data=ja.UnrollConfig(unroll_length=4))
  unroll = jax.tree.map(lambda x: x[0], _box_unroll(np.random.default_rng(1), 1, 4, 3, 1.0))
  assert not np.array_equal(unroll.action, unroll.extras["raw_action"])
  pairs = unroll_pairs(unroll, 0.9, agent.head)
  np.testing.assert_array_equal(pairs.action, unroll.extras["raw_action"][:-1])
  np.testing.assert_array_equal(pairs.behaviour.mean, unroll.extras["mean"][:-1])
  params = agent.init(jax.random.PRNGKey(0)).params
  batch = agent.iteration_batch(params, jax.tree.map(jnp.asarray, unroll))
  raw, mean, log_std = (np.swapaxes(unroll.extras[k][:-1], 0, 1).reshape(-1, 2).astype(np.float64)
                        for k in ("raw_action", "mean", "log_std"))
  expected = np.sum(-0.5 * ((raw - mean) / np.exp(log_std)) ** 2 - log_std
                    - 0.5 * np.log(2 * np.pi), -1)
  np.testing.assert_allclose(batch.behaviour_log_prob, expected, rtol=1e-5)


@pytest.mark.parametrize("space, match", [
    (gym.spaces.Box(-np.inf, np.inf, (2,), np.float32), "unbounded action Box.*TransformAction"),
    (gym.spaces.Box(np.array([-1.0, -np.inf], np.float32), np.array([1.0, 1.0], np.float32)),
     "true bounds"),
    (gym.spaces.Box(-1.0, 1.0, (2, 2), np.float32), "one-axis Box"),
    (gym.spaces.MultiDiscrete([2, 3]), "Discrete action space or a one-axis Box"),
])
@pytest.mark.parametrize("cls, config", [(ja.PPO, ja.PPOConfig), (ja.IMPALA, ja.IMPALAConfig)])
def test_unusable_action_spaces_are_refused_in_one_line(space, match, cls, config):
  with pytest.raises(ja.ConfigError, match=match) as info:
    cls(config(), OBS3, space, "Odd-v0")
  message = str(info.value)
  assert "\n" not in message and "Odd-v0" in message and cls.__name__ in message


@pytest.mark.parametrize("cls, config", [
    (ja.PPO, ja.PPOConfig(hidden_sizes=(8,), num_minibatches=2,
                          data=ja.UnrollConfig(unroll_length=6))),
    (ja.IMPALA, ja.IMPALAConfig(hidden_sizes=(8,), data=ja.UnrollConfig(unroll_length=6)))])
def test_an_update_on_a_box_env_changes_params_with_finite_metrics(cls, config):
  agent = cls(config, OBS3, BOX2, "Box-v0")
  state = agent.init(jax.random.PRNGKey(0))
  before = host(state.params)
  chex.assert_shape(before["params"]["log_std"], (2,))
  np.testing.assert_array_equal(before["params"]["log_std"], np.zeros(2))
  rng = np.random.default_rng(0)
  k, T, N = 2, config.data.unroll_length, 4
  for _ in range(2):
    state, metrics, feedback = agent.update(state, _box_unroll(rng, k, T, N))
  assert feedback is None and int(state.opt_steps) == 2 * k
  chex.assert_rank(list(metrics.values()), 0)
  assert all(np.isfinite(float(v)) for v in metrics.values()), metrics
  after = host(state.params)
  chex.assert_trees_all_equal_shapes(before, after)
  changed = jax.tree.map(lambda a, b: not np.array_equal(a, b), before, after)
  assert all(jax.tree.leaves(changed)), changed  # the log-std and every layer moved
  assert agent._jitted_update._cache_size() == 1


def test_a_box_env_runs_end_to_end_with_impala(tmp_path):
  """IMPALA is not refused a Box env: a short lock-step run on Pendulum-v1 through the
  experiment script."""
  logdir = tmp_path / "run"
  out = subprocess.run([sys.executable, "experiments/impala.py", "--env-id", "Pendulum-v1",
                        "--mode", "sync", "--no-progress", "--max-env-steps", "400",
                        "--eval-interval", "5", "--eval-episodes", "2", "--logdir", str(logdir)],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
  summary = json.loads((logdir / "summary.json").read_text())
  assert summary["opt_steps"] == 10 and np.isfinite(summary["final_eval_reward"])
  record = json.loads((logdir / "config.json").read_text())
  assert record["action_space"].startswith("Box(")


def test_presets():
  import ppo  # experiments/ppo.py
  assert ppo.parse([]).preset == "cartpole" and ppo.parse([]).env_id == "CartPole-v1"
  pendulum = ppo.parse(["--preset", "pendulum", "--seed", "4"])
  assert pendulum.env_id == "Pendulum-v1" and pendulum.run.seed == 4
  assert pendulum.agent.gamma == 0.9 and pendulum.agent.data.unroll_length == 1024
  assert pendulum.actors.num_envs == 4 and pendulum.agent.entropy_cost == 0.0
  mujoco = ppo.parse(["--preset", "mujoco", "--env-id", "Hopper-v5"])
  assert mujoco.env_id == "Hopper-v5" and mujoco.run.max_env_steps == 1_000_000
  assert (mujoco.agent.num_minibatches, mujoco.agent.num_epochs) == (32, 10)
  assert mujoco.actors.num_envs * mujoco.agent.data.unroll_length == 2048
  agent = ppo.experiment.annealed_agent(mujoco)
  assert agent.learning_rate_decay_steps == 1_000_000 // 2048  # annealed over the iterations


@pytest.mark.slow
def test_ppo_learns_pendulum_in_sync(tmp_path):
  """The pendulum preset reaches -250 (a 50-episode greedy mean) within its 100k env steps;
  the run stops at -200 to save time (it took ~40-60k env steps, about a minute, here)."""
  logdir = tmp_path / "run"
  start = time.monotonic()
  out = subprocess.run([sys.executable, "experiments/ppo.py", "--preset", "pendulum", "--mode",
                        "sync", "--no-progress", "--target-eval-reward", "-200", "--logdir",
                        str(logdir)], cwd=REPO, capture_output=True, text=True, timeout=400)
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
  summary = json.loads((logdir / "summary.json").read_text())
  evals = [round(e["eval_reward"]) for e in summary["evals"]]
  print(f"best {summary['best_eval_reward']:.1f} in {time.monotonic() - start:.0f} s: {evals}")
  assert summary["best_eval_reward"] >= -250, evals
  assert summary["env_steps"] <= 100_000 + 4 * 1024


def test_a_gaussian_ratio_far_past_float32s_exp_gives_a_finite_loss_and_gradient():
  """A sample whose behaviour log-probability is 200 below the learner's (a lagged Gaussian
  policy far in its tail): exp(200) overflows float32, and with a negative advantage the
  unguarded surrogate is -inf and every gradient NaN. Held at exp(20), the loss is finite,
  the extreme sample gives no gradient, and the other sample's gradient is its own."""
  from jaxasync.agents.ppo import MAX_LOG_RATIO, PPOBatch, ppo_losses
  head = GaussianHead.for_box(gym.spaces.Box(-1.0, 1.0, (1,), np.float32))
  config = ja.PPOConfig(clip_epsilon=0.2, normalize_advantages=False, value_cost=0.0,
                        entropy_cost=0.0)
  action = jnp.array([[0.3], [0.1]])

  def pg_loss(mean, behaviour_log_prob, advantage):
    params = GaussianParams(mean, jnp.zeros_like(mean))
    batch = PPOBatch(obs=jnp.zeros((2, 1)), action=action, behaviour_log_prob=behaviour_log_prob,
                     advantage=advantage, value_target=jnp.zeros(2), old_value=jnp.zeros(2),
                     mask=jnp.ones(2, bool))
    return ppo_losses(params, jnp.zeros(2), batch, config, head)[1]["pg_loss"]

  mean = jnp.array([[0.0], [0.0]])
  log_pi = gaussian_log_prob(GaussianParams(mean, jnp.zeros_like(mean)), action)
  far = log_pi - jnp.array([200.0, 0.05])  # ratio exp(200) and exp(0.05)
  assert not np.isfinite(np.exp(np.float32(200.0)))
  loss, grad = jax.value_and_grad(pg_loss)(mean, far, jnp.array([-1.0, 1.0]))
  # Sample 0 held at exp(20) with advantage -1: min(-e^20, -1.2) = -e^20; sample 1: ratio
  # e^0.05 = 1.051 inside the clip, min(1.051, 1.2) = 1.051. pg_loss = -(sum) / 2.
  np.testing.assert_allclose(loss, (math.exp(MAX_LOG_RATIO) - math.exp(0.05)) / 2, rtol=1e-5)
  assert np.all(np.isfinite(grad))
  assert float(grad[0, 0]) == 0.0
  # Sample 1's gradient alone: d/dmean of -ratio/2 = -ratio (a - mean) / 2 (unit std).
  np.testing.assert_allclose(grad[1, 0], -math.exp(0.05) * 0.1 / 2, rtol=1e-4)

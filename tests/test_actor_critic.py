"""IMPALA and PPO: V-trace and GAE across episode boundaries against hand computations, the PPO
loss by hand, acting, errors, lock-step reproducibility and bounded CartPole learning."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import chex
import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import rlax

import jaxasync as ja
from jaxasync import experiment
from jaxasync.agents.actor_critic import CategoricalHead, unroll_pairs
from jaxasync.agents.impala import vtrace_losses
from jaxasync.agents.ppo import PPOBatch, gae_advantages, ppo_losses
from jaxasync.collectors.unrolls import Unroll
from helpers import host

REPO = Path(__file__).resolve().parents[1]
OBS2 = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
ACT2 = gym.spaces.Discrete(2)
GAMMA = 0.9
HEAD2 = CategoricalHead(2)  # the policy head of ACT2


def _boundary_unroll(truncated: bool) -> Unroll:
  """One column ``[T + 1 = 4, N = 1]``: an episode ends at t = 2 (terminated, or truncated by a
  time limit), t = 3 is the next episode's reset observation."""
  return Unroll(obs=np.zeros((4, 1, 2), np.float32), action=np.array([[1], [0], [1], [0]]),
                extras={"logits": np.zeros((4, 1, 2), np.float32)},
                reward=np.array([[0.0], [1.0], [2.0], [0.0]], np.float32),
                discount=np.array([[1.0], [1.0], [1.0 if truncated else 0.0], [1.0]], np.float32),
                first=np.array([[True], [False], [False], [True]]),
                last=np.array([[False], [False], [True], [False]]))


V = np.array([[0.5], [1.5], [3.0], [7.0]], np.float32)  # values of t = 0..3


def test_unroll_pairs_mask_the_pair_across_the_boundary():
  pairs = unroll_pairs(_boundary_unroll(truncated=False), GAMMA, HEAD2)
  np.testing.assert_array_equal(pairs.mask[:, 0], [True, True, False])
  np.testing.assert_allclose(pairs.discount[:, 0], [GAMMA, 0.0, GAMMA])
  np.testing.assert_allclose(pairs.reward[:, 0], [1.0, 2.0, 0.0])
  np.testing.assert_array_equal(pairs.action[:, 0], [1, 0, 1])


@pytest.mark.parametrize("truncated", [False, True])
def test_vtrace_on_policy_by_hand(truncated):
  """On-policy (rho = 1), lambda = 1: vs_1 = r_2 (+ gamma V_2 if truncated: the true final
  observation's value), vs_0 = r_1 + gamma vs_1; the pair across the boundary has vs = V
  there, so V_3 (the next episode) never enters."""
  unroll = _boundary_unroll(truncated)
  pairs = unroll_pairs(unroll, GAMMA, HEAD2)
  logits = jnp.asarray(unroll.extras["logits"])  # the learner's policy = the behaviour policy
  config = ja.IMPALAConfig(entropy_cost=0.0, baseline_cost=1.0)
  loss, metrics = vtrace_losses(logits, jnp.asarray(V), pairs, config, HEAD2)
  vs_1 = 2.0 + (GAMMA * 3.0 if truncated else 0.0)
  vs_0 = 1.0 + GAMMA * vs_1
  errors = np.array([vs_0 - 0.5, vs_1 - 1.5])  # the two real pairs
  np.testing.assert_allclose(metrics["baseline_loss"], np.mean(0.5 * errors ** 2), rtol=1e-5)
  # pg advantages = q - V = the same errors here; log pi(a) = log 0.5 for uniform logits.
  np.testing.assert_allclose(metrics["pg_loss"], -np.mean(errors * np.log(0.5)), rtol=1e-5)
  np.testing.assert_allclose(loss, metrics["pg_loss"] + metrics["baseline_loss"], rtol=1e-6)


def test_vtrace_normalised_advantages_by_hand():
  """With normalize_advantages the two real pairs' advantages are standardised over the real
  pairs only (the masked pair across the boundary counts for nothing): +1 and -1."""
  unroll = _boundary_unroll(truncated=False)
  pairs = unroll_pairs(unroll, GAMMA, HEAD2)
  logits = jnp.asarray(unroll.extras["logits"])
  config = ja.IMPALAConfig(entropy_cost=0.0, normalize_advantages=True)
  _, metrics = vtrace_losses(logits, jnp.asarray(V), pairs, config, HEAD2)
  # advantages (vs_0 - 0.5, vs_1 - 1.5) are distinct, so standardised they are (+1, -1) in
  # some order: pg = -mean(+-1 * log 0.5) = 0; the value loss is untouched.
  np.testing.assert_allclose(metrics["pg_loss"], 0.0, atol=1e-5)
  _, plain = vtrace_losses(logits, jnp.asarray(V), pairs, ja.IMPALAConfig(entropy_cost=0.0),
                          HEAD2)
  np.testing.assert_allclose(metrics["baseline_loss"], plain["baseline_loss"])
  skewed = jnp.asarray(unroll.extras["logits"]).at[:, :, 1].add(1.0)  # pi(a) differs by action
  unroll = unroll._replace(extras={"logits": np.asarray(skewed)})  # still on-policy: rho = 1
  _, metrics = vtrace_losses(skewed, jnp.asarray(V), unroll_pairs(unroll, GAMMA, HEAD2), config,
                            HEAD2)
  log_pi = np.asarray(jax.nn.log_softmax(skewed))[[0, 1], 0, [1, 0]]  # actions 1, 0
  vs_1 = 2.0
  adv = np.array([1.0 + GAMMA * vs_1 - 0.5, vs_1 - 1.5])
  adv = (adv - adv.mean()) / adv.std()
  np.testing.assert_allclose(metrics["pg_loss"], -np.mean(adv * log_pi), rtol=1e-4)


def test_mlp_torso_activation_and_orthogonal_init():
  """tanh bounds the features; orthogonal init gives kernels with K^T K = 2 I (gain sqrt 2) and
  zero biases; the parameter tree is the default torso's, so checkpoints keep their names."""
  from jaxasync.networks import MLPTorso
  obs = jax.random.normal(jax.random.PRNGKey(1), (5, 4)) * 100.0
  torso = MLPTorso((8, 8), activation="tanh", orthogonal_init=True)
  params = torso.init(jax.random.PRNGKey(0), obs)
  features = torso.apply(params, obs)
  chex.assert_shape(features, (5, 8))
  assert float(jnp.max(jnp.abs(features))) <= 1.0
  kernel = params["params"]["Dense_1"]["kernel"]
  np.testing.assert_allclose(kernel.T @ kernel, 2.0 * np.eye(8), atol=1e-5)
  np.testing.assert_array_equal(params["params"]["Dense_1"]["bias"], np.zeros(8))
  default = MLPTorso((8, 8)).init(jax.random.PRNGKey(0), obs)
  assert jax.tree.structure(default) == jax.tree.structure(params)
  with pytest.raises(ja.ConfigError, match="activation must be one of"):
    ja.PPOConfig(activation="gelu").validate()


def test_vtrace_through_the_agent_equals_rlax_per_column():
  """Off-policy, several columns with random boundaries: the agent's loss equals one built
  from rlax.vtrace_td_error_and_advantage column by column, with rho zeroed on non-transitions."""
  rng = np.random.default_rng(0)
  T, N, A = 6, 3, 2
  first = rng.random((T + 1, N)) < 0.25
  unroll = Unroll(obs=rng.normal(size=(T + 1, N, 2)).astype(np.float32),
                  action=rng.integers(0, A, (T + 1, N)),
                  extras={"logits": rng.normal(size=(T + 1, N, A)).astype(np.float32)},
                  reward=rng.normal(size=(T + 1, N)).astype(np.float32),
                  discount=(rng.random((T + 1, N)) > 0.2).astype(np.float32), first=first,
                  last=np.zeros((T + 1, N), bool))
  agent = ja.IMPALA(ja.IMPALAConfig(hidden_sizes=(8,), gamma=0.95), OBS2, ACT2)
  params = agent.init(jax.random.PRNGKey(0)).params
  loss, metrics = agent.loss(params, jax.tree.map(jnp.asarray, unroll))
  logits, values = agent.apply_unroll(params, jnp.asarray(unroll.obs))
  logits, values = np.asarray(logits, np.float64), np.asarray(values, np.float64)
  def logp(lg, a):
    lg = lg - lg.max(-1, keepdims=True)
    return (lg - np.log(np.exp(lg).sum(-1, keepdims=True)))[np.arange(len(a)), a]
  errors, advs, log_pis, masks = [], [], [], []
  for n in range(N):
    a = unroll.action[:-1, n]
    log_pi = logp(logits[:-1, n], a)
    rho = np.exp(log_pi - logp(unroll.extras["logits"][:-1, n].astype(np.float64), a))
    mask = ~first[1:, n]
    out = rlax.vtrace_td_error_and_advantage(
        jnp.asarray(values[:-1, n], jnp.float32), jnp.asarray(values[1:, n], jnp.float32),
        jnp.asarray(unroll.reward[1:, n]), jnp.asarray(0.95 * unroll.discount[1:, n]),
        jnp.asarray(rho * mask, jnp.float32))
    errors.append(np.asarray(out.errors)), advs.append(np.asarray(out.pg_advantage))
    log_pis.append(log_pi), masks.append(mask)
  errors, advs, log_pis, masks = map(np.stack, (errors, advs, log_pis, masks))
  count = masks.sum()
  np.testing.assert_allclose(metrics["baseline_loss"],
                             np.sum(0.5 * errors ** 2 * masks) / count, rtol=1e-4)
  np.testing.assert_allclose(metrics["pg_loss"], -np.sum(advs * log_pis * masks) / count,
                             rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("truncated", [False, True])
def test_gae_cuts_at_the_boundary_by_hand(truncated):
  pairs = unroll_pairs(_boundary_unroll(truncated), GAMMA, HEAD2)
  lam = 0.5
  adv = np.asarray(gae_advantages(pairs, jnp.asarray(V), lam))[:, 0]
  delta_1 = 2.0 + (GAMMA * 3.0 if truncated else 0.0) - 1.5  # bootstraps V_2 only if truncated
  delta_0 = 1.0 + GAMMA * 1.5 - 0.5
  # Without the cut, A_1 would also get gamma * lambda * A_2 (A_2 = gamma V_3 - V_2, the next
  # episode's start): it must not.
  np.testing.assert_allclose(adv[1], delta_1, rtol=1e-6)
  np.testing.assert_allclose(adv[0], delta_0 + GAMMA * lam * delta_1, rtol=1e-6)


def test_ppo_loss_by_hand():
  """Two samples, advantages +1 and -1 (already standardized), ratio 1.5 and 0.5, clip 0.2:
  surrogate min(1.5 * 1, 1.2 * 1) = 1.2 and min(0.5 * -1, 0.8 * -1) = -0.8; the third sample
  is masked out."""
  logits = jnp.log(jnp.array([[0.75, 0.25], [0.25, 0.75], [0.5, 0.5]]))
  batch = PPOBatch(obs=jnp.zeros((3, 2)), action=jnp.array([0, 0, 1]),
                   behaviour_log_prob=jnp.log(jnp.array([0.5, 0.5, 0.5])),
                   advantage=jnp.array([1.0, -1.0, 100.0]),
                   value_target=jnp.array([2.0, 0.0, 100.0]),
                   old_value=jnp.array([1.0, 1.0, 0.0]), mask=jnp.array([True, True, False]))
  config = ja.PPOConfig(clip_epsilon=0.2, normalize_advantages=False, value_cost=0.5,
                        entropy_cost=0.0)
  values = jnp.array([1.5, 0.5, 0.0])
  loss, m = ppo_losses(logits, values, batch, config, HEAD2)
  np.testing.assert_allclose(m["pg_loss"], -(1.2 - 0.8) / 2, rtol=1e-6)
  np.testing.assert_allclose(m["value_loss"], (0.5 * 0.25 + 0.5 * 0.25) / 2, rtol=1e-6)
  np.testing.assert_allclose(m["clip_fraction"], 1.0)
  np.testing.assert_allclose(loss, m["pg_loss"] + 0.5 * m["value_loss"], rtol=1e-6)
  # Value clipping (0.2 around the old values 1.0): 1.5 -> 1.2 (error 0.8^2 > 0.5^2),
  # 0.5 -> 0.8 (error 0.8^2 > 0.5^2): the larger errors count.
  _, mc = ppo_losses(logits, values, batch, dataclasses.replace(config, value_clip_epsilon=0.2),
                     HEAD2)
  np.testing.assert_allclose(mc["value_loss"], 0.5 * 0.64, rtol=1e-5)


def test_acting_samples_from_the_logits_and_evaluation_is_greedy():
  agent = ja.PPO(ja.PPOConfig(hidden_sizes=(8,)), OBS2, ACT2)
  logits = np.array([[2.0, 0.0]] * 4000, np.float32)  # p(action 0) = e^2 / (1 + e^2) = 0.881
  rng = np.random.default_rng(0)
  actions, extras, state = agent.select(logits, agent.initial_actor_state(ja.ActorContext()), rng)
  np.testing.assert_allclose(np.mean(actions == 0), np.exp(2) / (1 + np.exp(2)), atol=0.02)
  assert extras["logits"] is logits and state is False
  greedy = agent.initial_actor_state(ja.ActorContext(evaluation=True))
  actions, _, _ = agent.select(np.array([[0.0, 0.1], [0.3, 0.2]], np.float32), greedy, rng)
  np.testing.assert_array_equal(actions, [1, 0])
  params = agent.policy_params(agent.init(jax.random.PRNGKey(0)))
  out = agent.policy(params, np.zeros((5, 2), np.float32), rng)
  chex.assert_shape(out, (5, 2))
  assert out.dtype == np.float32


@pytest.mark.parametrize("cls, config", [(ja.IMPALA, ja.IMPALAConfig(hidden_sizes=(8,))),
                                         (ja.PPO, ja.PPOConfig(hidden_sizes=(8,),
                                                               num_minibatches=2))])
def test_update_shapes_steps_and_no_retrace(cls, config):
  agent = cls(config, OBS2, ACT2)
  rng = np.random.default_rng(0)
  k, T, N = 2, config.data.unroll_length, 4
  def batch():
    return Unroll(obs=rng.normal(size=(k, T + 1, N, 2)).astype(np.float32),
                  action=rng.integers(0, 2, (k, T + 1, N)),
                  extras={"logits": rng.normal(size=(k, T + 1, N, 2)).astype(np.float32)},
                  reward=np.ones((k, T + 1, N), np.float32),
                  discount=np.ones((k, T + 1, N), np.float32),
                  first=rng.random((k, T + 1, N)) < 0.1, last=np.zeros((k, T + 1, N), bool))
  state = agent.init(jax.random.PRNGKey(0))
  before = host(state.params)
  for _ in range(3):
    state, metrics, feedback = agent.update(state, batch())
  assert feedback is None and int(state.opt_steps) == 3 * k
  assert all(np.isfinite(float(v)) for v in metrics.values())
  assert not jax.tree.all(jax.tree.map(np.allclose, before, host(state.params)))
  assert agent._jitted_update._cache_size() == 1


def test_impala_target_policy_anchor_by_hand():
  """With ``target_kl_cost``, the loss adds cost x KL(pi_target || pi) (zero, with zero
  gradient, while the target equals the params) and after each SGD step the target moves
  ``tau`` of the way to the new params; without it the state carries no target."""
  assert ja.IMPALA(ja.IMPALAConfig(hidden_sizes=(8,)), OBS2, ACT2).init(
      jax.random.PRNGKey(0)).target_params is None
  tau, cost = 0.1, 2.0
  agent = ja.IMPALA(ja.IMPALAConfig(hidden_sizes=(8,), target_kl_cost=cost, target_tau=tau),
                    OBS2, ACT2)
  state = agent.init(jax.random.PRNGKey(0))
  unroll = _boundary_unroll(truncated=False)
  unroll = unroll._replace(obs=np.random.default_rng(0).normal(size=(4, 1, 2)).astype(np.float32))
  chex.assert_trees_all_equal(state.target_params, state.params)
  plain = ja.IMPALA(ja.IMPALAConfig(hidden_sizes=(8,)), OBS2, ACT2)
  loss, metrics = agent.loss(state.params, unroll, state.target_params)
  assert float(metrics["target_kl"]) == 0.0
  np.testing.assert_allclose(loss, plain.loss(state.params, unroll)[0], rtol=1e-6)
  # A target elsewhere: the loss grows by cost x the mean KL over the real pairs.
  noise = np.random.default_rng(1)
  target = jax.tree.map(lambda x: x + 0.5 * noise.normal(size=x.shape).astype(np.float32),
                        state.params)
  loss_t, metrics_t = agent.loss(state.params, unroll, target)
  logits, _ = agent.apply_unroll(state.params, unroll.obs)
  target_logits, _ = agent.apply_unroll(target, unroll.obs)
  p_t = np.asarray(jax.nn.softmax(target_logits[:-1]), np.float64)
  p = np.asarray(jax.nn.softmax(logits[:-1]), np.float64)
  kl = np.sum(p_t * np.log(p_t / p), -1)[:, 0]
  mask = ~np.asarray(unroll.first[1:, 0])
  assert kl[mask].mean() > 1e-3  # (a target that differs)
  np.testing.assert_allclose(metrics_t["target_kl"], kl[mask].mean(), rtol=1e-3)
  np.testing.assert_allclose(loss_t - loss, cost * kl[mask].mean(), rtol=1e-3)
  # One SGD step: the target is (1 - tau) target + tau params_new.
  old_target = host(state.target_params)
  batch = jax.tree.map(lambda x: np.asarray(x)[None], unroll)
  new_state, _, _ = agent.update(state, batch)
  expected = jax.tree.map(lambda t, p: (1 - tau) * t + tau * p, old_target,
                          host(new_state.params))
  chex.assert_trees_all_close(host(new_state.target_params), expected, rtol=1e-6)


def test_errors_name_the_fix():
  # (A bounded Box of actions is served by a Gaussian head: tests/test_continuous_actor_critic.py.)
  with pytest.raises(ja.ConfigError, match=r"Declare the actions' true bounds: gymnasium.wrappers.TransformAction"):
    ja.IMPALA(ja.IMPALAConfig(), OBS2, gym.spaces.Box(-np.inf, np.inf, (1,), np.float32), "Pend-v1")
  with pytest.raises(ja.ConfigError, match="gae_lambda"):
    ja.PPO(ja.PPOConfig(gae_lambda=1.5), OBS2, ACT2)
  agent = ja.PPO(ja.PPOConfig(hidden_sizes=(8,), num_minibatches=4,
                              data=ja.UnrollConfig(unroll_length=3)), OBS2, ACT2)
  unroll = Unroll(obs=np.zeros((1, 4, 1, 2), np.float32), action=np.zeros((1, 4, 1), np.int64),
                  extras={"logits": np.zeros((1, 4, 1, 2), np.float32)},
                  reward=np.zeros((1, 4, 1), np.float32), discount=np.ones((1, 4, 1), np.float32),
                  first=np.zeros((1, 4, 1), bool), last=np.zeros((1, 4, 1), bool))
  with pytest.raises(ja.ConfigError, match="num_minibatches=4 does not divide"):
    agent.update(agent.init(jax.random.PRNGKey(0)), unroll)


def _sync_ppo_run(logdir: Path, *flags: str) -> dict:
  out = subprocess.run([sys.executable, "experiments/ppo.py", "--mode", "sync", "--no-progress",
                        "--logdir", str(logdir), *flags], cwd=REPO, capture_output=True,
                       text=True, timeout=300)
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
  return json.loads((logdir / "summary.json").read_text())


def test_lockstep_runs_are_bit_identical(tmp_path):
  """The lock-step (sync) mode: every unroll comes from the newest params (lag 0), and two
  runs with one seed end with the same params, bit for bit."""
  flags = ("--max-env-steps", "5120", "--eval-interval", "0", "--record-interval", "0", "--seed", "3")
  summaries = [_sync_ppo_run(tmp_path / f"run{i}", *flags) for i in range(2)]
  import ppo  # experiments/ppo.py: the run's agent, to read its checkpoints
  args = ppo.Args(run=dataclasses.replace(ppo.cartpole_run(), max_env_steps=5120),
                  actors=dataclasses.replace(experiment.on_policy_actors(), mode="sync"))
  cartpole = gym.make("CartPole-v1")
  agent = ja.PPO(experiment.annealed_agent(args), cartpole.observation_space,
                 cartpole.action_space)
  template = agent.init(jax.random.PRNGKey(0))
  states = [ja.restore_checkpoint(tmp_path / f"run{i}" / "final", template)[0] for i in range(2)]
  assert summaries[0]["opt_steps"] == 20  # 5120 env steps / (32 steps x 8 envs)
  for a, b in zip(jax.tree.leaves(states[0]), jax.tree.leaves(states[1])):
    np.testing.assert_array_equal(a, b)
  assert summaries[0]["policy_lag_max"] == 0


def test_the_summary_reports_the_runs_policy_lag_when_a_record_just_took_its_window(tmp_path):
  """A record after every SGD step (the last one just before the summary) restarts the
  source's lag window; the summary's lag is still the whole run's (lock-step: 0)."""
  summary = _sync_ppo_run(tmp_path / "run", "--max-env-steps", "2560", "--eval-interval", "0",
                          "--record-interval", "1")
  assert summary["opt_steps"] == 10
  assert summary["policy_lag_min"] == summary["policy_lag_max"] == 0


@pytest.mark.slow
def test_ppo_learns_cartpole_in_sync(tmp_path):
  summary = _sync_ppo_run(tmp_path / "run", "--max-env-steps", "60000")
  evals = [round(e["eval_reward"]) for e in summary["evals"]]
  assert summary["best_eval_reward"] >= 475, evals


@pytest.mark.slow
def test_impala_learns_cartpole_with_a_process_actor(tmp_path):
  logdir = tmp_path / "run"
  out = subprocess.run([sys.executable, "experiments/impala.py", "--mode", "process",
                        "--no-progress", "--max-env-steps", "150000", "--target-eval-reward", "400",
                        "--logdir", str(logdir)], cwd=REPO, capture_output=True, text=True,
                       timeout=400)
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
  summary = json.loads(logdir.joinpath("summary.json").read_text())
  evals = [round(e["eval_reward"]) for e in summary["evals"]]
  assert summary["best_eval_reward"] >= 400, evals
  assert summary["mode"] == "async-process" and summary["policy_lag_max"] >= 0

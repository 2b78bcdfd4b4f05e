"""TD3: its maths against hand computations, its wiring (delays, targets, exploration, scaling),
its errors, and that it learns Pendulum."""

from __future__ import annotations

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxasync as ja
from jaxasync.agents.continuous import QCritic, one_twin, scale_actions, twin_td_loss
from jaxasync.agents.td3 import (clipped_double_q_target, deterministic_actor_loss,
                                 exploration_actions, smoothed_target_actions)
from continuous_helpers import (ASYM, OBS3, PENDULUM, UNSUITABLE_ACTION_SPACES,
                                assert_refused_with_the_fix, continuous_batch,
                                pendulum_run_in_sync)
from helpers import host

TINY = ja.TD3Config(hidden_sizes=(16, 16), batch_size=8,
                    data=ja.ReplayConfig(n_step=1, warmup_period=100))


def _changed(before, after) -> bool:
  return not jax.tree.all(jax.tree.map(np.allclose, host(before), host(after)))


# --- the maths --------------------------------------------------------------------------------
def test_smoothing_noise_is_scaled_clipped_and_the_action_stays_in_range():
  actions = jnp.array([[0.0, 0.9], [-0.95, 0.2]])
  noise = jnp.array([[1.0, 1.0], [-5.0, 10.0]])  # standard normal draws
  # std 0.2: noise 0.2, 0.2 | -1.0 -> clipped to -0.5, 2.0 -> 0.5; then clipped to [-1, 1]:
  # [0.2, 1.1 -> 1.0], [-1.45 -> -1.0, 0.7]
  out = smoothed_target_actions(actions, noise, 0.2, 0.5)
  np.testing.assert_allclose(out, [[0.2, 1.0], [-1.0, 0.7]], rtol=1e-6)


def test_clipped_double_q_target_by_hand():
  reward = jnp.array([1.0, 2.0])
  discount = jnp.array([0.99, 0.0])  # the second episode terminated: no bootstrap at all
  next_q = jnp.array([[3.0, 4.0], [5.0, 1.0]])  # [2 critics, B]: min = [3, 1]
  # 1 + 0.99 * 3 = 3.97; 2 + 0 * 1 = 2
  np.testing.assert_allclose(clipped_double_q_target(reward, discount, next_q), [3.97, 2.0],
                             rtol=1e-6)


def test_twin_td_loss_and_priorities_by_hand():
  q = jnp.array([[1.0, 2.0], [3.0, 0.0]])
  target = jnp.array([2.0, 2.0])
  weights = jnp.array([1.0, 0.5])
  loss, abs_td = twin_td_loss(q, target, weights)
  # td = [[-1, 0], [1, -2]]; 0.5 * (mean(1, 0) + mean(1, 0.5 * 4)) = 0.5 * (0.5 + 1.5) = 1
  np.testing.assert_allclose(loss, 1.0, rtol=1e-6)
  np.testing.assert_allclose(abs_td, [1.0, 1.0], rtol=1e-6)
  assert deterministic_actor_loss(jnp.array([1.0, 3.0])) == -2.0


def test_pure_functions_refuse_mismatched_shapes():
  with pytest.raises(AssertionError):
    clipped_double_q_target(jnp.zeros(3), jnp.zeros(3), jnp.zeros((3,)))  # one critic, not two
  with pytest.raises(AssertionError):
    smoothed_target_actions(jnp.zeros((4, 2)), jnp.zeros((4, 3)), 0.2, 0.5)


def test_action_scaling_to_an_asymmetric_box():
  """``policy`` gives [-1, 1] actions; what reaches the env (the evaluator's, no noise) is
  their affine image in the Box [-1, 3] x [0, 10], clipped inside it."""
  agent = ja.TD3(TINY, OBS3, ASYM)
  state = agent.initial_actor_state(ja.ActorContext(evaluation=True))
  unit = np.array([[-1.0, -1.0], [1.0, 1.0], [0.0, 0.0], [0.5, -0.5]], np.float32)
  env, extras, _ = agent.select(unit, state, np.random.default_rng(0))
  np.testing.assert_allclose(env, [[-1, 0], [3, 10], [1, 5], [2, 2.5]], rtol=1e-6)
  assert env.dtype == np.float32 and extras is None
  params = agent.policy_params(agent.init(jax.random.PRNGKey(0)))
  obs = np.random.default_rng(0).normal(size=(64, 3)).astype(np.float32)
  unit = agent.policy(params, obs, np.random.default_rng(0))
  chex.assert_shape(unit, (64, 2))
  assert np.all(np.abs(unit) <= 1)
  env, _, _ = agent.act(params, obs, state, np.random.default_rng(0), explore=False)
  np.testing.assert_allclose(env, scale_actions(unit, ASYM.low, ASYM.high), rtol=1e-6)


# --- exploration ------------------------------------------------------------------------------
def test_exploration_noise_only_when_exploring():
  agent = ja.TD3(dataclasses.replace(TINY, exploration_noise=0.1), OBS3, ASYM)
  unit = np.zeros((2000, 2), np.float32)
  half_width = (ASYM.high - ASYM.low) / 2
  centre = scale_actions(unit[0], ASYM.low, ASYM.high)
  rng = np.random.default_rng(0)
  # The evaluator: the policy's actions, no noise, and its state does not move.
  evaluator = agent.initial_actor_state(ja.ActorContext(evaluation=True))
  env, _, after = agent.select(unit, evaluator, rng)
  np.testing.assert_array_equal(env, np.broadcast_to(centre, env.shape))
  assert after == evaluator
  # An actor past the warmup: Gaussian noise of std 0.1 in [-1, 1] units, i.e. 0.1 of the
  # Box's half-width in env units.
  actor = agent.initial_actor_state(ja.ActorContext(num_envs=2000, env_steps=100))
  assert actor.env_steps >= actor.random_steps
  env, _, after = agent.select(unit, actor, rng)
  np.testing.assert_allclose(np.std(env - centre, axis=0), 0.1 * half_width, rtol=0.1)
  np.testing.assert_allclose(np.mean(env - centre, axis=0) / half_width, 0, atol=0.01)
  assert after.env_steps == actor.env_steps + 2000
  assert agent.actor_metrics(after) == {"random_actions": 0.0}
  # Clipped to [-1, 1] before scaling: never outside the Box.
  env, _, _ = agent.select(np.ones((100, 2), np.float32), actor, rng)
  assert np.all(env <= ASYM.high) and np.all(env >= ASYM.low)
  np.testing.assert_allclose(exploration_actions(np.ones((3, 1), np.float32), 0.0, rng), 1.0)


def test_random_actions_during_the_warmup_then_the_policy():
  """Uniform random actions over the Box while the run's env steps (this actor's times the
  actors) are within the data's warmup_period; with random_warmup off, the policy at once."""
  agent = ja.TD3(TINY, OBS3, ASYM)  # warmup_period 100
  # (500 actions per call for firm statistics; the state advances by its context's 2 x 10.)
  unit = np.zeros((500, 2), np.float32)
  rng = np.random.default_rng(0)
  state = agent.initial_actor_state(ja.ActorContext(num_actors=2, num_envs=10))
  assert (state.random_steps, state.steps_per_call) == (100, 20)
  spreads = []
  for _ in range(7):  # run steps 0, 20, ..., 120: random below 100
    random_now = agent.actor_metrics(state)["random_actions"]
    env, _, state = agent.select(unit, state, rng)
    spreads.append((random_now, float(np.std(env[:, 1]))))
  assert [r for r, _ in spreads] == [1.0] * 5 + [0.0] * 2
  # Uniform over [0, 10]: std ~2.9; policy 0 plus noise 0.1 * 5: std ~0.5.
  assert all(s > 2.5 for _, s in spreads[:5]) and all(s < 0.6 for _, s in spreads[5:])
  # A restarted actor continues: 3 actors, 40 env steps each before -> the run is at 120.
  assert agent.initial_actor_state(ja.ActorContext(num_actors=3, env_steps=40)).env_steps == 120
  no_warmup = ja.TD3(dataclasses.replace(TINY, random_warmup=False), OBS3, ASYM)
  assert no_warmup.initial_actor_state(ja.ActorContext()).random_steps == 0


# --- the update's wiring ------------------------------------------------------------------------
def test_critic_loss_is_the_clipped_double_q_target_of_the_target_networks():
  """The loss through the agent equals one built by hand: the target actor (not the online
  one) at s', its action smoothed by noise clipped at target_noise_clip, the target critics'
  minimum, stored actions unscaled, the importance weights applied, discount 0 removing the
  bootstrap."""
  config = dataclasses.replace(TINY, target_noise=0.4, target_noise_clip=0.3)
  agent = ja.TD3(config, OBS3, ASYM)
  state = agent.init(jax.random.PRNGKey(0))
  # Targets that differ from the online networks, so using the wrong ones would show.
  state = state.replace(
      target_critic_params=jax.tree.map(lambda x: x * 0.5, state.critic_params),
      target_actor_params=jax.tree.map(lambda x: x * -2.0, state.actor_params))
  rng = np.random.default_rng(0)
  batch = continuous_batch(rng, (8,))
  weights = rng.uniform(0.5, 1.5, 8).astype(np.float32)
  key = jax.random.PRNGKey(7)
  loss, (abs_td, metrics) = agent.critic_loss(state.critic_params, state, batch, weights, key)

  a_next = np.asarray(agent.actor.apply(state.target_actor_params, batch.next_obs), np.float64)
  noise = np.asarray(jax.random.normal(key, a_next.shape), np.float64)
  assert np.abs(0.4 * noise).max() > 0.3  # the clip is exercised
  a_next = np.clip(a_next + np.clip(0.4 * noise, -0.3, 0.3), -1, 1)
  q_next = np.asarray(agent.critic.apply(state.target_critic_params, batch.next_obs,
                                         a_next.astype(np.float32)))
  y = batch.reward + batch.discount * q_next.min(0)
  unit = 2 * (batch.action - ASYM.low) / (ASYM.high - ASYM.low) - 1
  q = np.asarray(agent.critic.apply(state.critic_params, batch.obs, unit))
  chex.assert_shape(q, (2, 8))
  expected = 0.5 * sum(np.mean(weights * (q[i] - y) ** 2) for i in range(2))
  np.testing.assert_allclose(loss, expected, rtol=1e-5)
  np.testing.assert_allclose(abs_td, np.abs(q - y).mean(0), rtol=1e-5)
  terminated = batch.discount == 0
  assert terminated.any() and (~terminated).any()
  np.testing.assert_allclose(y[terminated], batch.reward[terminated], rtol=1e-6)
  np.testing.assert_allclose(metrics["q_max"], q.min(0).max(), rtol=1e-6)


def test_actor_objective_uses_the_first_critic():
  agent = ja.TD3(TINY, OBS3, ASYM)
  state = agent.init(jax.random.PRNGKey(0))
  obs = np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32)
  action = agent.actor.apply(state.actor_params, obs)
  twins = np.asarray(agent.critic.apply(state.critic_params, obs, action))
  first = QCritic("mlp", (16, 16)).apply(one_twin(state.critic_params, 0), obs, action)
  np.testing.assert_allclose(first, twins[0], rtol=1e-6)
  assert not np.allclose(twins[0], twins[1])  # two networks, not one twice
  np.testing.assert_allclose(agent.actor_loss(state.actor_params, state.critic_params, obs),
                             -twins[0].mean(), rtol=1e-6)


def test_actor_and_targets_change_only_every_policy_delay_steps():
  config = dataclasses.replace(TINY, policy_delay=3, tau=0.1)
  agent = ja.TD3(config, OBS3, ASYM)
  rng = np.random.default_rng(0)
  state = agent.init(jax.random.PRNGKey(0))
  moved = []
  for step in range(7):  # SGD steps 0..6: the delayed update at 0, 3 and 6
    before = host(state)
    state, metrics, feedback = agent.update(state, continuous_batch(rng, (1, 8)))
    after = host(state)
    assert _changed(before.critic_params, after.critic_params)  # the critics every step
    moved.append(tuple(_changed(getattr(before, n), getattr(after, n))
                       for n in ("actor_params", "target_actor_params", "target_critic_params")))
    if moved[-1][0]:
      # target' = tau * online' + (1 - tau) * target, for both targets.
      for online, target in (("actor_params", "target_actor_params"),
                             ("critic_params", "target_critic_params")):
        expected = jax.tree.map(lambda new, old: 0.1 * new + 0.9 * old, getattr(after, online),
                                getattr(before, target))
        chex.assert_trees_all_close(getattr(after, target), expected, rtol=1e-5, atol=1e-6)
  assert moved == [(True, True, True), (False, False, False), (False, False, False)] * 2 + [
      (True, True, True)]
  chex.assert_shape(feedback, (1, 8))
  assert int(state.opt_steps) == 7
  # Over k=3 steps with one actor step, the actor's metrics are that step's, not a third.
  state, metrics, feedback = agent.update(state, continuous_batch(rng, (3, 8)))
  chex.assert_shape(feedback, (3, 8))
  assert float(metrics["actor_grad_norm"]) > 0
  assert set(metrics) >= {"critic_loss", "actor_loss", "q_mean", "q_max", "critic_grad_norm"}


def test_the_update_and_the_policy_compile_once():
  # (Named apart from test_sac.py's twin: chex keys its trace counter on the calling frames'
  # names and the function's source, and SAC and TD3 share ContinuousAgent._update.)
  agent = ja.TD3(TINY, OBS3, ASYM)
  update = jax.jit(chex.assert_max_traces(agent._update, n=1), donate_argnums=0)
  rng = np.random.default_rng(0)
  state = agent.init(jax.random.PRNGKey(0))
  for _ in range(4):
    state, _, _ = update(state, continuous_batch(rng, (3, 8)))
  for _ in range(3):
    state, _, _ = agent.update(state, continuous_batch(rng, (3, 8)))
    agent.policy(agent.policy_params(state), rng.normal(size=(4, 3)).astype(np.float32), rng)
  assert agent._jitted_update._cache_size() == 1
  assert agent.deterministic_actions._cache_size() == 1


def test_prioritized_replay_takes_its_feedback(tmp_path):
  """|TD| per item goes back as priorities: a prioritized lock-step run trains to the end."""
  data = ja.ReplayConfig(n_step=2, warmup_period=64, prioritized=True)
  agent = ja.TD3(dataclasses.replace(TINY, data=data), *ja.envs.spaces_of(PENDULUM))
  run = ja.RunConfig(max_opts=40, eval_interval=20, eval_episodes=1, progress=False,
                     logdir=str(tmp_path))
  summary = ja.Trainer(agent, PENDULUM, run, ja.ActorsConfig(num_envs=2)).train()
  assert summary["error"] is None and summary["opt_steps"] == 40


# --- errors -------------------------------------------------------------------------------------
@pytest.mark.parametrize("space, words", UNSUITABLE_ACTION_SPACES)
def test_unsuitable_action_spaces_are_refused_with_the_fix(space, words):
  assert_refused_with_the_fix(ja.TD3, TINY, space, words)


@pytest.mark.parametrize("bad, field", [
    (dict(policy_delay=0), "policy_delay"), (dict(tau=0.0), "tau"),
    (dict(critic_learning_rate=float("nan")), "critic_learning_rate"),
    (dict(target_noise=-0.1), "target_noise"), (dict(exploration_noise=float("inf")),
                                                 "exploration_noise"),
    (dict(torso="resnet"), "torso"), (dict(batch_size=500), "batch_size"),
])
def test_bad_settings_are_refused_naming_the_field(bad, field):
  with pytest.raises(ja.ConfigError) as e:
    ja.TD3(dataclasses.replace(TINY, **bad), OBS3, ASYM)
  message = str(e.value)
  assert field in message and "\n" not in message, message


def test_cli_presets_and_registration():
  from jaxasync.train import ALGORITHMS
  from jaxasync.train.td3 import parse
  assert "td3" in ALGORITHMS
  pendulum = parse(["--seed", "3"])
  assert (pendulum.env_id, pendulum.run.seed, pendulum.agent.batch_size) == ("Pendulum-v1", 3, 128)
  mujoco = parse(["--preset", "mujoco", "--env-id", "Hopper-v5"])
  assert mujoco.env_id == "Hopper-v5" and mujoco.agent.actor_learning_rate == 3e-4
  assert (mujoco.agent.data.warmup_period, mujoco.agent.data.replay_capacity) == (25_000,
                                                                                  1_000_000)
  assert mujoco.run.max_env_steps == 1_000_000 and mujoco.agent.hidden_sizes == (256, 256)


# --- learning -----------------------------------------------------------------------------------
@pytest.mark.slow
def test_experiment_learns_pendulum_in_sync(tmp_path):
  """experiments/td3.py's defaults (sync, cut to 6k env steps), as SAC's test: a random policy
  scores about -1200; TD3 reaches the SAC test's bar of -250 within it."""
  summary = pendulum_run_in_sync("experiments/td3.py", tmp_path / "run")
  evals = [round(e["eval_reward"]) for e in summary["evals"]]
  assert summary["best_eval_reward"] >= -250, evals


def test_an_actor_state_pickled_under_its_old_name_still_loads():
  """Lock-step checkpoints from before SAC shared it pickle ``td3.TD3ActorState``."""
  import pickle

  from jaxasync.agents.continuous import ExplorationState
  state = ExplorationState(env_steps=40, steps_per_call=4, explore=True, random_steps=100)
  # (protocol 0 names the class in newline-ended text: renamed by a byte replacement)
  old = pickle.dumps(state, protocol=0).replace(b"jaxasync.agents.continuous",
                                                b"jaxasync.agents.td3")
  old = old.replace(b"ExplorationState", b"TD3ActorState")
  assert b"TD3ActorState" in old
  assert pickle.loads(old) == state

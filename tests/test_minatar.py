"""MinAtarEnvFactory, the MinAtar torso and its automatic choice, and the minatar presets of
Rainbow, DQN, PPO, IMPALA and PQN, each run on every game."""

import dataclasses
import importlib
import pickle

import chex
import jax
import numpy as np
import pytest

pytest.importorskip("minatar")

from helpers import rainbow_module  # noqa: E402

import jaxasync as ja  # noqa: E402
from jaxasync import experiment  # noqa: E402
from jaxasync.errors import ConfigError
from jaxasync.envs import spaces_of  # noqa: E402
from jaxasync.agents.q_network import QNetwork  # noqa: E402
from jaxasync.networks import MinAtarCNN, default_torso  # noqa: E402


def test_breakout_observations_and_spaces():
  factory = ja.MinAtarEnvFactory("MinAtar/Breakout-v1")
  assert pickle.loads(pickle.dumps(factory)) == factory  # actor processes rebuild it
  env = factory(3, seed=0)
  try:
    assert env.metadata["autoreset_mode"].name == "NEXT_STEP"
    assert env.single_observation_space.shape == (10, 10, 4)
    assert env.single_action_space.n == 3  # -v1: the minimal action set
    obs, _ = env.reset()
    assert obs.shape == (3, 10, 10, 4) and obs.dtype == np.bool_
    assert obs[:, :, :, 0].sum() == 3  # one paddle cell per env (channel 0: paddle)
  finally:
    env.close()


def _trajectory(factory, seed, steps=200):
  env = factory(2, seed=seed)
  rng = np.random.default_rng(0)
  try:
    out = [env.reset()[0]]
    for _ in range(steps):
      out.append(env.step(rng.integers(0, 3, size=2))[0])
    return np.stack(out)
  finally:
    env.close()


def test_seed_fixes_the_trajectory():
  factory = ja.MinAtarEnvFactory("MinAtar/Breakout-v1")
  np.testing.assert_array_equal(_trajectory(factory, 4), _trajectory(factory, 4))
  assert not np.array_equal(_trajectory(factory, 4), _trajectory(factory, 5))


def test_seeded_reset_of_a_used_env_reproduces_the_trajectory():
  """MinAtar remembers the last action for its sticky actions; a seeded reset forgets it."""
  env = ja.MinAtarEnvFactory("MinAtar/Breakout-v1", sticky_action_prob=0.5).make_single()
  try:
    runs = []
    for last in (2, 1):
      env.reset(seed=0)
      env.step(last)  # leaves a different last action behind
      obs = [env.reset(seed=9)[0]]
      obs += [env.step(a)[0] for a in (0, 0, 0, 0, 0, 0)]
      runs.append(np.stack(obs))
    np.testing.assert_array_equal(runs[0], runs[1])
  finally:
    env.close()


def test_max_episode_steps_truncates():
  """Freeway never terminates before 2500 steps, so 7 steps end in a truncation at step 7,
  then gymnasium's NEXT_STEP autoreset step, then a new episode."""
  env = ja.MinAtarEnvFactory("MinAtar/Freeway-v1", max_episode_steps=7)(1, seed=0)
  try:
    env.reset()
    flags = [env.step(np.array([0]))[2:4] for _ in range(16)]
    terminated = np.array([f[0][0] for f in flags])
    truncated = np.array([f[1][0] for f in flags])
    assert not terminated.any()
    np.testing.assert_array_equal(np.flatnonzero(truncated), [6, 14])
  finally:
    env.close()


def test_bad_ids_are_config_errors():
  with pytest.raises(ConfigError, match="not a MinAtar id"):
    ja.MinAtarEnvFactory("CartPole-v1")
  with pytest.raises(ConfigError, match="unknown MinAtar id"):
    ja.MinAtarEnvFactory("MinAtar/Pong-v1")(1)
  with pytest.raises(ConfigError, match="sticky_action_prob"):
    ja.MinAtarEnvFactory(sticky_action_prob=1.5)
  with pytest.raises(ConfigError, match="MinAtarEnvFactory"):
    ja.check_env_id("MinAtar/Tetris-v1")  # an unknown id points to the right factory


def test_default_torso():
  assert default_torso((84, 84, 4), np.uint8) == "nature_cnn"
  assert default_torso((10, 10, 4), np.bool_) == "minatar_cnn"
  assert default_torso((10, 10, 4), np.uint8) == "minatar_cnn"  # too small for Nature's convs
  assert default_torso((4,), np.float32) == "mlp"
  assert default_torso((84, 84, 4), np.float32) == "mlp"  # not a uint8 frame stack
  assert default_torso((4, 84, 84), np.uint8) == "mlp"  # channels first: not guessed
  with pytest.raises(ConfigError, match="torso"):
    ja.DQNConfig(torso="resnet").validate()


def test_minatar_cnn_matches_a_numpy_reference():
  """3x3 VALID convolution (16 filters), ReLU, flatten, dense, ReLU, computed by hand."""
  rng = np.random.default_rng(0)
  obs = rng.random((2, 10, 10, 4)) < 0.3
  net = MinAtarCNN(hidden=8)
  params = net.init(jax.random.PRNGKey(0), obs)["params"]
  k = np.asarray(params["Conv_0"]["kernel"])  # [3, 3, 4, 16]
  b = np.asarray(params["Conv_0"]["bias"])
  x = obs.astype(np.float32)
  conv = np.zeros((2, 8, 8, 16), np.float32)
  for i in range(8):
    for j in range(8):
      conv[:, i, j] = np.einsum("bhwc,hwcf->bf", x[:, i:i + 3, j:j + 3], k) + b
  h = np.maximum(conv, 0).reshape(2, -1)
  expected = np.maximum(h @ np.asarray(params["Dense_0"]["kernel"])
                        + np.asarray(params["Dense_0"]["bias"]), 0)
  np.testing.assert_allclose(net.apply({"params": params}, obs), expected, rtol=1e-5, atol=1e-5)


def test_dqn_on_minatar_picks_the_minatar_torso():
  obs_space, action_space = spaces_of(ja.MinAtarEnvFactory("MinAtar/SpaceInvaders-v1"))
  agent = ja.DQN(ja.DQNConfig(hidden_sizes=(32,), loss=ja.Categorical(num_atoms=5), dueling=True),
                 obs_space, action_space)
  assert agent.network.torso == "minatar_cnn"
  state = agent.init(jax.random.PRNGKey(0))
  assert "MinAtarCNN_0" in state.params["params"]
  logits = agent.network.apply(state.params, np.zeros((3, 10, 10, 6), bool))
  chex.assert_shape(logits, (3, action_space.n, 5))
  mlp = QNetwork(num_actions=4, torso="mlp", hidden_sizes=(8,))
  assert "MLPTorso_0" in mlp.init(jax.random.PRNGKey(0), np.zeros((1, 10, 10, 6)))["params"]


def _tiny_replay_run(args, tmp_path, max_opts=40):
  """A replay preset's ``args`` cut to a lock-step run of ``max_opts`` SGD steps (an evaluation
  every 20 and at the end) on a 500-item replay."""
  d = args.agent.data
  return dataclasses.replace(
      args, actors=dataclasses.replace(args.actors, mode="sync"),
      run=dataclasses.replace(args.run, max_opts=max_opts, eval_interval=20, eval_episodes=1,
                              save_interval=0, progress=False, logdir=str(tmp_path)),
      agent=dataclasses.replace(args.agent, data=dataclasses.replace(d, warmup_period=200,
                                                                     replay_capacity=500)))


def _unroll_run_of_three_sgd_steps(module, args, tmp_path) -> None:
  """Runs an unroll preset's ``args`` cut to 3 lock-step SGD steps on 4 envs; checks them."""
  steps = 4 * args.agent.data.unroll_length * args.agent.batch_size * 3
  args = dataclasses.replace(
      args, actors=dataclasses.replace(args.actors, mode="sync", num_envs=4),
      run=dataclasses.replace(args.run, max_env_steps=steps, eval_interval=2, eval_episodes=1,
                              save_interval=0, progress=False, logdir=str(tmp_path)))
  summary = module.main(args)
  assert summary["opt_steps"] == 3 and summary["env_steps"] == steps
  assert len(summary["evals"]) >= 2 and (tmp_path / "summary.json").exists()


def test_rainbow_minatar_preset_runs_end_to_end(tmp_path):
  rb = rainbow_module()
  args = rb.parse(["--preset", "minatar"])
  a = args.agent
  assert (a.learning_rate, a.adam_eps, a.batch_size, a.loss.num_atoms) == (1e-4, 3.125e-4, 32, 51)
  d = a.data
  assert (a.loss.v_min, a.loss.v_max, a.noisy, a.dueling, d.reward_clip) == (
      -100.0, 100.0, True, True, 0)
  assert (d.n_step, d.replay_capacity, d.warmup_period, d.opt_interval) == (
      3, 100_000, 1_000, 4.0)
  assert a.target_update.period * d.opt_interval == 1_000  # env steps per target copy
  args = _tiny_replay_run(args, tmp_path)
  summary = rb.main(args)
  assert summary["opt_steps"] == 40
  assert summary["env_steps"] >= 200 + 4 * 40 - 16  # warm-up, then 4 env steps per SGD step
  assert len(summary["evals"]) == 2 and (tmp_path / "summary.json").exists()


def test_rainbow_env_flags_reach_minatar_or_are_refused():
  rb = rainbow_module()
  train, evaluate = rb.env_factories(rb.parse(["--preset", "minatar", "--no-sticky-actions"]))
  assert train.sticky_action_prob == evaluate.sticky_action_prob == 0.0
  train, evaluate = rb.env_factories(rb.parse(["--preset", "minatar"]))
  assert train.sticky_action_prob == 0.1 and train.env_id == "MinAtar/Breakout-v1"
  with pytest.raises(ConfigError, match="Atari ids only"):
    rb.env_factories(rb.parse(["--preset", "minatar", "--episodic-life"]))
  with pytest.raises(ConfigError, match="Atari ids only"):
    rb.env_factories(rb.parse(["--preset", "minatar", "--atari-backend", "envpool"]))
  with pytest.raises(ConfigError, match="no-sticky-actions"):
    rb.env_factories(rb.parse(["--no-sticky-actions"]))  # CartPole has no sticky actions
  with pytest.raises(ConfigError, match="not a MinAtar id"):
    rb.env_factories(rb.parse(["--preset", "minatar", "--eval-env-id", "CartPole-v1"]))


def test_ppo_minatar_preset_settings():
  import ppo  # experiments/ppo.py
  args = ppo.parse(["--preset", "minatar", "--env-id", "MinAtar/Freeway-v1"])
  a = args.agent
  assert args.env_id == "MinAtar/Freeway-v1" and not args.anneal_lr
  assert (a.learning_rate, a.gamma, a.num_epochs, a.num_minibatches, a.entropy_cost) == (
      5e-4, 0.999, 4, 8, 0.01)
  assert args.actors.num_envs * a.data.unroll_length == 64 * 128
  assert (a.torso, tuple(a.hidden_sizes), a.eval_greedy) == ("mlp", (256, 256), False)


def test_impala_minatar_preset_settings():
  import impala  # experiments/impala.py
  assert impala.parse([]).preset == "cartpole" and impala.parse([]).agent.target_kl_cost == 1.0
  args = impala.parse(["--preset", "minatar", "--env-id", "MinAtar/Seaquest-v1"])
  a = args.agent
  assert args.env_id == "MinAtar/Seaquest-v1" and args.anneal_lr
  assert (a.learning_rate, a.gamma, a.entropy_cost, a.max_grad_norm, a.target_kl_cost) == (
      3e-4, 0.99, 0.01, 0.5, 0.0)
  assert args.actors.num_envs * a.data.unroll_length * a.batch_size == 32 * 20
  assert (a.torso, tuple(a.hidden_sizes), a.eval_greedy) == ("mlp", (256, 256), False)
  # Annealed over the SGD steps 5M env steps pay for (640 env steps each).
  assert experiment.annealed_agent(args).learning_rate_decay_steps == 5_000_000 // 640


def test_dqn_minatar_preset_settings():
  import dqn  # experiments/dqn.py
  assert dqn.parse([]).preset == "cartpole" and dqn.parse([]).agent.layer_norm  # (unchanged)
  args = dqn.parse(["--preset", "minatar", "--env-id", "MinAtar/Asterix-v1"])
  a, d = args.agent, args.agent.data
  assert args.env_id == "MinAtar/Asterix-v1" and not args.anneal_lr
  assert isinstance(a.loss, ja.QLearning) and not a.loss.double_q and not a.layer_norm
  assert (a.learning_rate, a.adam_eps, a.batch_size, a.eps_end, a.eps_decay_steps) == (
      2.5e-4, 3.125e-4, 32, 0.01, 250_000)
  assert (d.n_step, d.replay_capacity, d.warmup_period, d.opt_interval) == (1, 100_000, 1_000, 4.0)
  assert a.target_update.period * d.opt_interval == 1_000  # env steps per target copy


GAME_CHANNELS = {"Breakout": 4, "SpaceInvaders": 6, "Asterix": 4, "Freeway": 7, "Seaquest": 10}


@pytest.mark.parametrize("game", GAME_CHANNELS)
@pytest.mark.parametrize("algo", ["dqn", "rainbow", "ppo", "impala", "pqn"])
def test_every_minatar_preset_runs_on_every_game(algo, game, tmp_path):
  # The games differ in channels (4 to 10) and in what ends an episode; each preset learns
  # from a few lock-step SGD steps on each and evaluates.
  module = importlib.import_module(algo)  # experiments/<algo>.py
  env_id = f"MinAtar/{game}-v1"
  args = module.parse(["--preset", "minatar", "--env-id", env_id])
  if algo in ("dqn", "rainbow"):
    summary = module.main(_tiny_replay_run(args, tmp_path, max_opts=4))
    assert summary["opt_steps"] == 4 and len(summary["evals"]) == 1  # the final one
  else:
    _unroll_run_of_three_sgd_steps(module, args, tmp_path)
  _, record = experiment.read_run_config(tmp_path)
  assert record["settings"]["env_id"] == env_id
  assert f"(10, 10, {GAME_CHANNELS[game]})" in record["observation_space"]  # the game's grid

"""AtariEnvFactory (gymnasium, ale_vector and envpool backends) and end-to-end runs on Pong."""

import importlib.util
import pickle

import numpy as np
import pytest

pytest.importorskip("ale_py")
pytest.importorskip("cv2")

from jaxasync import (ActorsConfig, Categorical, DQN, DQNConfig, ReplayConfig,  # noqa: E402
                      RunConfig, Trainer)
from jaxasync.atari import AtariEnvFactory, is_atari_id  # noqa: E402
from jaxasync.errors import ConfigError
from jaxasync.envs import spaces_of  # noqa: E402
from jaxasync.replay.frames import PrioritizedFrameReplayBuffer  # noqa: E402
from jaxasync.types import transition_example  # noqa: E402

needs_envpool = pytest.mark.skipif(importlib.util.find_spec("envpool") is None,
                                   reason="envpool not installed (the test extra installs it)")
BACKENDS = ["gymnasium", "ale_vector", pytest.param("envpool", marks=needs_envpool)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_pong_observations_are_hwc_stacks_in_next_step_mode(backend):
  factory = AtariEnvFactory("ALE/Pong-v5", backend=backend)
  assert pickle.loads(pickle.dumps(factory)) == factory  # actor processes rebuild it
  env = factory(2, seed=0)
  try:
    assert env.metadata["autoreset_mode"].name == "NEXT_STEP"
    assert env.single_observation_space.shape == (84, 84, 4)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (2, 84, 84, 4) and obs.dtype == np.uint8
    assert obs[..., -1].any()  # the newest frame is a real screen
    for _ in range(5):
      next_obs, reward, terminated, truncated, _ = env.step(np.array([0, 1]))
      assert next_obs.shape == (2, 84, 84, 4) and next_obs.dtype == np.uint8
      assert reward.shape == terminated.shape == truncated.shape == (2,)
      # Newest frame last: each observation is the previous one shifted by one frame.
      np.testing.assert_array_equal(next_obs[..., :-1], obs[..., 1:])
      obs = next_obs
  finally:
    env.close()


@pytest.mark.parametrize("backend", ["gymnasium", pytest.param("envpool", marks=needs_envpool)])
def test_stack_pads_with_the_reset_frame(backend):
  env = AtariEnvFactory("ALE/Breakout-v5", noop_max=0, backend=backend)(1, seed=3)
  try:
    obs, _ = env.reset(seed=3)
    assert obs[0, ..., 3].any()
    for j in range(3):
      np.testing.assert_array_equal(obs[0, ..., j], obs[0, ..., 3])
  finally:
    env.close()


def _rollout(env, steps, action_seed):
  """Observations and flags of ``steps`` steps of fixed pseudo-random actions, from a reset
  that continues the env's own random stream (seeded by the factory)."""
  actions = np.random.default_rng(action_seed).integers(0, env.single_action_space.n,
                                                        size=(steps, env.num_envs))
  out = [env.reset()[0]]
  flags = []
  for a in actions:
    obs, reward, terminated, truncated, info = env.step(a)
    out.append(obs)
    flags.append((reward, terminated, truncated, info.get("lives")))
  return np.stack(out), flags


@pytest.mark.parametrize("backend", BACKENDS)
def test_same_seed_same_trajectory(backend):
  """Seeding reaches the sticky actions and no-ops: a seed fixes the trajectory."""
  factory = AtariEnvFactory("ALE/Breakout-v5", backend=backend)
  runs = []
  for seed in (5, 5, 6):
    env = factory(2, seed=seed)
    try:
      runs.append(_rollout(env, 60, action_seed=0)[0])
    finally:
      env.close()
  np.testing.assert_array_equal(runs[0], runs[1])
  assert not np.array_equal(runs[0], runs[2])


@pytest.mark.parametrize("backend", BACKENDS)
def test_seeded_reset_reproduces_the_trajectory(backend):
  """``reset(seed=s)`` on a used env replays what a fresh env seeded ``s`` plays (the
  Evaluator resets with ``seed + k``); envpool, seeded at construction, is rebuilt."""
  env = AtariEnvFactory("ALE/Breakout-v5", backend=backend)(2, seed=0)
  try:
    runs = []
    for _ in range(2):
      obs, _ = env.reset(seed=11)
      runs.append(np.concatenate([obs[None], _rollout(env, 40, action_seed=1)[0][1:]]))
    np.testing.assert_array_equal(runs[0], runs[1])
  finally:
    env.close()


@needs_envpool
def test_envpool_plays_the_gymnasium_backends_frames():
  """Without sticky actions and with exactly one no-op frame per reset, envpool and the
  reference pipeline see the same game: equal frames and rewards, step for step."""
  runs = []
  for backend in ("gymnasium", "envpool"):
    env = AtariEnvFactory("ALE/Breakout-v5", sticky_actions=False, noop_max=1,
                          backend=backend)(2, seed=0)
    try:
      obs, flags = _rollout(env, 60, action_seed=3)
      runs.append((obs, np.array([f[0] for f in flags])))
    finally:
      env.close()
  np.testing.assert_array_equal(runs[0][0], runs[1][0])
  np.testing.assert_array_equal(runs[0][1], runs[1][1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_max_episode_frames_truncates_in_emulator_frames(backend):
  """A cap of 22 emulator frames ends the 6th agent step (frames 21-24): truncated (not
  terminated) at step index 5, then the NEXT_STEP autoreset step, then a fresh episode.
  (No no-ops: the gymnasium backend counts reset no-op frames toward the cap, the C++
  backends do not.)"""
  env = AtariEnvFactory("ALE/Pong-v5", max_episode_frames=22, noop_max=0,
                        backend=backend)(2, seed=0)
  try:
    _, flags = _rollout(env, 13, action_seed=0)
    truncated = np.array([f[2] for f in flags])
    terminated = np.array([f[1] for f in flags])
    assert not terminated.any()
    np.testing.assert_array_equal(np.flatnonzero(truncated[:, 0]), [5, 12])
    np.testing.assert_array_equal(truncated[:, 0], truncated[:, 1])
  finally:
    env.close()


@pytest.mark.parametrize("backend", ["gymnasium", pytest.param("envpool", marks=needs_envpool)])
def test_vector_episodic_life_ends_episodes_but_not_the_game(backend):
  """Each life lost ends an episode (terminated); the reset after it continues the game."""
  env = AtariEnvFactory("ALE/Breakout-v5", episodic_life=True, backend=backend)(1, seed=0)
  try:
    env.reset(seed=0)
    rng = np.random.default_rng(0)
    lives_at_end = []
    for _ in range(5000):
      _, _, terminated, truncated, info = env.step(rng.integers(0, 4, size=1))
      if terminated[0] or truncated[0]:
        assert terminated[0] and not truncated[0]
        lives_at_end.append(int(info["lives"][0]))
      if len(lives_at_end) == 3:
        break
    assert lives_at_end == [4, 3, 2]  # no new game at a life loss
  finally:
    env.close()


def test_episodic_life_ends_episodes_but_not_the_game():
  env = AtariEnvFactory("ALE/Breakout-v5", episodic_life=True).make_single()
  try:
    _, info = env.reset(seed=0)
    lives = [info["lives"]]
    rng = np.random.default_rng(0)
    while len(lives) < 3:
      _, _, terminated, truncated, info = env.step(int(rng.integers(0, 4)))
      if terminated or truncated:
        _, info = env.reset()
        lives.append(info["lives"])
    assert lives == [5, 4, 3]  # each life is an episode; the game goes on
  finally:
    env.close()


def test_bad_settings_are_config_errors():
  with pytest.raises(ConfigError, match="backend must be one of"):
    AtariEnvFactory(backend="atari_py")
  with pytest.raises(ConfigError, match="restarts the game at every life loss"):
    AtariEnvFactory(episodic_life=True, backend="ale_vector")
  if importlib.util.find_spec("envpool") is not None:
    with pytest.raises(ConfigError, match="envpool has no Atari task"):
      AtariEnvFactory("ALE/NoSuchGame-v5", backend="envpool")(1)
    with pytest.raises(ConfigError, match="2\\*\\*31"):
      AtariEnvFactory(backend="envpool")(2, seed=2**31 - 1)
  with pytest.raises(ConfigError, match="unknown Atari id"):
    AtariEnvFactory("ALE/NoSuchGame-v5")(1)
  assert is_atari_id("ALE/Pong-v5") and not is_atari_id("CartPole-v1")


def test_trainer_runs_pong_end_to_end_with_the_frame_replay():
  factory = AtariEnvFactory("ALE/Pong-v5")
  obs_space, action_space = spaces_of(factory)
  # (The replay given is the one its data describes: frames stored once, prioritized.)
  data = ReplayConfig(warmup_period=120, opt_interval=4.0, n_step=3, reward_clip=1.0,
                      replay_capacity=150, frames=True, prioritized=True, priority_alpha=0.5)
  agent = DQN(DQNConfig(batch_size=8, learning_rate=1e-4, loss=Categorical(num_atoms=11),
                        dueling=True, noisy=True, data=data),
              obs_space, action_space, factory.env_id)
  replay = PrioritizedFrameReplayBuffer(
      transition_example(obs_space, action_space), 150, seed=0, alpha=0.5)
  config = RunConfig(max_opts=16, updates_per_call=2, eval_interval=0, eval_episodes=1,
                     record_interval=0, progress=False)
  summary = Trainer(agent, factory, config, ActorsConfig(num_envs=2), replay=replay).train()
  assert summary["opt_steps"] == 16
  assert replay.added_total > replay.capacity  # wrapped around
  assert len(replay) > replay.capacity // 2
  batch = replay.gather(np.flatnonzero(replay.live)[:4])
  assert batch.obs.shape == batch.next_obs.shape == (4, 84, 84, 4)
  assert batch.obs.dtype == np.uint8 and np.all(batch.discount == np.float32(0.99 ** 3))
  assert replay.bytes_per_item <= 1.05 * 84 * 84 * 4


@needs_envpool
def test_async_rainbow_runs_pong_on_envpool_in_an_actor_process():
  """The envpool backend inside a spawned actor process, into the prioritized frame replay."""
  import functools

  factory = AtariEnvFactory("ALE/Pong-v5", backend="envpool")
  obs_space, action_space = spaces_of(factory)
  data = ReplayConfig(warmup_period=100, n_step=3, reward_clip=1.0, replay_capacity=400,
                      frames=True, prioritized=True, priority_alpha=0.5)
  agent_config = DQNConfig(batch_size=8, loss=Categorical(num_atoms=11), dueling=True,
                           noisy=True, data=data)
  replay = PrioritizedFrameReplayBuffer(
      transition_example(obs_space, action_space), 400, seed=0, alpha=0.5)
  config = RunConfig(max_opts=20, updates_per_call=2, eval_interval=0, record_interval=0,
                     save_interval=0, progress=False, duration=600)  # a safety net only
  agent_factory = functools.partial(DQN, agent_config, obs_space, action_space, factory.env_id)
  trainer = Trainer(agent_factory(), factory, config,
                    ActorsConfig(mode="process", num_actors=1, num_envs=2, chunk_steps=8,
                                 sync_interval=4),
                    replay=replay, agent_factory=agent_factory)
  summary, stats = trainer.train(), trainer.actor_stats
  assert summary["opt_steps"] == 20  # stopped by max_opts
  assert stats[0].env_steps >= 50 and stats[0].restarts == 0
  assert replay.added_total >= 100
  batch = replay.gather(np.flatnonzero(replay.live)[:4])
  assert batch.obs.shape == (4, 84, 84, 4) and batch.obs.dtype == np.uint8

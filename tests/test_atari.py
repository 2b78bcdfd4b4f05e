"""AtariEnvFactory (both backends) and an end-to-end Trainer run on Pong with the frame replay."""

import pickle

import numpy as np
import pytest

pytest.importorskip("ale_py")
pytest.importorskip("cv2")

from jaxasync import DQN, DQNConfig, Trainer, TrainerConfig  # noqa: E402
from jaxasync.atari import AtariEnvFactory, is_atari_id  # noqa: E402
from jaxasync.envs import ConfigError, spaces_of  # noqa: E402
from jaxasync.replay.frames import PrioritizedFrameReplayBuffer  # noqa: E402
from jaxasync.types import transition_example  # noqa: E402


@pytest.mark.parametrize("backend", ["gymnasium", "ale_vector"])
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


def test_gymnasium_stack_pads_with_the_reset_frame():
  env = AtariEnvFactory("ALE/Breakout-v5", noop_max=0)(1, seed=3)
  try:
    obs, _ = env.reset(seed=3)
    for j in range(3):
      np.testing.assert_array_equal(obs[0, ..., j], obs[0, ..., 3])
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
  with pytest.raises(ConfigError, match="ale_vector"):
    AtariEnvFactory(backend="envpool")
  with pytest.raises(ConfigError, match="unknown Atari id"):
    AtariEnvFactory("ALE/NoSuchGame-v5")(1)
  assert is_atari_id("ALE/Pong-v5") and not is_atari_id("CartPole-v1")


def test_trainer_runs_pong_end_to_end_with_the_frame_replay():
  factory = AtariEnvFactory("ALE/Pong-v5")
  obs_space, action_space = spaces_of(factory)
  agent = DQN(DQNConfig(batch_size=8, learning_rate=1e-4, num_atoms=11, dueling=True,
                        noisy=True, reward_clip=1.0, target_update_period=20),
              obs_space, action_space, factory.env_id)
  replay = PrioritizedFrameReplayBuffer(
      transition_example(obs_space, action_space), 150, seed=0, alpha=0.5)
  config = TrainerConfig(max_opts=16, warmup_period=120, opt_interval=4.0, updates_per_call=2,
                         num_envs=2, n_step=3, replay_capacity=150, eval_interval=0,
                         eval_episodes=1, record_interval=0, progress=False)
  summary = Trainer(agent, factory, config, replay=replay).train()
  assert summary["opt_steps"] == 16
  assert replay.added_total > replay.capacity  # wrapped around
  assert len(replay) > replay.capacity // 2
  batch = replay.gather(np.flatnonzero(replay.live)[:4])
  assert batch.obs.shape == batch.next_obs.shape == (4, 84, 84, 4)
  assert batch.obs.dtype == np.uint8 and np.all(batch.discount == np.float32(0.99 ** 3))
  assert replay.bytes_per_item <= 1.05 * 84 * 84 * 4

"""--capture-video: episodes of the current params recorded beside the run, in a thread of their
own, and a refusal in one line for envs that do not render RGB frames."""

import io

import jax
import pytest
import tyro
from PIL import Image

import jaxasync as ja
from jaxasync import experiment, video
from jaxasync.plot import read_events

import dqn  # experiments/dqn.py (experiments/ is on pytest's pythonpath)


def _args(tmp_path, *flags):
  return tyro.cli(dqn.Args, args=["--mode", "sync", "--max-opts", "300", "--eval-interval",
                                  "100", "--agent.warmup-period", "200", "--no-progress",
                                  "--logdir", str(tmp_path / "run"), *flags])


def test_videos_of_every_second_evaluation_and_of_the_final_params(tmp_path):
  summary = dqn.main(_args(tmp_path, "--capture-video", "2"))
  assert summary["opt_steps"] == 300
  written = sorted((tmp_path / "run" / "videos").iterdir())
  # evaluations at 100, 200, 300: videos at 200 (every second one) and 300 (the final params)
  assert [p.name for p in written] == [f"200{video.video_suffix()}", f"300{video.video_suffix()}"]
  if video.video_suffix() == ".gif":
    with Image.open(written[-1]) as gif:
      frames = gif.n_frames
      size = gif.size
    assert frames >= 9 and size == (600, 400)  # CartPole's 600x400 frames, one per step + reset
  # TensorBoard got the same videos, as animated GIFs in its Images tab, at their SGD steps.
  images = [(event.step, value.image) for event in read_events(tmp_path / "run")
            for value in event.summary.value if value.tag == "eval/video"]
  assert [step for step, _ in images] == [200, 300]
  with Image.open(io.BytesIO(images[-1][1].encoded_image_string)) as gif:
    assert gif.size == (600, 400) == (images[-1][1].width, images[-1][1].height)
    if video.video_suffix() == ".gif":
      assert gif.n_frames == frames


def test_without_evaluations_the_final_params_are_recorded(tmp_path):
  dqn.main(_args(tmp_path, "--capture-video", "3", "--eval-interval", "0"))
  assert [p.name for p in (tmp_path / "run" / "videos").iterdir()] == [
      f"300{video.video_suffix()}"]


def test_an_env_the_agent_sees_otherwise_is_refused_before_the_run_starts(tmp_path):
  with pytest.raises(ja.ConfigError, match="records gymnasium envs made by id.*MinAtarEnvFactory"):
    dqn.main(_args(tmp_path, "--capture-video", "1", "--env-id", "MinAtar/Breakout-v1"))
  assert not (tmp_path / "run").exists()  # refused before the logdir was touched
  with pytest.raises(ja.ConfigError, match=r"capture_video \(--capture-video\) must be >= 0"):
    dqn.main(_args(tmp_path, "--capture-video", "-1"))


def test_a_failed_recording_is_raised_at_close_and_the_next_ones_still_run(tmp_path):
  env = ja.EnvFactory("CartPole-v1")
  obs_space, action_space = ja.envs.spaces_of(env)
  agent = ja.DQN(ja.DQNConfig(), obs_space, action_space)
  hook = video.VideoHook(agent, "CartPole-v1", tmp_path / "videos")
  (tmp_path / "videos").rmdir()
  (tmp_path / "videos").write_text("not a directory")  # every write now fails
  params = agent.policy_params(agent.init(jax.random.PRNGKey(0)))
  hook.submit(params, 1)
  hook.submit(params, 2)  # (a failure does not stop the thread: this one is tried too)
  with pytest.raises(OSError):
    hook.close()
  assert hook.written == [] and not hook._thread.is_alive()

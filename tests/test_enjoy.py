"""python -m jaxasync.enjoy: a saved run's agent rebuilt from its config.json, a checkpoint
evaluated, one episode recorded; every agent family; bad input in one line."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import tyro
from PIL import Image

import jaxasync as ja
from jaxasync import enjoy, experiment, video

import dqn  # experiments/*.py (experiments/ is on pytest's pythonpath)
import ppo
import sac

RUNS = {  # short lock-step runs, a few seconds each
    "dqn": (dqn, ["--max-opts", "200", "--agent.warmup-period", "200", "--eval-interval", "100",
                  "--agent.hidden-sizes", "16"]),
    "ppo": (ppo, ["--max-env-steps", "2560", "--eval-interval", "5"]),
    "sac": (sac, ["--max-opts", "200", "--max-env-steps", "400", "--agent.warmup-period", "200",
                  "--eval-interval", "100", "--eval-episodes", "2"]),
}


@pytest.fixture(scope="module", params=sorted(RUNS))
def run_dir(request, tmp_path_factory):
  script, flags = RUNS[request.param]
  logdir = tmp_path_factory.mktemp(request.param) / "run"
  script.main(tyro.cli(script.Args, args=["--mode", "sync", "--no-progress", "--logdir",
                                          str(logdir), *flags]))
  return logdir


def test_every_agent_is_rebuilt_and_evaluated_reproducibly(run_dir):
  record = json.loads((run_dir / "config.json").read_text())
  args = enjoy.EnjoyArgs(str(run_dir), checkpoint="final", episodes=3, seed=5)
  figures = enjoy.enjoy(args)
  assert figures["opt_steps"] == json.loads((run_dir / "summary.json").read_text())["opt_steps"]
  assert figures["episodes"] == 3 and figures["min"] <= figures["mean"] <= figures["max"]
  assert figures == enjoy.enjoy(args)  # the same seed, the same episodes
  # The rebuilt config is the one the run trained with (annealing resolved included).
  config = experiment.rebuilt(record["agent"]["config"])
  assert experiment.described(config) == record["agent"]["config"]
  fields = record["agent"]["config"]["fields"]
  if "learning_rate_decay_steps" in fields:  # DQN: --max-opts 200; PPO: 2560 / (32 x 8) env steps
    assert fields["learning_rate_decay_steps"] == (200 if "DQN" in record["agent"]["class"] else 10)


def test_video_frames_match_the_episode(run_dir, tmp_path):
  figures = enjoy.enjoy(enjoy.EnjoyArgs(str(run_dir), "final", video=str(tmp_path / "v.gif"),
                                        video_episodes=2))
  gif = Image.open(tmp_path / "v.gif")
  assert gif.n_frames > 2
  assert gif.size == ((600, 400) if "CartPole" in figures["env_id"] else (500, 500))
  assert not list(tmp_path.glob(".*tmp*"))  # the temporary file was renamed into place
  # One frame after each reset and one per step (the GIF merges repeated frames, so count
  # them before): CartPole's return is the steps taken, Pendulum's episodes are 200 steps.
  record = json.loads((run_dir / "config.json").read_text())
  factory = enjoy.eval_factory(record, None)
  agent, params, _ = enjoy.restore_agent(record, run_dir / "final", factory)
  frames, returns = video.record_episodes(agent, params, factory.env_id, 2, seed=3)
  steps = sum(returns) if "CartPole" in factory.env_id else 2 * 200
  assert len(frames) == steps + 2 and frames[0].dtype == np.uint8


def test_bad_input_is_one_line(tmp_path):
  (tmp_path / "empty").mkdir()
  out = subprocess.run([sys.executable, "-m", "jaxasync.enjoy", str(tmp_path / "empty")],
                       capture_output=True, text=True, timeout=120)
  assert out.returncode == 2 and out.stderr.strip().startswith("error:")
  assert "has no config.json" in out.stderr and "Traceback" not in out.stderr


def test_missing_checkpoint_lists_what_there_is(tmp_path):
  logdir = tmp_path / "run"
  dqn.main(tyro.cli(dqn.Args, args=["--mode", "sync", "--no-progress", "--logdir", str(logdir),
                                    *RUNS["dqn"][1], "--save-interval", "100"]))
  with pytest.raises(ja.ConfigError, match=r"no checkpoint '7' in .*; it has: best, final, 100, 200"):
    enjoy.enjoy(enjoy.EnjoyArgs(str(logdir), checkpoint="7"))
  with pytest.raises(ja.ConfigError, match=r"name a \.gif or \.mp4 file"):
    enjoy.enjoy(enjoy.EnjoyArgs(str(logdir), video=str(tmp_path / "v.avi")))
  np.testing.assert_equal(enjoy.enjoy(enjoy.EnjoyArgs(str(logdir), checkpoint="100"))["opt_steps"], 100)

"""Runs without --logdir get a directory of their own (runs/<algo>/<env>__seed<seed>__<time>);
--resume without --logdir continues the newest one; enjoy takes a directory of runs."""

import json
import os
from pathlib import Path

import pytest
import tyro

import jaxasync as ja
from jaxasync import experiment
from jaxasync.enjoy import newest_run

import dqn  # experiments/dqn.py (experiments/ is on pytest's pythonpath)


def _args(*flags: str) -> dqn.Args:
  return tyro.cli(dqn.Args, args=list(flags))


def test_new_runs_get_their_own_directory(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  args = _args("--env-id", "MinAtar/Breakout-v1", "--seed", "7")
  first = experiment.with_logdir(args, now=0.0)
  name = Path(first.logdir).name
  assert Path(first.logdir).parent == Path("runs/dqn")
  assert name.startswith("MinAtar-Breakout-v1__seed7__") and len(name.split("__")[2]) == 15
  Path(first.logdir).mkdir(parents=True)
  second = experiment.with_logdir(args, now=0.0)  # the same second: a suffix, not a clash
  assert second.logdir == first.logdir + "-2"
  given = _args("--logdir", "elsewhere")
  assert experiment.with_logdir(given) is given  # an explicit --logdir is kept as it is


def test_resume_without_logdir_takes_the_newest_run_of_this_env_and_seed(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  with pytest.raises(ja.ConfigError, match="there is none; pass the --logdir"):
    experiment.with_logdir(_args("--resume"))
  root = tmp_path / "runs" / "dqn"
  for name, mtime in (("CartPole-v1__seed0__20261125-100000", 300),  # resumed last: newest mtime
                      ("CartPole-v1__seed0__20261125-120000", 100),  # started last
                      ("CartPole-v1__seed1__20261125-130000", 200),  # another seed
                      ("Acrobot-v1__seed0__20261125-140000", 200)):  # another env
    config = root / name / experiment.CONFIG_FILE
    config.parent.mkdir(parents=True)
    config.write_text(json.dumps({"settings": {}}))
    os.utime(config, (mtime, mtime))
  assert (experiment.with_logdir(_args("--resume")).logdir
          == str(Path("runs/dqn/CartPole-v1__seed0__20261125-120000")))
  assert (experiment.with_logdir(_args("--resume", "--seed", "1")).logdir
          == str(Path("runs/dqn/CartPole-v1__seed1__20261125-130000")))
  # enjoy takes the newest run in a directory of runs (by its config.json), or the run named
  assert newest_run(root) == root / "CartPole-v1__seed0__20261125-100000"
  named = root / "Acrobot-v1__seed0__20261125-140000"
  assert newest_run(named) == named
  checkpoint = named / "final"
  resumed = experiment.with_logdir(_args("--resume-from", str(checkpoint)))
  assert resumed.logdir == str(checkpoint.parent.resolve())

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


def test_resume_without_logdir_takes_the_newest_run(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  with pytest.raises(ja.ConfigError, match="there is none; pass the --logdir"):
    experiment.with_logdir(_args("--resume"))
  for name, mtime in (("a", 100), ("b", 300), ("c", 200)):
    config = tmp_path / "runs" / "dqn" / name / experiment.CONFIG_FILE
    config.parent.mkdir(parents=True)
    config.write_text(json.dumps({"settings": {}}))
    os.utime(config, (mtime, mtime))
  assert experiment.with_logdir(_args("--resume")).logdir == str(Path("runs/dqn/b"))
  assert newest_run(tmp_path / "runs" / "dqn") == tmp_path / "runs" / "dqn" / "b"
  assert newest_run(tmp_path / "runs" / "dqn" / "c") == tmp_path / "runs" / "dqn" / "c"
  checkpoint = tmp_path / "runs" / "dqn" / "a" / "final"
  resumed = experiment.with_logdir(_args("--resume-from", str(checkpoint)))
  assert resumed.logdir == str(checkpoint.parent)

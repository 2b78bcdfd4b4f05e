"""--config FILE: a run reruns from its saved <logdir>/config.json in a logdir of its own, flags
given beside it override the file's settings, and a file that cannot be rerun is one error line.
Also: the run's flags in TensorBoard's text tab."""

from __future__ import annotations

import dataclasses
import importlib
import json
from pathlib import Path

import flax.serialization
import jax
import numpy as np
import pytest

import jaxasync as ja
from jaxasync import experiment
from jaxasync.plot import read_events
from jaxasync.train import ALGORITHMS

from jaxasync.train import dqn  # (its cli calls its main: _parsed replaces that one)

# A short lock-step DQN run with 3 evaluations, both of DQN's subcommands off their defaults.
# (Subcommands come after every other flag: tiny(...) puts the flags given before them.)
TINY = ["--mode", "sync", "--no-progress", "--max-opts", "120", "--agent.warmup-period", "100",
        "--eval-interval", "40", "--eval-episodes", "2", "--save-interval", "0",
        "--agent.hidden-sizes", "16", "--agent.batch-size", "32"]
SUBCOMMANDS = ["agent.loss:q-learning", "agent.target-update:hard-copy",
               "--agent.target-update.period", "50"]
# What differs between two runs of the same settings: the clock.
CLOCK = ("wall_s", "per_sec", "stage_", "bottleneck", "blocked")


def timeless(value):
  """A summary without its wall-clock fields (at any depth)."""
  if isinstance(value, dict):
    return {k: timeless(v) for k, v in value.items() if not any(c in k for c in CLOCK)}
  if isinstance(value, list):
    return [timeless(v) for v in value]
  return value


def final_arrays(logdir: Path) -> dict:
  """The arrays of a run's final checkpoint (params, optimizer and target states; its meta,
  which holds wall times, left out)."""
  state = flax.serialization.msgpack_restore((logdir / "final" / "state.msgpack").read_bytes())
  state.pop("meta", None)
  return {jax.tree_util.keystr(path): np.asarray(leaf)
          for path, leaf in jax.tree_util.tree_leaves_with_path(state)}


def assert_same_run(a: Path, b: Path) -> None:
  """Runs ``a`` and ``b`` have the same summary but for the clock, and bit-identical final
  arrays."""
  summaries = [json.loads((d / "summary.json").read_text()) for d in (a, b)]
  assert timeless(summaries[0]) == timeless(summaries[1])
  arrays = [final_arrays(d) for d in (a, b)]
  assert arrays[0].keys() == arrays[1].keys() and arrays[0]
  for key in arrays[0]:
    assert arrays[0][key].tobytes() == arrays[1][key].tobytes(), key


def tiny(*flags: str) -> list[str]:
  """The tiny run's command line with ``flags`` added."""
  return [*TINY, *flags, *SUBCOMMANDS]


def _train(argv: list[str]) -> dict:
  """dqn.py's command line, parsed as its ``cli`` parses it, trained."""
  return dqn.main(experiment.parse_args(dqn.Args, argv, None))


def _saved(module, tmp_path: Path, args) -> Path:
  """``args`` saved as ``module``'s run would save them (without training); the file."""
  logdir = tmp_path / module.Args.algo
  logdir.mkdir(parents=True)
  return experiment.write_config(logdir, experiment.flat_settings(args), "title",
                                 ja.EnvFactory("CartPole-v1"), algo=module.Args.algo)


def _parsed(module, argv: list[str], monkeypatch):
  """The ``Args`` that ``module.cli(argv)`` would run (its ``main`` replaced)."""
  seen = []
  monkeypatch.setattr(module, "main", seen.append)
  module.cli(argv)
  return seen[0]


def test_a_saved_config_reruns_to_a_bit_identical_run(tmp_path):
  first = _train(tiny("--logdir", str(tmp_path / "a")))
  config = tmp_path / "a" / "config.json"
  _train(["--config", str(config), "--logdir", str(tmp_path / "b")])
  assert first["opt_steps"] == 120 and len(first["evals"]) == 3
  assert_same_run(tmp_path / "a", tmp_path / "b")
  saved = [json.loads((tmp_path / d / "config.json").read_text()) for d in "ab"]
  changed = {k for k in saved[0]["settings"] if saved[0]["settings"][k] != saved[1]["settings"][k]}
  assert changed == {"run.logdir", "config"} and saved[1]["settings"]["agent.loss"] == "q-learning"
  assert saved[1]["algo"] == "dqn" and saved[1]["agent"] == saved[0]["agent"]


@pytest.mark.parametrize("algo", ALGORITHMS)
def test_every_script_reruns_a_config_and_a_flag_given_overrides_it(algo, tmp_path,
                                                                     monkeypatch):
  """The file's settings (its preset's, for a script with presets) are the defaults; --seed
  given beside it wins; the rerun's logdir is left for a fresh run directory."""
  module = importlib.import_module(f"jaxasync.train.{algo}")
  presets = getattr(module, "PRESETS", None)
  # (a preset other than the first, so that the file's preset is seen to be the one read)
  original = presets[list(presets)[-1]]() if presets else module.Args()
  original = dataclasses.replace(original, run=dataclasses.replace(
      original.run, logdir=str(tmp_path / "old")))
  path = _saved(module, tmp_path, original)
  args = _parsed(module, ["--config", str(path), "--seed", "7"], monkeypatch)
  assert args.run.seed == 7 and args.run.logdir is None and args.config == str(path)
  expected = {**experiment.flat_settings(original), "run.seed": 7, "run.logdir": None,
              "config": str(path)}
  assert experiment.flat_settings(args) == expected
  # A run directory names its config.json too.
  assert _parsed(module, ["--config", str(path.parent)], monkeypatch).run.seed == original.run.seed


def test_a_rerun_keeps_this_machines_compile_cache_not_the_files(tmp_path, monkeypatch):
  original = _parsed(dqn, tiny("--compile-cache", "/elsewhere/xla"), monkeypatch)
  path = _saved(dqn, tmp_path, original)
  assert json.loads(path.read_text())["settings"]["compile_cache"] == "/elsewhere/xla"
  args = _parsed(dqn, ["--config", str(path)], monkeypatch)
  assert args.compile_cache == dqn.Args().compile_cache


def test_flags_override_the_file_subcommands_included(tmp_path, monkeypatch):
  original = _parsed(dqn, tiny("--agent.learning-rate", "3e-4"), monkeypatch)
  path = _saved(dqn, tmp_path, original)
  args = _parsed(dqn, ["--config", str(path), "--agent.n-step", "2"], monkeypatch)
  assert args.agent.data.n_step == 2 and args.agent.learning_rate == 3e-4
  assert args.agent.hidden_sizes == (16,) and args.run.max_opts == 120  # (a tuple again)
  assert args.agent.loss == ja.QLearning() and args.agent.target_update == ja.HardCopy(50)
  # Another loss given: that loss, with its own defaults but the flags given.
  args = _parsed(dqn, ["--config", str(path), "agent.loss:munchausen", "--agent.loss.alpha",
                       "0.5"], monkeypatch)
  assert args.agent.loss == ja.Munchausen(alpha=0.5)
  assert args.agent.target_update == ja.HardCopy(50) and args.agent.learning_rate == 3e-4


def test_a_rerun_without_logdir_gets_a_fresh_run_directory(tmp_path, monkeypatch):
  original = _parsed(dqn, tiny("--logdir", str(tmp_path / "old")), monkeypatch)
  path = _saved(dqn, tmp_path, original)
  args = experiment.with_logdir(_parsed(dqn, ["--config", str(path)], monkeypatch))
  assert Path(args.logdir).parent == Path("runs/dqn")
  assert Path(args.logdir).name.startswith("CartPole-v1__seed0__")


def _error(module, argv, capsys) -> str:
  """The one ``error:`` line of ``module.cli(argv)``, which exits 2."""
  with pytest.raises(SystemExit) as e:
    module.cli(argv)
  assert e.value.code == 2
  lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
  assert len(lines) == 1 and lines[0].startswith("error: "), lines
  return lines[0]


def test_a_config_that_cannot_be_rerun_is_one_error_line(tmp_path, capsys):
  from jaxasync.train import ppo, rainbow
  missing = tmp_path / "missing.json"
  assert "no such file; pass the config.json" in _error(dqn, ["--config", str(missing)], capsys)
  (tmp_path / "bad.json").write_text("{not json")
  assert "cannot be read as JSON" in _error(dqn, ["--config", str(tmp_path / "bad.json")], capsys)
  (tmp_path / "other.json").write_text('{"name": "something else"}')
  assert "is not a jaxasync run's config" in _error(
      dqn, ["--config", str(tmp_path / "other.json")], capsys)
  ppo_config = _saved(ppo, tmp_path, ppo.Args())
  line = _error(dqn, ["--config", str(ppo_config)], capsys)
  assert f"is a ppo run's config, not dqn's; rerun it with python -m jaxasync.train ppo " \
         f"--config {ppo_config}" in line
  # A config saved before configs named their script: its title names it.
  record = json.loads(ppo_config.read_text())
  del record["algo"]
  record["algorithm"] = "PPO, preset cartpole"
  ppo_config.write_text(json.dumps(record))
  assert "is a ppo run's config, not dqn's" in _error(dqn, ["--config", str(ppo_config)], capsys)
  # A setting this version does not have.
  dqn_config = _saved(dqn, tmp_path, dqn.Args())
  record = json.loads(dqn_config.read_text())
  record["settings"]["agent.retired_setting"] = 1
  dqn_config.write_text(json.dumps(record))
  assert "has settings that dqn does not (agent.retired_setting)" in _error(
      dqn, ["--config", str(dqn_config)], capsys)
  assert "drop --preset" in _error(
      rainbow, ["--config", str(dqn_config), "--preset", "minatar"], capsys)


def _texts(logdir: Path) -> dict[str, str]:
  """``{tag: text}`` of the text summaries in a run's TensorBoard event files."""
  return {value.tag: value.tensor.string_val[0].decode()
          for event in read_events(logdir) for value in event.summary.value
          if value.tensor.string_val}


def test_the_flags_are_in_tensorboards_text_tab(tmp_path):
  _train(tiny("--max-opts", "20", "--eval-interval", "0", "--logdir", str(tmp_path)))
  text = _texts(tmp_path)["hyperparameters/text_summary"]
  assert text.startswith("|flag|value|\n|-|-|\n")
  assert "|--max-opts|20|" in text and "|--agent.hidden-sizes|16|" in text
  assert "|agent.loss|q-learning|" in text  # (a subcommand)


def test_the_config_records_what_ran_it(tmp_path):
  import subprocess
  import jax
  record = json.loads(_saved(dqn, tmp_path, dqn.Args()).read_text())["provenance"]
  assert record["versions"]["jax"] == jax.__version__
  assert record["devices"] == [str(d) for d in jax.devices()]
  head = subprocess.run(["git", "-C", str(Path(ja.__file__).parent), "rev-parse", "HEAD"],
                        capture_output=True, text=True)
  if head.returncode == 0:  # (a git checkout, as in CI's clone)
    assert record["git_commit"] == head.stdout.strip()
    assert isinstance(record["git_dirty"], bool)
  else:
    assert record["git_commit"] is None


def test_a_rerun_in_lockstep_does_not_refuse_what_the_file_set(tmp_path):
  # The saved run had two actor processes; --config F --deterministic reruns it lock-step, and
  # num_actors=2 came from the file, not from the user: it gives way as a preset's would.
  saved = _saved(dqn, tmp_path, dqn.Args(actors=ja.ActorsConfig(mode="process", num_actors=2,
                                                                 sync_interval=10)))
  args = experiment.parse_args(dqn.Args, ["--config", str(saved), "--deterministic"], None)
  assert args.actors.num_actors == 2 and args.preset_defaults().actors.num_actors == 2
  actors = experiment.lockstep_actors(experiment.deterministic(args).actors,
                                      args.preset_defaults().actors)
  actors.validate()  # (refused before: "ignores num_actors=2")
  assert actors.lockstep and actors.num_actors == ja.ActorsConfig().num_actors


def test_a_setting_the_file_predates_takes_its_class_default(tmp_path, monkeypatch):
  """An IMPALA config saved before the target-policy anchor existed reruns without it (the
  class default 0.0, the behaviour of before), not with the preset's 1.0; the settings the
  file has keep its values."""
  impala = importlib.import_module("jaxasync.train.impala")
  original = impala.Args()
  assert original.agent.target_kl_cost == 1.0  # (the preset's; the class default is 0.0)
  path = _saved(impala, tmp_path, dataclasses.replace(
      original, agent=dataclasses.replace(original.agent, learning_rate=3e-4)))
  record = json.loads(path.read_text())
  del record["settings"]["agent.target_kl_cost"]
  path.write_text(json.dumps(record))
  args = _parsed(impala, ["--config", str(path)], monkeypatch)
  assert args.agent.target_kl_cost == 0.0 and args.agent.learning_rate == 3e-4
  assert args.agent.target_tau == original.agent.target_tau  # (in the file: kept)

"""The run driver (jaxasync.experiment): the saved config.json, and a --resume that refuses a
changed run in one line instead of training on silently."""

from __future__ import annotations

import json

import pytest
import tyro

import jaxasync as ja
from jaxasync import experiment

import dqn  # experiments/dqn.py (experiments/ is on pytest's pythonpath)
import ppo  # experiments/ppo.py

# A short lock-step DQN run: 200 SGD steps, checkpoints every 100, no evaluation.
SHORT = ["--mode", "sync", "--no-progress", "--max-opts", "200", "--agent.warmup-period", "200",
         "--eval-interval", "0", "--save-interval", "100", "--agent.hidden-sizes", "16"]


def _dqn(logdir, *flags) -> dict:
  return dqn.main(tyro.cli(dqn.Args, args=[*SHORT, "--logdir", str(logdir), *flags]))


def test_flag_and_field_spellings():
  assert experiment.flag("agent.learning_rate") == "--agent.learning-rate"
  assert experiment.flag("actors.num_actors") == "--num-actors"
  assert experiment.flag("run.max_opts") == "--max-opts"
  assert experiment.flag("agent.data.n_step") == "--agent.n-step"
  assert experiment.flag("env_id") == "--env-id"
  fields = experiment.flat_settings(dqn.Args())
  for spelt in ("agent.learning_rate", "--agent.learning-rate", "agent.learning-rate"):
    assert experiment.field_name(spelt, fields) == "agent.learning_rate"
  for spelt in ("--num-actors", "num-actors", "actors.num_actors"):
    assert experiment.field_name(spelt, fields) == "actors.num_actors"
  for spelt in ("--agent.n-step", "agent.data.n_step"):
    assert experiment.field_name(spelt, fields) == "agent.data.n_step"


def test_flat_settings_nest_and_round_trip_through_json():
  args = tyro.cli(ppo.Args, args=["--agent.hidden-sizes", "32", "32", "--num-actors", "2"])
  flat = experiment.flat_settings(args)
  assert flat["agent.hidden_sizes"] == [32, 32]  # a tuple, as JSON gives it back
  assert flat["actors.num_actors"] == 2
  assert flat["agent.gamma"] == 0.98 and flat["env_id"] == "CartPole-v1"
  assert flat == json.loads(json.dumps(flat))


def test_resume_changes_sorts_refused_from_applied():
  saved = {"env_id": "CartPole-v1", "agent.learning_rate": 1e-3, "run.max_opts": 100,
           "run.seed": 0, "actors.num_actors": 1, "resume": False,
           "agent.hidden_sizes": [64, 64]}
  now = dict(saved, env_id="CartPole-v0", resume=True,
             **{"agent.learning_rate": 0.1, "run.max_opts": 500, "actors.num_actors": 3,
                "agent.hidden_sizes": [32]})
  refused, applied = experiment.resume_changes(saved, now)
  assert refused == ["--agent.hidden-sizes 32 (was 64 64)",
                     "--agent.learning-rate 0.1 (was 0.001)", "--env-id CartPole-v0 (was CartPole-v1)"]
  assert applied == ["--num-actors 3 (was 1)", "--max-opts 500 (was 100)"]  # resume: not compared
  refused, applied = experiment.resume_changes(saved, now, ("--agent.learning-rate", "agent"))
  assert refused == ["--env-id CartPole-v0 (was CartPole-v1)"]
  assert len(applied) == 4
  # A setting the saved config predates is applied, not refused: its old value is unknown.
  assert experiment.resume_changes(saved, {**saved, "agent.data.n_step": 3}) == (
      [], ["--agent.n-step 3 (not in the saved config)"])


def test_a_setting_the_saved_run_predates_compares_with_its_class_default():
  """IMPALA's CartPole preset turned target_kl_cost on (1.0) after runs without it were saved:
  those had the class default 0, so a resume that would add the anchor is refused, with the
  way back; at the default it is applied."""
  from jaxasync.train import impala
  args = impala.Args()
  now = experiment.flat_settings(args)
  saved = {k: v for k, v in now.items() if k != "agent.target_kl_cost"}
  defaults = experiment.class_defaults(args)
  assert defaults["agent.target_kl_cost"] == 0.0 and now["agent.target_kl_cost"] == 1.0
  assert experiment.resume_changes(saved, now, defaults=defaults) == (
      ["--agent.target-kl-cost 1.0 (not in the saved config, which predates it: the run had "
       "its default 0.0)"], [])
  at_default = {**now, "agent.target_kl_cost": 0.0}
  assert experiment.resume_changes(saved, at_default, defaults=defaults) == (
      [], ["--agent.target-kl-cost 0.0 (not in the saved config)"])


def test_a_changed_loss_is_one_change_and_its_fields_are_not_compared():
  saved = experiment.flat_settings(tyro.cli(dqn.Args, args=[]))
  now = experiment.flat_settings(tyro.cli(dqn.Args, args=["agent.loss:categorical"]))
  assert now["agent.loss"] == "categorical" and "agent.loss.alpha" not in now
  refused, applied = experiment.resume_changes(saved, now)
  assert (refused, applied) == (["agent.loss:categorical (was agent.loss:munchausen)"], [])
  refused, applied = experiment.resume_changes(saved, now, ("agent.loss",))
  assert (refused, applied) == ([], ["agent.loss:categorical (was agent.loss:munchausen)"])
  # Rainbow's flags have no agent prefix: nor has its loss subcommand.
  assert experiment.resume_changes(saved, now, flattened=("run", "actors", "data", "agent"))[0] == [
      "loss:categorical (was loss:munchausen)"]


def test_settings_saved_before_the_loss_field_compare_where_no_field_moved():
  # Layout 2 (before DQN's loss became a union): a PPO run's fields are all still fields, so
  # they compare; a DQN run's munchausen flag is gone, so its settings cannot be compared.
  settings = experiment.flat_settings(ppo.Args())
  assert experiment.comparable_layout({"settings_layout": 2, "settings": settings}, settings)
  old_dqn = {**experiment.flat_settings(dqn.Args()), "agent.munchausen": True}
  assert not experiment.comparable_layout({"settings_layout": 2, "settings": old_dqn},
                                          experiment.flat_settings(dqn.Args()))
  assert experiment.comparable_layout(
      {"settings_layout": experiment.SETTINGS_LAYOUT, "settings": {}}, settings)


def test_the_run_saves_its_flags_and_a_changed_resume_is_refused_in_one_line(tmp_path):
  logdir = tmp_path / "run"
  _dqn(logdir)
  record = json.loads((logdir / "config.json").read_text())
  assert record["algorithm"] == "DQN" and record["action_space"] == "Discrete(2)"
  assert record["settings"]["agent.hidden_sizes"] == [16]
  assert record["settings"]["agent.learning_rate"] == 1e-3
  assert record["settings"]["agent.loss"] == "munchausen"  # the loss's class, then its fields
  assert record["settings"]["agent.loss.alpha"] == 0.9
  # Each of these trained on silently before (issue 30), or failed as a "damaged checkpoint".
  for flags, named in [(["--env-id", "CartPole-v0"], "--env-id CartPole-v0 (was CartPole-v1)"),
                       # (listed in the order of the fields' dotted names: agent.data.gamma
                       # before agent.learning_rate)
                       (["--agent.learning-rate", "0.1", "--agent.gamma", "0.5"],
                        "--agent.gamma 0.5 (was 0.99); --agent.learning-rate 0.1 (was 0.001)"),
                       (["--agent.n-step", "1"], "--agent.n-step 1 (was 5)"),
                       (["agent.loss:q-learning"],
                        "agent.loss:q-learning (was agent.loss:munchausen)"),
                       (["agent.loss:munchausen", "--agent.loss.alpha", "0.5"],
                        "--agent.loss.alpha 0.5 (was 0.9)"),
                       (["--agent.hidden-sizes", "32", "32"], "--agent.hidden-sizes 32 32 (was 16)")]:
    with pytest.raises(ja.ConfigError) as e:
      _dqn(logdir, "--resume", *flags)
    message = str(e.value)
    assert "\n" not in message and named in message, message
    assert "Start a new --logdir" in message and "--allow-changes" in message
  summary = json.loads((logdir / "summary.json").read_text())
  assert summary["opt_steps"] == 200  # nothing trained by the refused resumes


def test_allowed_and_safe_changes_are_applied_and_saved(tmp_path, capsys):
  logdir = tmp_path / "run"
  _dqn(logdir)
  capsys.readouterr()
  summary = _dqn(logdir, "--resume", "--max-opts", "300", "--agent.learning-rate", "5e-4",
                 "--allow-changes", "agent.learning_rate")
  assert summary["opt_steps"] == 300
  out = capsys.readouterr().out
  # The learning-rate decay spans --max-opts: the resolved agent's change is listed too.
  assert ("resume: applying --agent.learning-rate 0.0005 (was 0.001); --max-opts 300 (was 200); "
          "--agent.learning-rate-decay-steps 300 (was 200, following the changes above)" in out)
  settings = json.loads((logdir / "config.json").read_text())["settings"]
  assert settings["agent.learning_rate"] == 5e-4 and settings["run.max_opts"] == 300


def test_resume_from_compares_with_the_checkpoints_run(tmp_path, caplog):
  _dqn(tmp_path / "a")
  with pytest.raises(ja.ConfigError, match=r"run saved in .*a with settings .*--seed 1 \(was 0\)"):
    _dqn(tmp_path / "b", "--resume-from", str(tmp_path / "a" / "final"), "--seed", "1")
  assert not (tmp_path / "b" / "config.json").exists()
  # The named checkpoint, not the newest, into a new logdir, which gets the config.
  with caplog.at_level("WARNING", logger="jaxasync"):
    summary = _dqn(tmp_path / "b", "--resume-from", str(tmp_path / "a" / "100"), "--max-opts", "300")
  assert f"resuming from {tmp_path / 'a' / '100'} (SGD step 100" in caplog.text
  assert summary["opt_steps"] == 300
  saved = json.loads((tmp_path / "b" / "config.json").read_text())["settings"]
  assert saved["run.max_opts"] == 300 and saved["run.logdir"] == str(tmp_path / "b")


def test_a_resume_that_cannot_load_keeps_the_saved_config(tmp_path):
  logdir = tmp_path / "run"
  _dqn(logdir)
  before = (logdir / "config.json").read_text()
  # The params' shapes differ: not "damaged", and no --overwrite offered (it deletes the run).
  with pytest.raises(ja.ConfigError, match=r"hold a learner state of another shape than these "
                     r"settings build \(final: .*\): a run cannot continue with another network"
                     ) as e:
    _dqn(logdir, "--resume", "--agent.hidden-sizes", "32", "--allow-changes", "agent.hidden_sizes")
  assert "overwrite" not in str(e.value) and "\n" not in str(e.value)
  assert (logdir / "config.json").read_text() == before
  with pytest.raises(ja.ConfigError, match=r"--resume: .*missing does not exist"):
    _dqn(tmp_path / "missing", "--resume")
  assert not (tmp_path / "missing").exists()
  # A mistyped checkpoint: one line, and no directory made for it (or for its run).
  with pytest.raises(ja.ConfigError, match=r"--resume-from .*typo/000100: no such checkpoint"):
    _dqn(tmp_path / "new", "--resume-from", str(tmp_path / "typo" / "000100"))
  assert not (tmp_path / "typo").exists() and not (tmp_path / "new").exists()
  # The run directory instead of one of its checkpoints, or its best/: the way to do it.
  events = sorted(logdir.glob("events*"))
  with pytest.raises(ja.ConfigError, match=r"is a run directory, not a checkpoint: --resume "
                     r"--logdir .*run continues it"):
    _dqn(tmp_path / "new", "--resume-from", str(logdir))
  with pytest.raises(ja.ConfigError, match=r"best holds the best params only"):
    _dqn(tmp_path / "new", "--resume-from", str(logdir / "best"))
  assert not (tmp_path / "new").exists()
  assert sorted(logdir.glob("events*")) == events  # (nothing written beside them)


def test_a_new_run_refuses_a_logdir_holding_only_a_config(tmp_path):
  logdir = tmp_path / "run"
  logdir.mkdir()
  (logdir / "config.json").write_text("{}")
  with pytest.raises(ja.ConfigError, match=r"already holds a run \(config.json\)"):
    _dqn(logdir)


def test_no_experiment_script_imports_another():
  """Each script reads top to bottom over jaxasync.experiment (issue 29): none imports another."""
  from pathlib import Path
  # (experiments/_quiet_start.py, their Ctrl-C guard, is no script)
  scripts = sorted((Path(__file__).resolve().parents[1] / "experiments").glob("[!_]*.py"))
  names = {p.stem for p in scripts}
  assert {"dqn", "impala", "ppo", "sac", "rainbow"} <= names
  for path in scripts:
    for line in path.read_text().splitlines():
      words = line.split()
      if words[:1] in (["import"], ["from"]) and len(words) > 1:
        assert words[1].split(".")[0] not in names, f"{path.name}: {line.strip()}"


@pytest.mark.parametrize("save_replay", ["False", "True"])  # True: the background writer
def test_a_full_disk_during_a_save_ends_in_one_error_line(tmp_path, monkeypatch, capsys,
                                                          save_replay):
  """The second checkpoint's write fails as on a full disk (ENOSPC): the run stops at once with
  rc 1 and one line naming the directory, the OS's reason and the last complete checkpoint."""
  import errno
  import jaxasync.ledger
  real, calls = jaxasync.ledger.save_checkpoint, []

  def save_checkpoint(path, *a, **k):
    calls.append(path)
    if len(calls) == 2:
      raise OSError(errno.ENOSPC, "No space left on device", str(path) + ".tmp")
    return real(path, *a, **k)

  monkeypatch.setattr(jaxasync.ledger, "save_checkpoint", save_checkpoint)
  logdir = tmp_path / "run"
  with pytest.raises(SystemExit) as e:
    experiment.run_cli(lambda: _dqn(logdir, "--max-opts", "400", "--save-replay", save_replay))
  assert e.value.code == 1
  err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
  assert len(err) == 1, err
  assert "checkpoint '200' could not be written" in err[0]
  assert "No space left on device" in err[0] and f"{logdir / '100'}, untouched" in err[0]
  assert (logdir / "100").is_dir() and calls[1] == logdir / "200"
  summary = json.loads((logdir / "summary.json").read_text())
  assert summary["opt_steps"] < 300 and "CheckpointError" in summary["error"]  # at once

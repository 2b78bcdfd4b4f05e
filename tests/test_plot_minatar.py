"""scripts/plot_minatar.py: runs read from their logdirs, archived, redrawn and tabled."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import load_script

from jaxasync import experiment

pm = load_script(Path(__file__).parents[1] / "scripts" / "plot_minatar.py",
                 "jaxasync_scripts_plot_minatar")


def _fake_run(directory: Path, algo: str, env_id: str, seed: int, rewards, commit="a" * 40,
              **summary):
  directory.mkdir(parents=True)
  (directory / "config.json").write_text(json.dumps({
      "algo": algo, "provenance": {"git_commit": commit, "git_dirty": False},
      "settings_layout": experiment.SETTINGS_LAYOUT,
      "settings": {"env_id": env_id, "run.seed": seed, "actors.mode": "auto"}}))
  # Written out of order: the archive sorts by env steps.
  evals = [{"opt_steps": i, "env_steps": 1000 * i, "wall_s": 2.0 * i, "eval_reward": r}
           for i, r in reversed(list(enumerate(rewards, 1)))]
  (directory / "summary.json").write_text(json.dumps(
      {"evals": evals, "mode": "async-process", "interrupted": False, "error": None, **summary}))
  return directory


def test_a_run_is_read_from_its_logdir(tmp_path):
  run = pm.read_run(_fake_run(tmp_path / "r", "pqn", "MinAtar/Asterix-v1", 3, [1.0, 18.0, 9.0]))
  # The mode that ran (the summary's), not the flag's "auto".
  assert run == {"algo": "pqn", "game": "Asterix", "seed": 3, "mode": "async-process",
                 "commit": "aaaaaaa", "env_steps": [1000, 2000, 3000],
                 "wall_s": [2.0, 4.0, 6.0], "eval_reward": [1.0, 18.0, 9.0]}
  # The paper's DQN figure on Asterix is 17: first reached at the second evaluation.
  assert pm.target_env_steps(run, 17.0) == 2000
  assert pm.target_env_steps(run, 19.0) is None


def test_other_runs_are_refused_by_name(tmp_path):
  with pytest.raises(ValueError, match="CartPole-v1, not a MinAtar game"):
    pm.read_run(_fake_run(tmp_path / "c", "dqn", "CartPole-v1", 0, [10.0]))
  with pytest.raises(ValueError, match="config.json: no such file"):
    pm.read_run(tmp_path)
  with pytest.raises(ValueError, match="no evaluations"):
    pm.read_run(_fake_run(tmp_path / "e", "dqn", "MinAtar/Breakout-v1", 0, []))
  with pytest.raises(ValueError, match="interrupted or failed"):
    pm.read_run(_fake_run(tmp_path / "i", "dqn", "MinAtar/Breakout-v1", 0, [1.0],
                          interrupted=True))
  unnamed = _fake_run(tmp_path / "u", "dqn", "MinAtar/Breakout-v1", 0, [1.0])
  config = json.loads((unnamed / "config.json").read_text())
  del config["algo"]
  (unnamed / "config.json").write_text(json.dumps(config))
  with pytest.raises(ValueError, match="names no algorithm, commit or seed"):
    pm.read_run(unnamed)
  broken = _fake_run(tmp_path / "b", "dqn", "MinAtar/Breakout-v1", 0, [1.0])
  (broken / "summary.json").write_text('{"evals": [{"eval_reward": 3.0}]}')  # no env_steps
  with pytest.raises(ValueError, match="summary.json cannot be read .KeyError"):
    pm.read_run(broken)


def test_a_bad_run_is_one_line_on_stderr(tmp_path, capsys):
  (tmp_path / "r").mkdir()
  (tmp_path / "r" / "config.json").write_text("{not json")
  with pytest.raises(SystemExit) as exit_info:
    pm.main([str(tmp_path / "r"), "--archive", str(tmp_path / "a.json"),
             "--out", str(tmp_path / "f.png")])
  assert exit_info.value.code == 2
  error = capsys.readouterr().err.strip().splitlines()[-1]
  assert "config.json cannot be read as JSON" in error and not (tmp_path / "a.json").exists()


def test_the_archive_keeps_old_runs_and_replaces_a_rerun(tmp_path):
  archive, out = tmp_path / "curves.json", tmp_path / "fig.png"
  a = _fake_run(tmp_path / "a", "dqn", "MinAtar/Breakout-v1", 0, [5.0, 12.0])
  b = _fake_run(tmp_path / "b", "pqn", "MinAtar/Seaquest-v1", 0, [3.0])
  pm.main([str(a), str(b), "--archive", str(archive), "--out", str(out)])
  assert out.stat().st_size > 0
  # The same algorithm, game, seed and mode again, at a newer commit: replaced. Another
  # seed: added.
  a2 = _fake_run(tmp_path / "a2", "dqn", "MinAtar/Breakout-v1", 0, [7.0, 30.0], commit="b" * 40)
  a3 = _fake_run(tmp_path / "a3", "dqn", "MinAtar/Breakout-v1", 1, [1.0])
  pm.main([str(a2), str(a3), "--archive", str(archive), "--out", str(out)])
  saved = json.loads(archive.read_text())
  assert [(r["game"], r["algo"], r["seed"], r["commit"], r["eval_reward"]) for r in saved] == [
      ("Breakout", "dqn", 0, "bbbbbbb", [7.0, 30.0]), ("Breakout", "dqn", 1, "aaaaaaa", [1.0]),
      ("Seaquest", "pqn", 0, "aaaaaaa", [3.0])]
  # Redrawn from the archive alone.
  out.unlink()
  assert len(pm.main(["--archive", str(archive), "--out", str(out)])) == 3
  assert out.stat().st_size > 0


def test_a_failed_archive_write_leaves_the_old_archive(tmp_path, monkeypatch):
  archive = tmp_path / "curves.json"
  pm.write_json(archive, [{"old": 1}])
  def full_disk(fd):
    raise OSError("no space left on device")
  monkeypatch.setattr(pm.os, "fsync", full_disk)
  with pytest.raises(OSError, match="no space"):
    pm.write_json(archive, [{"new": 2}])
  assert json.loads(archive.read_text()) == [{"old": 1}]
  assert [p.name for p in tmp_path.iterdir()] == ["curves.json"]  # no temporary file left


def test_the_table_says_when_the_papers_figure_was_reached(tmp_path):
  run = pm.read_run(_fake_run(tmp_path / "r", "dqn", "MinAtar/Breakout-v1", 0, [5.0, 12.0]))
  miss = pm.read_run(_fake_run(tmp_path / "m", "ppo", "MinAtar/Freeway-v1", 1, [20.0, 30.0]))
  lines = pm.table_lines([run, miss])
  assert lines[2] == ("| Breakout | dqn | 0 | async-process | aaaaaaa | 2,000 | 12.0 | 12.0 "
                      "| 2,000 |")
  assert lines[3].endswith("| 2,000 | 30.0 | 30.0 | not reached (50) |")


def test_no_archive_and_no_runs_is_one_clear_error(tmp_path, capsys):
  with pytest.raises(SystemExit) as exit_info:
    pm.main(["--archive", str(tmp_path / "none.json"), "--out", str(tmp_path / "f.png")])
  assert exit_info.value.code == 2
  assert "name finished runs to start it" in capsys.readouterr().err

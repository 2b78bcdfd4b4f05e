"""scripts/sweep.py: --param specs, the flags a trial's runs get, the objective against a hand
computation from the runs' summary.json, pruning, and a sweep killed with SIGKILL then resumed;
on a stand-in experiment, and once (slow) on experiments/dqn.py."""

import json
import os
import signal
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from helpers import kill_group, load_script

optuna = pytest.importorskip("optuna")

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "sweep.py"
sw = load_script(SCRIPT, "jaxasync_scripts_sweep")


# --- specs and flags ------------------------------------------------------------------------------
def test_param_specs():
  p = sw.parse_param("agent.learning-rate=log:1e-4:3e-3")
  assert (p.name, p.kind, p.low, p.high) == ("agent.learning-rate", "log", 1e-4, 3e-3)
  assert sw.parse_param("agent.tau=float:0.001:0.1").kind == "float"
  p = sw.parse_param("agent.n-step=int:1:5")
  assert (p.kind, p.low, p.high) == ("int", 1, 5) and isinstance(p.low, int)
  p = sw.parse_param("agent.batch-size=choice:64,128,256")
  assert p.choices == (64, 128, 256)
  p = sw.parse_param("agent.dueling=choice:true,false")
  assert p.choices == (True, False)
  assert sw.parse_param("x=choice:adam,3e-4,2").choices == ("adam", 3e-4, 2)


@pytest.mark.parametrize("spec, says", [
    ("agent.learning-rate", "write NAME=KIND:SPEC"),
    ("agent.learning-rate=1e-4:3e-3", "unknown kind '1e-4'"),
    ("agent.lr=gauss:0:1", "unknown kind 'gauss'"),
    ("--agent.lr=log:1e-4:1e-3", "without its dashes"),
    ("agent.lr=log:1e-4", "two bounds, log:LO:HI"),
    ("agent.lr=log:0:1e-3", "log bounds must be above 0"),
    ("agent.lr=float:1:abc", "'abc' in 'agent.lr=float:1:abc' is not a number"),
    ("agent.n-step=int:1:2.5", "is not an integer"),
    ("agent.lr=float:3:1", "LO must be below HI"),
    ("agent.batch-size=choice:64,,128", "distinct comma-separated values"),
    ("agent.batch-size=choice:64,64", "distinct comma-separated values"),
])
def test_bad_param_specs_give_one_error_line(spec, says, capsys):
  with pytest.raises(SystemExit) as e:
    sw.parse_args(["--study", "s.db", "--row", "dqn-cartpole", f"--param={spec}"])
  assert e.value.code == 2
  errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
  assert len(errors) == 1 and says in errors[0] and "argument --param" in errors[0]


def test_a_param_named_twice_is_refused(capsys):
  with pytest.raises(SystemExit):
    sw.parse_args(["--study", "s.db", "--row", "dqn-cartpole", "--param", "a=int:1:2",
                   "--param", "a=int:1:3"])
  assert "a given more than once" in capsys.readouterr().err


def test_a_param_also_in_extra_is_refused(capsys):
  with pytest.raises(SystemExit):
    sw.parse_args(["--study", "s.db", "--row", "dqn-cartpole", "--param",
                   "agent.n-step=int:1:5", "--extra", "--max-opts 100 --agent.n-step 3"])
  assert "--param and --extra both set agent.n-step" in capsys.readouterr().err


def test_the_best_command_carries_the_rows_environment():
  settings = {"row": "dqn-cartpole-2dev", "mode": "sync", "extra": []}
  command = sw.row_command(settings, {"agent.n-step": 3})
  assert command[0].startswith("XLA_FLAGS=") and command[1] == "python"
  assert command[-2:] == ["--agent.n-step", "3"]
  rerun = sw.rerun_command(settings, command, Path("c.json"))
  assert rerun[0].startswith("XLA_FLAGS=") and rerun[1:] == [
      "python", "experiments/dqn.py", "--config", "c.json"]


def test_flags_and_their_order():
  assert sw.flag_words("agent.learning-rate", 0.1 + 0.2) == ["--agent.learning-rate",
                                                             "0.30000000000000004"]
  assert sw.flag_words("agent.dueling", False) == ["--agent.no-dueling"]
  assert sw.flag_words("agent.dueling", True) == ["--agent.dueling"]
  assert sw.flag_words("agent.batch-size", 64) == ["--agent.batch-size", "64"]
  # a subcommand's field follows the subcommand; every other value precedes --extra's words
  extra = ["--max-opts", "100", "agent.loss:q-learning", "--agent.loss.huber", "1"]
  assert sw.run_flags({"agent.loss.num-q-networks": 2, "agent.n-step": 3}, extra) == [
      "--agent.n-step", "3", "--max-opts", "100", "agent.loss:q-learning",
      "--agent.loss.num-q-networks", "2", "--agent.loss.huber", "1"]


def test_missing_optuna_names_the_extra(monkeypatch, tmp_path):
  monkeypatch.setitem(sys.modules, "optuna", None)  # import optuna raises ImportError
  with pytest.raises(SystemExit) as e:
    sw.main(["--report", "--study", str(tmp_path / "s.db")])
  assert e.value.code == 'error: sweeps need Optuna: pip install -e ".[sweep]"'


# --- sweeps on a stand-in experiment --------------------------------------------------------------
# Six evaluations rising to a top that grows with log10(learning rate) (plus the seed), a dip at
# the 4th; held = min(final, last-5 mean) = min(0.9, 0.8) top. FAKE_MODE=prune: a top of 500 in
# trial 0 and 100 after. FAKE_HANG=trialNNNN: that trial's run writes its pid and hangs. Each run
# appends "<trial dir> <seed>" to calls.txt.
FAKE = textwrap.dedent("""
  import json, math, os, sys, time
  def flag(name, default=None):
    return sys.argv[sys.argv.index(name) + 1] if name in sys.argv else default
  seed, logdir = int(flag("--seed")), flag("--logdir")
  trial = next(p for p in logdir.split(os.sep) if p.startswith("trial"))
  here = os.path.dirname(os.path.abspath(__file__))
  with open(os.path.join(here, "calls.txt"), "a") as f:
    f.write(f"{trial} {seed}\\n")
  if os.environ.get("FAKE_HANG") == trial:
    with open(os.path.join(here, "hanging"), "w") as f:
      f.write(str(os.getpid()))
    time.sleep(120)
  top = 100 * (4 + math.log10(float(flag("--agent.learning-rate")))) + seed
  if os.environ.get("FAKE_MODE") == "prune":
    top = 500.0 if trial == "trial0000" else 100.0
  evals = [{"opt_steps": 100 * i, "env_steps": 1000 * i, "wall_s": float(i),
            "eval_reward": top * f} for i, f in enumerate([0.2, 0.6, 1.0, 0.5, 1.0, 0.9], 1)]
  os.makedirs(logdir, exist_ok=True)
  with open(os.path.join(logdir, "summary.json"), "w") as f:
    json.dump({"evals": evals, "env_steps": 6000, "opt_steps": 600, "wall_s": 6.0,
               "interrupted": False}, f)
""")


@pytest.fixture
def fake_row(tmp_path, monkeypatch):
  fake = tmp_path / "fake_experiment.py"
  fake.write_text(FAKE)
  monkeypatch.setitem(sw.bl.ROWS, "fake", sw.bl.Row(str(fake), ("--env-id", "Fake-v0"),
                                                    target=475.0, hold=450.0, default=False))
  return fake


def held_by_hand(summary_path: Path) -> float:
  rewards = [e["eval_reward"] for e in json.loads(summary_path.read_text())["evals"]]
  return min(rewards[-1], sum(rewards[-5:]) / len(rewards[-5:]))


def calls(tmp_path: Path) -> list[str]:
  path = tmp_path / "calls.txt"
  return path.read_text().splitlines() if path.exists() else []


def sweep_argv(tmp_path, *more):
  return ["--row", "fake", "--seeds", "0-1", "--study", str(tmp_path / "sweeps" / "fake.db"),
          "--param", "agent.learning-rate=log:1e-3:1e-1", "--sampler-seed", "0",
          "--extra", "--max-opts 100", *more]


def trials_of(tmp_path):
  study = optuna.load_study(study_name="fake",
                            storage=f"sqlite:///{tmp_path / 'sweeps' / 'fake.db'}")
  return study.get_trials()


def test_sweep_objective_table_best_json_and_report(tmp_path, fake_row, capsys):
  assert sw.main(sweep_argv(tmp_path, "--trials", "3", "--no-prune")) == 0
  trials = trials_of(tmp_path)
  assert [t.state.name for t in trials] == ["COMPLETE"] * 3
  out = tmp_path / "sweeps" / "fake"
  for t in trials:
    dirs = [out / f"trial{t.number:04d}" / "runs" / "fake" / "sync" / f"seed{s}" for s in (0, 1)]
    by_hand = [held_by_hand(d / "summary.json") for d in dirs]
    assert t.value == pytest.approx(statistics.fmean(by_hand))
    assert [r["held"] for r in t.user_attrs["runs"]] == pytest.approx(by_hand)
    assert t.intermediate_values == {0: pytest.approx(by_hand[0])}  # after seed 0 of 2
    lr = t.params["agent.learning-rate"]
    command = t.user_attrs["runs"][0]["command"]
    assert command[2:] == ["--env-id", "Fake-v0", "--mode", "sync", "--seed", "0", "--logdir",
                           str(dirs[0]), "--no-progress", "--overwrite",
                           "--agent.learning-rate", repr(lr), "--max-opts", "100"]
  assert len(calls(tmp_path)) == 6

  best = max(trials, key=lambda t: t.value)
  saved = json.loads((out / "best.json").read_text())
  assert saved["trial"] == best.number and saved["objective"] == best.value
  assert saved["params"] == best.params
  lr = best.params["agent.learning-rate"]
  assert saved["command"] == (f"python {fake_row} --env-id Fake-v0 --mode sync "
                              f"--agent.learning-rate {lr!r} --max-opts 100")
  assert [r["seed"] for r in saved["runs"]] == [0, 1]
  printed = capsys.readouterr().out
  table = (out / "trials.md").read_text()
  assert table in printed and saved["command"] in table
  assert "| trial | state | objective | agent.learning-rate | held seed 0 | held seed 1 |" in table
  r0, r1 = best.user_attrs["runs"]
  assert (f"| {best.number} * | complete | {best.value:.1f} | {lr:.3g} | {r0['held']:.1f} "
          f"| {r1['held']:.1f} |") in table

  # The same command again: the study holds its 3 trials, nothing runs; --report prints it too.
  assert sw.main(sweep_argv(tmp_path, "--trials", "3", "--no-prune")) == 0
  assert len(calls(tmp_path)) == 6
  capsys.readouterr()
  assert sw.main(["--report", "--study", str(tmp_path / "sweeps" / "fake.db")]) == 0
  assert table in capsys.readouterr().out

  # Other settings on a study with finished trials: one error line, nothing runs.
  assert sw.main(sweep_argv(tmp_path, "--trials", "4", "--metric", "auc")) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and err[0].startswith("error: ") and "was run with metric 'held';" in err[0]
  assert len(calls(tmp_path)) == 6


def test_other_metrics(tmp_path, fake_row):
  sw.main(sweep_argv(tmp_path, "--trials", "1", "--metric", "auc"))
  (t,) = trials_of(tmp_path)
  out = tmp_path / "sweeps" / "fake" / "trial0000" / "runs" / "fake" / "sync"
  tops = [json.loads((out / f"seed{s}" / "summary.json").read_text())["evals"][4]["eval_reward"]
          for s in (0, 1)]
  # trapezoids of the fractions 0.2 .6 1 .5 1 .9 over 5 equal steps: (.4+.8+.75+.75+.95)/5 = .73
  assert t.value == pytest.approx(statistics.fmean(0.73 * top for top in tops))


def test_median_pruning_after_a_seed(tmp_path, fake_row, monkeypatch):
  monkeypatch.setenv("FAKE_MODE", "prune")
  sw.main(sweep_argv(tmp_path, "--trials", "3", "--prune-startup-trials", "1"))
  assert [t.state.name for t in trials_of(tmp_path)] == ["COMPLETE", "PRUNED", "PRUNED"]
  # trial 0 on both seeds, the pruned ones on seed 0 only (80 < trial 0's 400 after seed 0)
  assert calls(tmp_path) == ["trial0000 0", "trial0000 1", "trial0001 0", "trial0002 0"]
  assert trials_of(tmp_path)[1].value == pytest.approx(80.0)


def test_a_failed_run_fails_its_trial_and_the_sweep_goes_on(tmp_path, fake_row, capsys):
  # seed 1's run exits 1: its trial fails after seed 0 ran, the next trial still runs
  fake_row.write_text(FAKE.replace("top = 100", "if seed == 1: sys.exit('boom')\ntop = 100", 1))
  assert sw.main(sweep_argv(tmp_path, "--trials", "2")) == 0
  trials = trials_of(tmp_path)
  assert [t.state.name for t in trials] == ["FAIL", "FAIL"]
  assert trials[0].user_attrs["failed"] == "seed 1: exit 1"
  out = capsys.readouterr().out
  assert "boom" in out and "failed (seed 1: exit 1)" in out and "No trial has completed" in out


def test_refused_flags_stop_the_sweep(tmp_path, fake_row, capsys):
  fake_row.write_text("import sys\nsys.exit(2)\n")
  assert sw.main(sweep_argv(tmp_path, "--trials", "3")) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "the experiment refused its flags" in err[0]
  assert len(trials_of(tmp_path)) == 1
  # the refused trial does not count, and other settings may replace the study's
  fake_row.write_text(FAKE)
  assert sw.main(sweep_argv(tmp_path, "--trials", "1", "--metric", "final")) == 0
  assert [t.state.name for t in trials_of(tmp_path)] == ["FAIL", "COMPLETE"]


RUNNER = textwrap.dedent("""
  import importlib.util, sys
  spec = importlib.util.spec_from_file_location("sweep", sys.argv[1])
  sweep = importlib.util.module_from_spec(spec)
  sys.modules["sweep"] = sweep
  spec.loader.exec_module(sweep)
  sweep.bl.ROWS["fake"] = sweep.bl.Row(sys.argv[2], ("--env-id", "Fake-v0"), 475.0, 450.0)
  sys.exit(sweep.main(sys.argv[3:]))
""")


def kill_sweep(proc: subprocess.Popen, run_pid: int | None) -> None:
  """SIGKILL to the sweep, as a crash would; then to the run it left going (its own session)."""
  proc.send_signal(signal.SIGKILL)
  proc.wait(10)
  if run_pid is not None:
    try:
      kill_group(run_pid)
    except ProcessLookupError:
      pass


def wait_for(check, seconds: float, what: str):
  deadline = time.monotonic() + seconds
  while time.monotonic() < deadline:
    value = check()
    if value:
      return value
    time.sleep(0.2)
  raise AssertionError(f"timed out waiting for {what}")


def test_killed_sweep_resumes_keeping_finished_trials(tmp_path, fake_row):
  runner = tmp_path / "runner.py"
  runner.write_text(RUNNER)
  argv = sweep_argv(tmp_path, "--trials", "3", "--no-prune")
  proc = subprocess.Popen([sys.executable, str(runner), str(SCRIPT), str(fake_row), *argv],
                          cwd=ROOT, env={**os.environ, "FAKE_HANG": "trial0001"},
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  try:
    hanging = tmp_path / "hanging"
    wait_for(lambda: hanging.exists() and hanging.read_text(), 120, "trial 1's run")
  finally:
    kill_sweep(proc, int(hanging.read_text()) if hanging.exists() else None)
  before = trials_of(tmp_path)
  assert [t.state.name for t in before] == ["COMPLETE", "RUNNING"]
  assert proc.stdout.read().count("trial 0 (") == 2  # both seeds of trial 0 reported

  assert sw.main(argv) == 0
  after = trials_of(tmp_path)
  assert [t.state.name for t in after] == ["COMPLETE", "FAIL", "COMPLETE", "COMPLETE"]
  assert after[0].value == before[0].value and after[0].params == before[0].params
  assert after[1].user_attrs["interrupted"] == "its sweep was killed"
  assert after[2].user_attrs["retry_of"] == 1 and after[2].params == before[1].params
  # trial 0 ran once; trial 1 began seed 0 and was killed; its rerun (2) and trial 3 ran both
  assert calls(tmp_path) == ["trial0000 0", "trial0000 1", "trial0001 0", "trial0002 0",
                             "trial0002 1", "trial0003 0", "trial0003 1"]
  for t in after[2:]:
    out = tmp_path / "sweeps" / "fake" / f"trial{t.number:04d}" / "runs" / "fake" / "sync"
    assert t.value == pytest.approx(
        statistics.fmean(held_by_hand(out / f"seed{s}" / "summary.json") for s in (0, 1)))
  table = (tmp_path / "sweeps" / "fake" / "trials.md").read_text()
  assert "| 1 | stopped: its sweep was killed | - |" in table
  assert "| 2 | complete, rerun of 1 |" in table or "| 2 * | complete, rerun of 1 |" in table


def test_a_second_sweep_on_a_running_study_is_refused(tmp_path, fake_row, capsys):
  lock = sw.StudyLock(tmp_path / "sweeps" / "fake" / ".lock")
  with lock:
    assert sw.main(sweep_argv(tmp_path, "--trials", "1")) == 2
  assert "another sweep is running this study" in capsys.readouterr().err
  assert calls(tmp_path) == []


# --- the real experiment --------------------------------------------------------------------------
def _children(pid: int) -> list[int]:
  kids = []
  for task in Path(f"/proc/{pid}/task").glob("*"):
    try:
      kids += [int(k) for k in (task / "children").read_text().split()]
    except OSError:
      pass
  return kids


@pytest.mark.slow
def test_dqn_sweep_killed_and_resumed(tmp_path):
  """3 trials of experiments/dqn.py on a tiny budget (~30 s a run here), killed after the first
  finished, resumed to the end."""
  study = tmp_path / "dqn.db"
  argv = [sys.executable, str(SCRIPT), "--row", "dqn-cartpole", "--mode", "sync", "--seeds", "0",
          "--trials", "3", "--study", str(study), "--param", "agent.learning-rate=log:1e-4:1e-3",
          "--extra", "--max-env-steps 1000 --eval-interval 100 --eval-episodes 2"]
  proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  storage = f"sqlite:///{study}"

  def second_started():
    try:
      trials = optuna.load_study(study_name="dqn", storage=storage).get_trials()
    except Exception:  # not created yet
      return False
    return len(trials) == 2 and trials[0].state.name == "COMPLETE" and _children(proc.pid)
  try:
    wait_for(second_started, 300, "trial 0 to finish")
  finally:
    runs = _children(proc.pid)
    kill_sweep(proc, runs[0] if runs else None)
  assert subprocess.run(argv, cwd=ROOT, capture_output=True, timeout=400).returncode == 0
  trials = optuna.load_study(study_name="dqn", storage=storage).get_trials()
  assert [t.state.name for t in trials] == ["COMPLETE", "FAIL", "COMPLETE", "COMPLETE"]
  assert trials[2].params == trials[1].params
  for t in (trials[0], trials[2], trials[3]):
    summary = study.with_suffix("") / f"trial{t.number:04d}/runs/dqn-cartpole/sync/seed0/summary.json"
    assert t.value == pytest.approx(held_by_hand(summary))
  best = json.loads((study.with_suffix("") / "best.json").read_text())
  assert best["command"].startswith("python experiments/dqn.py --mode sync --agent.learning-rate ")
  # The best trial's saved config reruns it: it holds the learning rate the trial drew.
  saved = json.loads(Path(best["config"]).read_text())["settings"]
  assert saved["agent.learning_rate"] == pytest.approx(best["params"]["agent.learning-rate"])
  assert best["rerun"] == f"python experiments/dqn.py --config {best['config']}"

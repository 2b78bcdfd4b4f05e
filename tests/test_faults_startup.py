"""A Ctrl-C while a command starts (JAX imports for seconds, then the run is built) ends in
one line and exit status 130, never a KeyboardInterrupt traceback."""

from __future__ import annotations

import dataclasses
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("command", [["experiments/dqn.py"], ["-m", "jaxasync.train", "dqn"]],
                         ids=["script", "module"])
# (At 1 s Python is importing JAX (about 2 s here; started, Python installs the guard in well
# under a second, even on a loaded machine, where a signal at 0.5 s could come first). Later, while the run is built, a Ctrl-C raises
# KeyboardInterrupt, which run_cli reports in one line; but one that lands inside a garbage
# collector's callback there is printed as "Exception ignored", Python's behaviour: the run
# then stops as its loop starts, the test below.)
@pytest.mark.parametrize("after_s", [1.0], ids=["importing"])
def test_ctrl_c_while_starting_prints_one_line_and_exits_130(command, after_s, tmp_path):
  proc = subprocess.Popen([sys.executable, *command, "--max-opts", "300", "--no-progress",
                           "--eval-interval", "0", "--mode", "sync",
                           "--logdir", str(tmp_path / "run")],
                          cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  time.sleep(after_s)
  proc.send_signal(signal.SIGINT)
  out, err = proc.communicate(timeout=120)
  assert "Traceback" not in err, err
  if "logs and checkpoints in" in out:  # (a slow machine reached training: the loop's stop)
    assert proc.returncode == 0, err
    return
  assert proc.returncode == 130, (proc.returncode, err)
  assert err.strip().splitlines()[-1].startswith("interrupted"), err


def test_a_ctrl_c_swallowed_while_the_run_is_built_stops_the_run_when_it_starts():
  """The case the test above leaves out, made to happen: the KeyboardInterrupt is raised inside
  a finalizer (as inside a garbage collector's callback), where Python only prints it; the
  remembered Ctrl-C stops the run at its start, saving, as the loop's first Ctrl-C does."""
  import jaxasync as ja
  from jaxasync.ledger import early_interrupts_remembered

  class Finalized:
    def __del__(self):
      signal.raise_signal(signal.SIGINT)
      for _ in range(10_000):  # (the Python-level handler runs between these bytecodes)
        pass

  cartpole = ja.EnvFactory("CartPole-v1")
  obs_space, action_space = ja.envs.spaces_of(cartpole)
  previous = signal.getsignal(signal.SIGINT)
  agent = ja.DQN(ja.DQNConfig(hidden_sizes=(16,), batch_size=32,
                              data=ja.ReplayConfig(warmup_period=64)), obs_space, action_space)
  run = ja.RunConfig(max_opts=2000, eval_interval=0, progress=False)
  with early_interrupts_remembered():
    Finalized()  # (freed at once: KeyboardInterrupt inside __del__, printed and ignored)
    summary = ja.Trainer(agent, cartpole, run, ja.ActorsConfig(mode="sync")).train()
    assert summary["interrupted"] is True
    assert summary["opt_steps"] < 100, summary["opt_steps"]
    # Consumed: the next run in this process is not stopped by it.
    summary = ja.Trainer(agent, cartpole, dataclasses.replace(run, max_opts=50),
                         ja.ActorsConfig(mode="sync")).train()
    assert summary["interrupted"] is False and summary["opt_steps"] >= 50
    Finalized()  # remembered again, then forgotten on the way out with the handler
  assert signal.getsignal(signal.SIGINT) is previous
  summary = ja.Trainer(agent, cartpole, dataclasses.replace(run, max_opts=50),
                       ja.ActorsConfig(mode="sync")).train()
  assert summary["interrupted"] is False

"""A Ctrl-C while a command starts (JAX imports for seconds, then the run is built) ends in
one line and exit status 130, never a KeyboardInterrupt traceback."""

from __future__ import annotations

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
# collector's callback there is printed as "Exception ignored" and lost, Python's behaviour,
# so that phase is not asserted here.)
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

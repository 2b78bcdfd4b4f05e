"""The experiments' --help: every flag is described, no rST markup leaks, choices are listed.

tyro draws the help as boxes of options, several side by side on a wide terminal:

  ╭─ options ───────────╮╭─ agent options ─────╮
  │ --seed INT          ││ --agent.torso {a,b} │
  │       seeds envs... ││       network body; │
  ╰─────────────────────╯╰─────────────────────╯

(or, with room, flag and description on one line in two columns). The parser below cuts each
line into the cells between box borders, follows each column of boxes down the page, and
reads options from each box's cells.
"""

from __future__ import annotations

import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import jaxasync as ja
from jaxasync.train import ALGORITHMS, TrainModule

REPO = Path(__file__).resolve().parents[1]
# (experiments/_quiet_start.py is the scripts' Ctrl-C guard, not a script)
SCRIPTS = tuple(sorted(str(p.relative_to(REPO)) for p in (REPO / "experiments").glob("[!_]*.py")))


def train_module(script: str) -> TrainModule:
  """The ``jaxasync.train`` module an ``experiments/<algo>.py`` script runs."""
  return importlib.import_module(f"jaxasync.train.{Path(script).stem}")


# Learning from unrolls, they have no replay flags.
ON_POLICY = tuple(s for s in SCRIPTS if Path(s).stem in ALGORITHMS
                  and isinstance(train_module(s).Args().agent.data, ja.UnrollConfig))
CELL = re.compile(r"│([^│]*)│")  # one box's row: the text between its left and right borders
# Each script's agent flags to look for ("--agent." prefixed but for rainbow.py's).
AGENT_FLAGS = {
    "experiments/dqn.py": ("--agent.noisy-sigma0", "--agent.eps-decay-steps", "--agent.apex-alpha"),
    "experiments/rainbow.py": ("--noisy-sigma0", "--eps-decay-steps", "--apex-alpha"),
    "experiments/sac.py": ("--agent.tau", "--agent.policy-delay", "--agent.target-entropy"),
    "experiments/td3.py": ("--agent.tau", "--agent.policy-delay", "--agent.target-noise-clip"),
    "experiments/impala.py": ("--agent.vtrace-lambda", "--agent.gamma", "--agent.max-policy-lag"),
    "experiments/ppo.py": ("--agent.gae-lambda", "--agent.num-epochs", "--agent.gamma"),
    "experiments/pqn.py": ("--agent.q-lambda", "--agent.num-minibatches", "--agent.eps-decay-steps"),
}
# The replay's and the n-step return's flags (the agent's data: "--agent." prefixed but for
# rainbow.py's), which on-policy scripts do not have (no replay; their agent's own
# --agent.gamma is the discount).
REPLAY_FLAGS = ("gamma", "warmup-period", "n-step", "replay-capacity")
OPTION = re.compile(r"^ (-[-\w.]+)")  # an option's first row: one space of padding, then the flag


def test_every_script_runs_its_train_module_and_every_module_has_a_script():
  """experiments/<algo>.py and jaxasync.train.<algo> come in pairs (both lists are derived:
  SCRIPTS from the directory, ALGORITHMS from the package)."""
  assert sorted(Path(s).stem for s in SCRIPTS) == sorted(ALGORITHMS)
  for script in SCRIPTS:
    algo = Path(script).stem
    assert f"from jaxasync.train.{algo} import cli" in (REPO / script).read_text(), script
    assert isinstance(train_module(script), TrainModule), f"jaxasync.train.{algo}"


def test_on_policy_scripts_are_found():
  assert {Path(s).stem for s in ON_POLICY} >= {"impala", "ppo", "pqn"}
  assert not {Path(s).stem for s in ON_POLICY} & {"dqn", "rainbow", "sac", "td3"}


@pytest.fixture(scope="module")
def helps() -> dict[str, str]:
  """Each script's --help output; both run at once (each takes ~2 s, mostly imports)."""
  env = {**os.environ, "COLUMNS": "200"}
  procs = {s: subprocess.Popen([sys.executable, s, "--help"], cwd=REPO, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
           for s in SCRIPTS}
  out = {}
  for script, proc in procs.items():
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, f"{script} --help failed:\n{stderr[-3000:]}"
    out[script] = re.sub(r"\x1b\[[0-9;]*m", "", stdout)  # colours, should a terminal be faked
  return out


def parse_options(text: str) -> dict[str, tuple[str, str]]:
  """``{first flag: (flags and metavar, description)}`` of every option in tyro's help."""
  columns: dict[int, list[tuple[int, str]]] = {}  # a column's left edge -> its (line, cell)s
  for i, line in enumerate(text.splitlines()):
    for m in CELL.finditer(line):
      columns.setdefault(m.start(), []).append((i, m.group(1)))
  boxes: list[list[str]] = []  # a box's rows: consecutive lines of one column
  for cells in columns.values():
    for k, (i, cell) in enumerate(cells):
      if k == 0 or i != cells[k - 1][0] + 1:  # a border line came between: a new box
        boxes.append([])
      boxes[-1].append(cell)
  options: dict[str, list[str]] = {}
  for rows in boxes:
    is_rule = [set(row.strip()) == {"─"} for row in rows]
    if any(is_rule):  # a group's description comes first, above a rule: no option's text
      rows = rows[is_rule.index(True) + 1:]
    current = None
    for row in rows:
      m = OPTION.match(row)
      if m and current is not None and options[current][0].endswith(","):
        options[current][0] += " " + row.strip()  # --flag, --no-flag wrapped on a narrow screen
      elif m:
        head, _, description = row.strip().partition("  ")  # flags/metavar, 2+ spaces, text
        current = m.group(1)
        assert current not in options, f"option {current} listed twice"
        options[current] = [head.strip(), description.strip()]
      elif current is not None and row.strip():
        options[current][1] += " " + row.strip()
  return {flag: (head, description.strip()) for flag, (head, description) in options.items()}


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_option_is_described(helps, script):
  options = parse_options(helps[script])
  assert len(options) > 50, f"only {len(options)} options parsed from:\n{helps[script]}"
  prefix = "--" if script.endswith("rainbow.py") else "--agent."
  replay_flags = () if script in ON_POLICY else tuple(prefix + f for f in REPLAY_FLAGS)
  for flag in ("--seed", "--max-opts", "--eval-interval", *replay_flags,
               *AGENT_FLAGS.get(script, ()),
               "--max-restarts", "--inference-device"):
    assert flag in options, f"{flag} not found in {script} --help"
  if script in ON_POLICY:
    hidden = {p + f for p in ("--", "--agent.") for f in REPLAY_FLAGS} - {"--agent.gamma"}
    shown = [flag for flag in sorted(hidden) if flag in options]
    assert not shown, f"{script} --help shows replay flags it ignores: {shown}"
  undescribed = [flag for flag, (_, description) in options.items()
                 if not description.rsplit("(default:", 1)[0].strip()]
  assert not undescribed, f"{script} --help: options without a description: {undescribed}"


@pytest.mark.parametrize("script", SCRIPTS)
def test_no_rst_markup(helps, script):
  lines = [line for line in helps[script].splitlines() if "``" in line]
  assert not lines, f"{script} --help shows rST double backquotes:\n" + "\n".join(lines)


@pytest.mark.parametrize("script", SCRIPTS)
def test_string_choices_are_listed(helps, script):
  options = parse_options(helps[script])
  prefix = "--" if script.endswith("rainbow.py") else "--agent."
  expected = {f"{prefix}torso": "{auto,mlp,nature_cnn,minatar_cnn}",
              "--mode": "{auto,sync,thread,process,ray}",
              "--inference-device": "{default,cpu}"}
  if script.endswith(("dqn.py", "rainbow.py")):
    expected[f"{prefix}exploration"] = "{schedule,apex}"
  for flag, choices in expected.items():
    head = options[flag][0]
    assert head == f"{flag} {choices}", f"{script} --help: {head!r}, expected {choices}"


def test_torso_choices_match_the_networks():
  """The CLI's torso choices are 'auto' plus exactly the torsos QNetwork builds."""
  import typing

  import jaxasync as ja
  from jaxasync.networks import TORSOS
  choices = typing.get_args(typing.get_type_hints(ja.DQNConfig)["torso"])
  assert choices == ("auto", *TORSOS)


# Each subcommand's help (a loss, a target update): its own flags, each described (the run's
# are on the main help).
SUBCOMMAND_FLAGS = {
    ("experiments/dqn.py", "agent.loss:categorical"): ("--agent.loss.v-min",
                                                       "--agent.loss.num-atoms"),
    ("experiments/dqn.py", "agent.loss:munchausen"): ("--agent.loss.alpha",
                                                      "--agent.loss.num-q-networks"),
    ("experiments/rainbow.py", "loss:q-learning"): ("--loss.double-q", "--loss.huber-delta"),
    ("experiments/dqn.py", "agent.target-update:hard-copy"): ("--agent.target-update.period",),
    ("experiments/rainbow.py", "target-update:polyak"): ("--target-update.tau",),
}


@pytest.mark.parametrize("script, subcommand", sorted(SUBCOMMAND_FLAGS))
def test_subcommands_describe_their_flags(script, subcommand):
  env = {**os.environ, "COLUMNS": "200"}
  proc = subprocess.run([sys.executable, script, subcommand, "--help"], cwd=REPO, env=env,
                        text=True, capture_output=True, timeout=120)
  assert proc.returncode == 0, f"{script} {subcommand} --help failed:\n{proc.stderr[-3000:]}"
  options = parse_options(re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout))
  for flag in SUBCOMMAND_FLAGS[script, subcommand]:
    assert flag in options, f"{flag} not found in {script} {subcommand} --help"
  undescribed = [flag for flag, (_, description) in options.items()
                 if not description.rsplit("(default:", 1)[0].strip()]
  assert not undescribed, f"{script} {subcommand} --help: undescribed options: {undescribed}"

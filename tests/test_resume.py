"""Resume: a stopped (or killed) run continues from its newest complete checkpoint, replay,
counters, RNG states and, in lock-step, the actor's episodes included."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

import jaxasync as ja
from jaxasync.checkpoint import read_tree_dir, resumable_checkpoints, write_tree_dir
from jaxasync.replay.frames import FrameReplayBuffer, PrioritizedFrameReplayBuffer
from helpers import kill_group
from test_frame_replay import make_env, run_stream

REPO = Path(__file__).resolve().parents[1]
CARTPOLE = ja.EnvFactory("CartPole-v1")


def _trainer(model_dir, max_opts, resume=False, save_interval=200, prioritized=True,
             stop_at=None):
  obs_space, action_space = ja.envs.spaces_of(CARTPOLE)
  agent = ja.DQN(ja.DQNConfig(hidden_sizes=(16,), batch_size=32,
                              data=ja.ReplayConfig(warmup_period=200, replay_capacity=5_000)),
                 obs_space, action_space)
  config = ja.RunConfig(max_opts=max_opts, eval_interval=100, eval_episodes=2,
                        save_interval=save_interval, record_interval=0, progress=False,
                        logdir=str(model_dir), seed=3)
  replay = (ja.PrioritizedReplayBuffer(ja.types.transition_example(obs_space, action_space),
                                       5_000, seed=3) if prioritized else None)
  # A stop requested at ``stop_at`` SGD steps, as a SIGTERM would: the settings (and so the
  # schedules that span max_opts: beta, a learning-rate decay) stay those of the whole run.
  hooks = [ja.Hook(stop_at, lambda loop: loop.ledger.request_stop())] if stop_at else []
  return ja.Trainer(agent, CARTPOLE, config, replay=replay, resume=resume, hooks=hooks)


def _leaves(tree):
  return jax.tree.leaves(jax.device_get(tree))


def _assert_same_run(a: ja.Trainer, b: ja.Trainer):
  for x, y in zip(_leaves(a.learner.state), _leaves(b.learner.state)):  # params, Adam, target
    np.testing.assert_array_equal(x, y)
  sa, sb = a.replay.state_dict(), b.replay.state_dict()
  for key in ("storage", "priorities", "generation"):
    for x, y in zip(np.atleast_1d(sa[key]) if key != "storage" else sa[key],
                    np.atleast_1d(sb[key]) if key != "storage" else sb[key]):
      np.testing.assert_array_equal(x, y)
  assert (sa["next"], sa["size"], sa["rng"]) == (sb["next"], sb["size"], sb["rng"])
  assert a.feed.actor.rng.bit_generator.state == b.feed.actor.rng.bit_generator.state
  assert (a.loop.env_steps, a.loop.inserted) == (b.loop.env_steps, b.loop.inserted)


def test_sync_resume_is_bit_identical_to_an_uninterrupted_run(tmp_path):
  """k SGD steps in one run == k/2, a stop, and k/2 more after resume: params, optimizer
  state, target network, replay contents with priorities, every RNG state, the counters."""
  whole = _trainer(tmp_path / "whole", 400)
  whole.train()
  first = _trainer(tmp_path / "split", 400, stop_at=200)
  assert first.train()["opt_steps"] == 200
  assert (tmp_path / "split" / "final" / "replay" / "state.json").exists()
  meta = json.loads((tmp_path / "split" / "final" / "meta.json").read_text())
  # The replay is saved as far as it is filled (not its capacity of 5,000): that is what the
  # resumed run must continue from exactly.
  arrays = (tmp_path / "split" / "final" / "replay" / "arrays").iterdir()
  assert {np.load(p, mmap_mode="r").shape[0] for p in arrays} == {meta["inserted"]} != {5_000}
  second = _trainer(tmp_path / "split", 400, resume=True)
  summary = second.train()
  assert summary["resumes"] == 1 and summary["opt_steps"] == 400
  _assert_same_run(whole, second)
  # The ledger continued: evaluations before the stop are still there, in order.
  opts = [e["opt_steps"] for e in summary["evals"]]
  assert opts[:2] == [100, 200] and opts == sorted(opts) and opts[-1] == 400
  # So did its clock: wall_s is the stopped attempt's seconds up to its final checkpoint plus
  # this attempt's, and the evaluations' times never go back across the resume.
  assert 0 < summary["attempt_wall_s"] < summary["wall_s"]
  assert summary["wall_s"] - summary["attempt_wall_s"] == pytest.approx(
      meta["ledger"]["wall_s"], abs=1e-3)  # (meta.json: a second state_dict, us later)
  walls = [e["wall_s"] for e in summary["evals"]]
  assert walls == sorted(walls) and walls[2] > meta["ledger"]["wall_s"]


def test_resume_falls_back_past_damaged_checkpoints(tmp_path, caplog):
  _trainer(tmp_path / "run", 300, save_interval=100).train()
  names = [p.name for p in resumable_checkpoints(tmp_path / "run")]
  assert names[:2] == ["final", "300"], names  # newest first; at equal steps final first
  # final: truncated state file; 300: a replay array cut short; 200 is intact.
  state = tmp_path / "run" / "final" / "state.msgpack"
  state.write_bytes(state.read_bytes()[:100])
  npy = sorted((tmp_path / "run" / "300" / "replay" / "arrays").iterdir())[0]
  npy.write_bytes(npy.read_bytes()[:150])
  with caplog.at_level(logging.WARNING):
    trainer = _trainer(tmp_path / "run", 400, resume=True, save_interval=100)
  assert trainer.learner.opt_steps == 200
  text = caplog.text
  assert "final" in text and "300" in text and "trying an older one" in text
  assert "resuming from" in text and str(tmp_path / "run" / "200") in text
  summary = trainer.train()
  assert summary["opt_steps"] == 400 and summary["error"] is None


def test_nothing_to_resume_says_how_to_start(tmp_path):
  with pytest.raises(ja.ConfigError, match="without resuming"):
    _trainer(tmp_path / "empty", 100, resume=True)


def test_a_killed_save_leaves_no_checkpoint_directory(tmp_path, monkeypatch):
  """A save killed before its rename leaves only a hidden temporary directory, which resume
  ignores and the next save of that name removes."""
  ja.save_checkpoint(tmp_path / "100", {"x": np.ones(2)}, {"opt_steps": 100})
  real_replace = os.replace

  def killed(src, dst):
    raise KeyboardInterrupt  # as if the process died here

  monkeypatch.setattr(os, "replace", killed)
  with pytest.raises(KeyboardInterrupt):
    ja.save_checkpoint(tmp_path / "200", {"x": np.ones(2)}, {"opt_steps": 200},
                       source_state={"a": np.arange(3)})
  monkeypatch.setattr(os, "replace", real_replace)
  assert [p.name for p in resumable_checkpoints(tmp_path)] == ["100"]
  assert not (tmp_path / "200").exists()


@pytest.mark.parametrize("cls", [FrameReplayBuffer, PrioritizedFrameReplayBuffer])
def test_frame_replay_round_trips_through_the_checkpoint_format(tmp_path, cls):
  buf, _, _, _ = run_stream(cls, 3)
  if cls is PrioritizedFrameReplayBuffer:
    idx = np.arange(0, buf.capacity, 3)
    buf.update_priorities(idx, np.linspace(0.1, 5.0, len(idx)),
                          buf.state_dict()["generation"][idx])
  write_tree_dir(tmp_path / "replay", buf.state_dict())
  loaded = read_tree_dir(tmp_path / "replay")
  assert isinstance(loaded["rng"], dict)
  env = make_env(3, 4, "reset")  # run_stream's env: 3 sub-envs, stacks of 4 frames
  example = ja.types.transition_example(env.single_observation_space, env.single_action_space)
  other = cls(example, buf.capacity, seed=99)
  other.load_state_dict(loaded)
  a, b = buf.state_dict(), other.state_dict()
  assert a.keys() == b.keys()
  for key in a:
    if isinstance(a[key], np.ndarray):
      np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    else:
      assert a[key] == b[key], key
  x, y = buf.sample(8), other.sample(8)  # same generator state: the same draws
  batch = lambda s: s if isinstance(s, ja.Transition) else s[0]  # (prioritized: + weights...)
  np.testing.assert_array_equal(batch(x).obs, batch(y).obs)


@pytest.mark.slow
def _saved_evals(logdir: Path) -> list[dict]:
  """The evaluations the newest numbered checkpoint under ``logdir`` holds."""
  numbered = [p for p in resumable_checkpoints(logdir) if p.name.isdigit()]
  if not numbered:
    return []
  newest = max(numbered, key=lambda p: int(p.name))
  return json.loads((newest / "meta.json").read_text())["ledger"]["evals"]


def test_async_run_killed_three_times_resumes_and_solves(tmp_path):
  """experiments/dqn.py (process actor) killed with SIGKILL (the whole process group) three
  times at random moments after its first checkpoint, resumed each time, then run to the end:
  it continues from the last checkpoint and still reaches the CartPole target."""
  logdir = tmp_path / "run"
  # (No target for the killed attempts: a lucky run solving before its kill, at 3.3k SGD steps
  # once under CI, would end by itself and leave nothing to kill.)
  base = [sys.executable, "experiments/dqn.py", "--no-progress", "--logdir", str(logdir),
          "--save-interval", "1000", "--seed", "0"]
  rng = np.random.default_rng(0)
  last_steps = -1
  for attempt in range(3):
    cmd = base + (["--resume"] if attempt else [])
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    # Wait for a checkpoint newer than the one this attempt started from, then a random moment.
    while time.monotonic() < deadline:
      found = resumable_checkpoints(logdir) if logdir.exists() else []
      steps = [int(p.name) for p in found if p.name.isdigit()]
      # (The last kill waits for a checkpoint that holds an evaluation: something to keep.)
      if steps and max(steps) > last_steps and (attempt < 2 or _saved_evals(logdir)):
        break
      assert proc.poll() is None, proc.stderr.read()[-2000:]
      time.sleep(0.2)
    time.sleep(rng.uniform(0.5, 3.0))
    # (Its process actor's queues hold named semaphores: none unlinked would mean kill_group
    # no longer finds them, and every SIGKILL test would leave them in /dev/shm again.)
    assert kill_group(proc.pid) > 0, "kill_group unlinked no semaphore of the killed run"
    proc.wait(30)
    last_steps = max(int(p.name) for p in resumable_checkpoints(logdir) if p.name.isdigit())
  # What the newest checkpoint holds is what the resumed run must keep. (An evaluation runs
  # beside training: one still running at a kill is lost with it, as unsaved work is; on a
  # loaded machine every kill can land on one.)
  saved_evals = _saved_evals(logdir)
  assert saved_evals
  out = subprocess.run(base + ["--resume", "--target-eval-reward", "475"], cwd=REPO,
                       capture_output=True, text=True, timeout=400)
  assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
  assert "resuming from" in out.stderr
  summary = json.loads((logdir / "summary.json").read_text())
  assert summary["resumes"] >= 3  # (counted from the checkpoint it resumed from)
  # Learning after three kills: >= 400, not the 475 it stops at, since about one run in five of
  # the default still fails to hold 475 (README 'Learning', Not done); CI saw a best of 458.
  assert summary["best_eval_reward"] >= 400, [e["eval_reward"] for e in summary["evals"]]
  # The evaluations the last checkpoint before the final attempt held were kept, in order.
  assert summary["evals"][:len(saved_evals)] == saved_evals, (saved_evals, summary["evals"][:4])


def test_a_lockstep_actor_state_saved_by_another_version_starts_fresh_episodes():
  # A checkpoint of the version before the collectors moved pickles its collector as
  # jaxasync.step_processor.StepProcessor: that actor state is not continued (restore lists
  # the episodes in progress as not restored) rather than ending the resume.
  import pickle
  import types
  old = types.ModuleType("jaxasync_gone_module")
  class StepProcessor:  # noqa: the old class, by its old module path
    pass
  StepProcessor.__module__ = old.__name__
  StepProcessor.__qualname__ = "StepProcessor"
  old.StepProcessor = StepProcessor
  sys.modules[old.__name__] = old
  try:
    saved = pickle.dumps({"collector": StepProcessor()})
  finally:
    del sys.modules[old.__name__]
  feed = ja.LockstepFeed.__new__(ja.LockstepFeed)  # (the state is read before the actor is used)
  assert feed.load_resume_state(saved) is False
  assert feed.load_resume_state(None) is False

"""Fault injection: killed actors, diverging learners, signals, stuck envs, bad input.

Every test here is bounded in time: a run that would hang fails the test instead.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import signal
import threading
import time
from typing import NamedTuple

import numpy as np
import pytest

import jaxasync as ja

CARTPOLE = ja.EnvFactory("CartPole-v1")


REPLAY_FIELDS = {f.name for f in dataclasses.fields(ja.ReplayConfig)}


class _Settings(NamedTuple):
  run: ja.RunConfig
  data: ja.ReplayConfig  # the agent's replay settings (its config's data)


def _config(**kw) -> _Settings:
  """The run's settings, and the replay's (warmup_period, replay_capacity...) for the agent."""
  base = dict(max_opts=10**9, warmup_period=256, eval_interval=0, record_interval=100,
              updates_per_call=4, progress=False, seed=0, replay_capacity=20_000)
  base.update(kw)
  data = {k: base.pop(k) for k in list(base) if k in REPLAY_FIELDS}
  return _Settings(ja.RunConfig(**base), ja.ReplayConfig(**data))


def _dqn(data: ja.ReplayConfig, **config) -> ja.DQN:
  return ja.DQN(ja.DQNConfig(**{"batch_size": 32, **config}, data=data),
                *ja.envs.spaces_of(CARTPOLE))


def _trainer(env=CARTPOLE, config=None, agent_config=None, **actors_kw):
  obs_space, action_space = ja.envs.spaces_of(CARTPOLE)
  run, data = config or _config()
  # (The replay ratio is the agent's replay's setting.)
  data = dataclasses.replace(data, **{k: actors_kw.pop(k) for k in list(actors_kw)
                                      if k in REPLAY_FIELDS})
  agent_config = dataclasses.replace(agent_config or ja.DQNConfig(batch_size=32), data=data)
  factory = functools.partial(ja.DQN, agent_config, obs_space, action_space)
  base = dict(mode="thread", num_actors=2, num_envs=2, chunk_steps=4,
              sync_interval=8, queue_size=8)
  base.update(actors_kw)
  return ja.Trainer(factory(), env, run, ja.ActorsConfig(**base), recorder=ja.MemoryRecorder(),
                    agent_factory=factory)


def _train_bounded(trainer, limit: float):
  """Runs ``trainer.train()`` in a thread; fails the test if it has not returned in ``limit`` s."""
  out = {}

  def target():
    try:
      out["summary"] = trainer.train()
    except BaseException as e:
      out["error"] = e

  t = threading.Thread(target=target, daemon=True)
  t0 = time.monotonic()
  t.start()
  t.join(limit)
  assert not t.is_alive(), f"train() still running after {limit} s (hung)"
  return out, time.monotonic() - t0


# --- 1: a dead actor cannot corrupt or starve the others' channel --------------------------
def test_killing_process_actors_mid_write_keeps_training():
  """Two process actors pushing ~46 kB chunks (two overfill a 64 KiB pipe buffer, so writes are
  torn by a kill) into a small blocking queue, killed with SIGKILL 6 times: the learner never
  blocks on a torn chunk, restarted actors get channels of their own, and env steps and SGD
  steps keep moving after the last kill (the samples-per-insert limiter makes SGD steps
  depend on fresh chunks). ca43e14's shared multiprocessing queue hung or stalled here."""
  trainer = _trainer(mode="process", num_actors=2, num_envs=8, chunk_steps=120,
                     queue_size=2, max_restarts=100, samples_per_insert=4.0,
                     config=_config(duration=100, warmup_period=2_000))
  marks = {}

  def killer():
    deadline = time.monotonic() + 30
    while trainer.learner.opt_steps == 0 and time.monotonic() < deadline:
      time.sleep(0.05)
    deadline = time.monotonic() + 50  # each restart spawns a process that imports jax
    rng = np.random.default_rng(0)
    kills = 0
    while kills < 6 and time.monotonic() < deadline:
      time.sleep(rng.uniform(0.3, 1.0))
      w = trainer.feed.manager._workers[kills % 2]
      if w is not None and w.is_alive() and trainer.loop.chunks_ingested > marks.get("chunks", 0):
        os.kill(w.pid, signal.SIGKILL)
        kills += 1
        marks["chunks"] = trainer.loop.chunks_ingested
    marks.update(kills=kills, opt=trainer.learner.opt_steps, env=trainer.env_steps)
    # Once actors have restarted and trained on, end the run early (bounded test time).
    deadline = time.monotonic() + 25
    while time.monotonic() < deadline and (trainer.env_steps < marks["env"] + 5_000
                                           or trainer.learner.opt_steps < marks["opt"] + 400):
      time.sleep(0.1)
    trainer.ledger.request_stop()

  k = threading.Thread(target=killer, daemon=True)
  k.start()
  out, wall = _train_bounded(trainer, 140)
  k.join(5)
  assert "error" not in out, out.get("error")
  summary = out["summary"]
  assert marks["kills"] == 6, "restarted actors did not deliver chunks again"
  assert summary["actor_restarts"] >= 6
  assert summary["env_steps"] >= marks["env"] + 5_000, (summary, marks)
  assert summary["opt_steps"] >= marks["opt"] + 400, (summary, marks)
  assert wall < 105
  assert not any(trainer.feed.manager.alive())


# --- 2: NaN stops the run, no NaN checkpoint is written --------------------------------------
def _assert_strict_json(path):
  import json

  def refuse(name):
    raise AssertionError(f"{path} holds {name}: not JSON")
  return json.loads(path.read_text(), parse_constant=refuse)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_nan_stops_the_run_and_writes_no_nan_checkpoint(tmp_path, mode):
  from faulty_envs import NaNDQN
  obs_space, action_space = ja.envs.spaces_of(CARTPOLE)
  # NaN from the 40th update call (SGD step 160); saves every 40 SGD steps before it.
  run, data = _config(max_opts=2_000, duration=60, save_interval=40, eval_interval=40,
                      record_interval=1_000, logdir=str(tmp_path), eval_episodes=2)
  factory = functools.partial(NaNDQN, ja.DQNConfig(batch_size=32, data=data), obs_space,
                              action_space)
  if mode == "sync":
    trainer = ja.Trainer(factory(), CARTPOLE, run)
  else:
    trainer = ja.Trainer(factory(), CARTPOLE, run,
                         ja.ActorsConfig(mode="thread", num_envs=2, chunk_steps=4),
                         agent_factory=factory)
  t0 = time.monotonic()
  with pytest.raises(ja.NonFiniteError, match=r"NaN or infinite .* Lower the learning rate"):
    trainer.train()
  assert time.monotonic() - t0 < 60
  assert trainer.learner.opt_steps <= 400  # stopped at once, not trained to the end
  assert not (tmp_path / "final").exists()
  numbered = sorted(int(p.name) for p in tmp_path.iterdir() if p.name.isdigit())
  assert numbered and max(numbered) < 160 + 40
  for name in [str(n) for n in numbered] + (["best"] if (tmp_path / "best").exists() else []):
    state, _ = ja.restore_checkpoint(tmp_path / name, trainer.learner.state)
    assert ja.faults.all_finite(state), name
  summary = _assert_strict_json(tmp_path / "summary.json")
  assert summary["error"].startswith("NonFiniteError")
  assert summary["interrupted"] is False


def test_nan_priorities_stop_a_prioritized_run():
  obs_space, action_space = ja.envs.spaces_of(CARTPOLE)
  run, data = _config(max_opts=500, duration=60)
  agent = _dqn(data, learning_rate=1e38)
  replay = ja.PrioritizedReplayBuffer(
      ja.types.transition_example(obs_space, action_space), 10_000)
  trainer = ja.Trainer(agent, CARTPOLE, run, replay=replay)
  with pytest.raises(ja.NonFiniteError, match="priorities"):
    trainer.train()
  assert trainer.learner.opt_steps < 100


def test_all_finite():
  import jax.numpy as jnp
  assert ja.faults.all_finite({"a": jnp.ones(3), "b": np.zeros(2, np.int32), "k": 1})
  assert not ja.faults.all_finite({"a": jnp.array([1.0, jnp.nan])})
  assert not ja.faults.all_finite([np.array([np.inf])])


# --- 3: SIGTERM is a stop request; actors never outlive the trainer -------------------------
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _start_dqn(logdir, *flags):
  import subprocess
  import sys
  # Output to a file: orphaned actors holding a stdout pipe would block reading it.
  proc = subprocess.Popen(
      [sys.executable, "experiments/dqn.py", "--logdir", str(logdir), "--no-progress",
       "--max-opts", "1000000", "--eval-interval", "300", *flags],
      cwd=REPO, stdout=open(logdir.parent / "out.txt", "wb"), stderr=subprocess.STDOUT)
  proc.output = lambda: (logdir.parent / "out.txt").read_text()[-3000:]
  deadline = time.monotonic() + 90
  while time.monotonic() < deadline and not (logdir / "best" / "state.msgpack").exists():
    if proc.poll() is not None:
      raise AssertionError(proc.output())
    time.sleep(0.2)
  assert (logdir / "best").exists(), "training never reached its first evaluation"
  return proc


def _children(pid: int) -> list[int]:
  import subprocess
  out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True)
  return [int(x) for x in out.stdout.split()]


def _alive(pid: int) -> bool:
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited
  except FileNotFoundError:
    return False


def _wait_gone(pids, timeout: float) -> list[int]:
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline and any(_alive(p) for p in pids):
    time.sleep(0.1)
  return [p for p in pids if _alive(p)]


def test_sigterm_saves_final_and_summary_and_leaves_no_process(tmp_path):
  logdir = tmp_path / "run"
  proc = _start_dqn(logdir, "--mode", "process", "--num-actors", "2")
  children = _children(proc.pid)  # actors and the resource tracker
  assert len(children) >= 2
  proc.send_signal(signal.SIGTERM)
  proc.wait(timeout=30)
  left = _wait_gone(children, 10)
  for p in left:  # do not leak them into the rest of the test session
    os.kill(p, signal.SIGKILL)
  assert proc.returncode == 0, proc.output()
  assert not left, "processes outlived the run"
  summary = _assert_strict_json(logdir / "summary.json")
  assert summary["interrupted"] is True and summary["opt_steps"] > 0
  assert summary["error"] is None
  assert (logdir / "final" / "state.msgpack").exists()


def test_actors_exit_when_the_trainer_is_killed(tmp_path):
  logdir = tmp_path / "run"
  proc = _start_dqn(logdir, "--mode", "process", "--num-actors", "2")
  children = _children(proc.pid)
  assert len(children) >= 2
  proc.kill()  # SIGKILL: no cleanup runs in the trainer
  proc.wait(timeout=30)
  left = _wait_gone(children, 15)
  for p in left:  # do not leak them into the rest of the test session
    os.kill(p, signal.SIGKILL)
  assert not left, "actor processes (or the resource tracker) outlived a killed trainer"


# --- 4: runs that cannot train fail at once; stalls become warnings, then errors -------------
def test_replay_smaller_than_one_update_call_is_refused():
  agent = _dqn(ja.ReplayConfig(replay_capacity=500, warmup_period=200), batch_size=128)
  config = ja.RunConfig(updates_per_call=4)
  with pytest.raises(ja.ConfigError, match=r"replay capacity 500 is below updates_per_call x "
                     r"batch_size = 4 x 128 = 512.*Raise replay_capacity"):
    ja.Trainer(agent, CARTPOLE, config)


def _stuck_config(**kw):
  return _config(duration=60, stall_warning=1.0, stall_timeout=3.0, warmup_period=200, **kw)


def test_stuck_env_in_sync_mode_becomes_a_stall_error(tmp_path, caplog):
  from faulty_envs import HangingEnvFactory
  run, data = _stuck_config(logdir=str(tmp_path))
  trainer = ja.Trainer(_dqn(data), HangingEnvFactory(steps=20), run, eval_env_factory=CARTPOLE)
  t0 = time.monotonic()
  with caplog.at_level("WARNING", logger="jaxasync"):
    with pytest.raises(ja.StallError, match=r"no progress for \d+ s.*stuck in: env.step"):
      trainer.train()  # the main thread: the watchdog interrupts the stuck env.step
  assert time.monotonic() - t0 < 20
  assert any("no progress" in r.message and "env.step" in r.message for r in caplog.records)
  summary = _assert_strict_json(tmp_path / "summary.json")
  assert summary["error"].startswith("StallError") and summary["warnings"]


def test_stuck_actors_become_a_stall_error_naming_the_stage():
  from faulty_envs import HangingEnvFactory
  trainer = _trainer(env=HangingEnvFactory(steps=10), num_actors=1, config=_stuck_config())
  out, wall = _train_bounded(trainer, 30)
  assert isinstance(out.get("error"), ja.StallError), out
  assert "waiting for the actors' chunks" in str(out["error"])
  assert wall < 20


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_a_short_run_whose_actors_hang_ends_in_a_stall_error(mode):
  """The default stall limits (warn 60 s, fail 300 s) cannot fire in a --duration 6 run: before,
  it ended with error None, as if it had only learnt nothing (issue 30). Now its end names the
  stage it was stuck in. (12 s: a process actor takes ~3.5 s on this machine to spawn, import
  jax and make its 10 steps, and the run must have been still for half its duration.)"""
  from faulty_envs import HangingEnvFactory
  config = _config(duration=12.0, stall_warning=60.0, stall_timeout=300.0)
  trainer = _trainer(env=HangingEnvFactory(steps=10), num_actors=1, mode=mode,
                     config=config)
  out, wall = _train_bounded(trainer, 40)
  assert isinstance(out.get("error"), ja.StallError), out
  message = str(out["error"])
  assert message.startswith("duration=12 s ended a run that made no progress")
  assert "stuck in: waiting for the actors' chunks" in message
  assert wall < 30


def test_a_short_run_that_moves_is_not_a_stall():
  out, _ = _train_bounded(_trainer(config=_config(duration=6.0)), 40)
  assert "error" not in out, out
  assert out["summary"]["env_steps"] > 0


def test_duration_is_honoured_by_a_stuck_sync_run():
  from faulty_envs import HangingEnvFactory
  # No stall limits: only --duration (plus the watchdog's 10 s grace) ends it.
  run, data = _config(duration=2.0, stall_warning=0, stall_timeout=0, warmup_period=200)
  trainer = ja.Trainer(_dqn(data), HangingEnvFactory(steps=20), run, eval_env_factory=CARTPOLE)
  t0 = time.monotonic()
  with pytest.raises(ja.StallError, match="duration=2 s passed"):
    trainer.train()
  assert time.monotonic() - t0 < 20


# --- 5: run directories are never mixed; summaries are strict JSON -------------------------
def _dqn_cli(*flags, timeout=120):
  import subprocess
  import sys
  return subprocess.run([sys.executable, "experiments/dqn.py", "--no-progress", *flags],
                        cwd=REPO, capture_output=True, text=True, timeout=timeout)


def test_logdir_of_another_run_is_refused_unless_overwrite(tmp_path):
  logdir = tmp_path / "run"
  flags = ["--mode", "sync", "--logdir", str(logdir), "--max-opts", "100",
           "--agent.warmup-period", "200", "--eval-interval", "0", "--save-interval", "20",
           "--keep-checkpoints", "2"]
  first = _dqn_cli(*flags)
  assert first.returncode == 0, first.stderr[-2000:]
  assert "best model: none (no evaluation ran)" in first.stdout  # no path that does not exist
  numbered = sorted(p.name for p in logdir.iterdir() if p.name.isdigit())
  assert numbered == ["100", "80"]  # retention: the newest 2
  again = _dqn_cli(*flags)
  assert again.returncode == 2
  assert again.stderr.strip().splitlines()[-1].startswith(
      f"error: logdir={logdir} (--logdir) already holds a run"), again.stderr[-2000:]
  assert "Traceback" not in again.stderr
  events = sorted(p.name for p in logdir.iterdir() if p.name.startswith("events"))
  assert len(events) == 1  # nothing of the refused run was written
  third = _dqn_cli(*flags, "--overwrite")
  assert third.returncode == 0, third.stderr[-2000:]
  events_now = sorted(p.name for p in logdir.iterdir() if p.name.startswith("events"))
  assert len(events_now) == 1 and events_now != events


def test_library_refuses_a_model_dir_with_a_run_and_overwrite_clears_it(tmp_path):
  (tmp_path / "300").mkdir()
  (tmp_path / "summary.json").write_text("{}")
  run, data = _config(logdir=str(tmp_path))
  agent = _dqn(data)
  with pytest.raises(ja.ConfigError, match="already holds a run .*overwrite=True"):
    ja.Trainer(agent, CARTPOLE, run)
  ja.Trainer(agent, CARTPOLE, dataclasses.replace(run, overwrite=True))
  assert not (tmp_path / "300").exists() and not (tmp_path / "summary.json").exists()


def test_bad_logdirs_are_config_errors(tmp_path):
  f = tmp_path / "file"
  f.write_text("x")
  with pytest.raises(ja.ConfigError, match="is a file"):
    ja.claim_run_dir(f)
  with pytest.raises(ja.ConfigError, match="cannot be written"):
    ja.claim_run_dir("/proc/jaxasync-run")  # read-only even for root


def test_stale_temp_files_of_a_killed_save_are_removed(tmp_path):
  (tmp_path / "ckpt").mkdir()
  stale = tmp_path / "ckpt" / ".state.msgpack.abc123.tmp"
  stale.write_bytes(b"half a checkpoint")
  ja.save_checkpoint(tmp_path / "ckpt", {"w": np.ones(3)})
  assert not stale.exists()
  assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["meta.json", "state.msgpack"]


# --- 7: per-chunk bookkeeping is bounded ------------------------------------------------------
def test_chunk_bookkeeping_is_bounded_and_checks_order():
  trainer = _trainer(num_actors=1, config=_config(max_opts=100))
  example = ja.types.transition_example(*ja.envs.spaces_of(CARTPOLE))
  T = ja.Transition(*(np.repeat(np.asarray(x)[None], 4, 0) for x in example[:5]))
  add = lambda version, seq, returns=(): trainer.loop.add_chunk(
      ja.Chunk(0, version, T, 4, returns, seq))
  trainer.learner.opt_steps = 10
  for seq in range(2_000):  # ca43e14 kept one list entry per chunk forever
    add(seq // 100, seq, (1.0,))
  assert trainer.loop.order_errors == 0 and trainer.loop.last_chunk == {0: (19, 1999)}
  # (a running tally, read through what the records read, not a list of every chunk)
  assert trainer.loop._lags.figures() == {
      "policy_lag_min": -9.0, "policy_lag_max": 10.0,
      "policy_lag_mean": sum(10 - s // 100 for s in range(2_000)) / 2_000}
  assert trainer.loop._lags.count == 2_000
  assert trainer.loop._returns == [2_000.0, 2_000]
  add(19, 2_001)  # a lost chunk
  add(18, 2_002)  # a version going back
  add(19, 0)  # a restart starts again from 0
  assert trainer.loop.order_errors == 2
  trainer.feed.transport.close()


# --- 6: bad input is one clear ConfigError, before anything runs ----------------------------
def _dqn_module():
  import dqn  # experiments/dqn.py (experiments/ is on pytest's pythonpath)
  return dqn


@pytest.mark.parametrize("flags, message", [
    # (The library's errors name fields; the script adds each one's flag.)
    (["--agent.learning-rate", "-1e-3"],
     r"learning_rate \(--agent.learning-rate\) must be a finite number > 0, got -0.001"),
    (["--agent.learning-rate", "nan"],
     r"learning_rate \(--agent.learning-rate\) must be a finite number > 0, got nan"),
    (["--eval-episodes", "0"], r"eval_episodes \(--eval-episodes\) must be >= 1, got 0"),
    (["--eval-interval", "-5"], r"eval_interval \(--eval-interval\) must be >= 0 SGD steps"),
    (["--agent.torso", "nature_cnn"], r"torso 'nature_cnn' needs image observations"),
    (["--eval-env-id", "Acrobot-v1"], r"evaluation env \(Acrobot-v1\) has observations \(6,\)"),
    (["--agent.replay-capacity", "500", "--agent.warmup-period", "200"],
     "replay capacity 500 is below"),
])
def test_bad_input_is_a_config_error_at_start(tmp_path, flags, message):
  import tyro
  dqn = _dqn_module()
  args = tyro.cli(dqn.Args, args=["--mode", "sync", "--no-progress", "--logdir",
                                  str(tmp_path / "run"), *flags])
  t0 = time.monotonic()
  with pytest.raises(ja.ConfigError, match=message):
    dqn.main(args)
  assert time.monotonic() - t0 < 30  # at start, not at the first evaluation


def test_process_actors_are_spawned_side_by_side(tmp_path):
  """A spawn returns once its child has read its arguments, which it does after importing
  jax; with arguments larger than a pipe holds (an Atari observation space pickles to
  111 KiB), actors spawned one after another started one after another: 14 Pong actors had
  not all started after 50 s. Here each actor's agent factory, unpickled before its 256 KiB
  env factory, waits until all three actors are unpickling theirs, which only side-by-side
  spawns reach."""
  from faulty_envs import BallastEnvFactory, BarrierAgentFactory
  run, data = _config(max_opts=24, warmup_period=64)
  obs_space, action_space = ja.envs.spaces_of(CARTPOLE)
  factory = BarrierAgentFactory(
      functools.partial(ja.DQN, ja.DQNConfig(batch_size=32, data=data), obs_space, action_space),
      str(tmp_path), n=3)
  trainer = ja.Trainer(factory(), BallastEnvFactory(CARTPOLE), run,
                       ja.ActorsConfig(mode="process", num_actors=3, num_envs=2, chunk_steps=4,
                                       sync_interval=8, queue_size=8, max_restarts=0),
                       recorder=ja.MemoryRecorder(), agent_factory=factory)
  out, _ = _train_bounded(trainer, 200)
  assert "error" not in out, out
  assert out["summary"]["opt_steps"] >= 24
  assert len(list(tmp_path.iterdir())) == 3  # (one file per actor process)


class _DeadProcess:
  exitcode = 1

  def is_alive(self) -> bool:
    return False

  def join(self, timeout=None) -> None:
    pass


class _Running(_DeadProcess):
  exitcode = None

  def is_alive(self) -> bool:
    return True


def _manager_with_a_dead_process_actor(launch):
  from jaxasync.actor_manager import ActorManager
  manager = ActorManager(None, None, [ja.ActorConfig(num_envs=1, chunk_steps=4)],
                         ja.ChunkQueue(4, process=True), None, mode="process", max_restarts=2)
  manager._launch = launch  # (the spawn, stood in for)
  manager._workers[0] = _DeadProcess()
  return manager


def test_a_process_actor_restarts_without_holding_up_the_loop():
  """A restart's spawn returns once the child has imported jax and read its arguments
  (seconds for an Atari actor's): the loop, which calls check, must not wait for it."""
  from jaxasync.actor_manager import actor_process_environ
  release, launched = threading.Event(), []

  def slow_launch(i, worker, channel):
    assert release.wait(60)
    launched.append((i, dict(os.environ)))
    manager._workers[i] = _Running()

  manager = _manager_with_a_dead_process_actor(slow_launch)
  manager.check()  # returns with the spawn under way
  assert manager.restarts == [1] and launched == [] and manager.alive() == [False]
  manager.check()  # the actor being restarted is not taken for another failure
  assert manager.restarts == [1]
  release.set()
  manager._restarting[0].join(60)
  (i, environ), = launched
  assert i == 0 and manager.alive() == [True]
  assert all(environ.get(k) == v for k, v in actor_process_environ().items())  # a child's env
  manager.check()
  assert manager.restarts == [1] and manager._restarting == {}


def test_a_restart_that_cannot_spawn_ends_the_run():
  def failing_launch(i, worker, channel):
    raise OSError("Cannot allocate memory")

  manager = _manager_with_a_dead_process_actor(failing_launch)
  manager.check()
  manager._restarting[0].join(60)
  with pytest.raises(OSError, match="Cannot allocate memory"):
    manager.check()


def test_a_death_and_its_traceback_are_one_failure():
  """A process actor sends its traceback, then exits: one failure, whichever of the two
  check() sees first. Here the child dies between check()'s two looks (its traceback is sent
  as the process is found dead); counted twice, it was restarted twice and the first new
  child orphaned."""
  launched = []

  class DiesAsItIsLookedAt(_DeadProcess):
    def is_alive(self) -> bool:
      manager._errors.put((0, "Traceback ...\nValueError: the env broke"))
      deadline = time.monotonic() + 30
      while manager._errors.empty() and time.monotonic() < deadline:  # (sent before it exits)
        time.sleep(0.01)
      return False

  def launch(i, worker, channel):
    launched.append(i)
    manager._workers[i] = _Running()

  manager = _manager_with_a_dead_process_actor(launch)
  manager._workers[0] = DiesAsItIsLookedAt()
  manager.check()
  manager._restarting[0].join(60)
  manager.check()
  assert manager.restarts == [1] and launched == [0]

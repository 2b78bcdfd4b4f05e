"""Ray actors (``ActorsConfig(mode="ray")``): a local Ray instance through the experiment
script, one that loses its raylet mid-run, and a simulated cluster on this machine (a head
without CPUs and two worker nodes) that loses a worker node mid-run."""

from __future__ import annotations

import functools
import json
import multiprocessing
import os
import pickle
import re
import signal
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import jax
import numpy as np
import pytest
import ray
from ray.cluster_utils import Cluster

import faulty_envs
import jaxasync as ja
from faulty_envs import RaisingEnvFactory
from helpers import mapped_semaphores
from jaxasync import ray_actors

REPO = Path(__file__).resolve().parents[1]
CARTPOLE = ja.EnvFactory("CartPole-v1")


def _ray_processes() -> set[int]:
  """Ray's daemons, and the actor processes Ray actors spawn (multiprocessing's children)."""
  out = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
  return {int(line.split()[0]) for line in out.splitlines()[1:]
          if "raylet" in line or "gcs_server" in line or "spawn_main" in line}


@pytest.mark.slow
def test_experiment_with_ray_actors_on_a_local_instance(tmp_path):
  """``experiments/dqn.py --mode ray`` starts a local Ray instance (token
  authentication on, as Ray sets it), trains, and leaves no Ray process behind (nor the
  actor processes its Ray actors ran)."""
  before = _ray_processes()
  logdir = tmp_path / "run"
  out = subprocess.run([sys.executable, "experiments/dqn.py", "--mode", "ray",
                        "--num-actors", "2", "--max-opts", "3000", "--eval-interval", "0",
                        "--no-progress", "--logdir", str(logdir)],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  summary = json.loads((logdir / "summary.json").read_text())
  assert summary["mode"] == "async-ray" and summary["opt_steps"] == 3000
  assert [a["env_steps"] > 0 for a in summary["actors"]] == [True, True]
  assert summary["actor_restarts"] == 0 and summary["dropped_chunks"] == 0
  deadline = time.monotonic() + 20
  while _ray_processes() - before and time.monotonic() < deadline:
    time.sleep(0.5)
  assert not _ray_processes() - before


def _children(pid: int) -> list[tuple[int, str]]:
  out = subprocess.run(["ps", "-ww", "-eo", "pid,ppid,args"], capture_output=True, text=True).stdout
  rows = [line.split(None, 2) for line in out.splitlines()[1:]]
  return [(int(r[0]), r[2]) for r in rows if len(r) == 3 and int(r[1]) == pid]


# Where Ray keeps each local instance's session and logs (Ray's own rule on Linux).
RAY_SESSIONS = Path(os.environ.get("RAY_TMPDIR") or os.environ.get("TMPDIR") or "/tmp") / "ray"


def _driver_log_tail(sessions_before: set[Path], pid: int, lines: int = 40) -> str:
  """The last lines of the log of the Ray driver ``pid`` in a session started since
  ``sessions_before`` (what Ray's core worker says when it ends a process)."""
  try:
    new = set(RAY_SESSIONS.glob("session_2*")) - sessions_before
    logs = [log for session in new for log in session.glob(f"logs/python-core-driver-*_{pid}.log")]
    if not logs:
      return "(none found)"
    return "".join(logs[0].read_text(errors="replace").splitlines(True)[-lines:])
  except OSError as e:
    return f"(unreadable: {e})"


def _victim(trainer_pid: int, victim: str) -> int | None:
  """The raylet the trainer started, or the dashboard agent that raylet started (what an OOM
  kill takes: the raylet fate-shares with it), once the Ray actor runs; else None."""
  raylet = next((p for p, args in _children(trainer_pid) if "raylet/raylet" in args), None)
  if raylet is None:
    return None
  below = _children(raylet)
  if not any("RayActorWorker" in args for _, args in below):
    return None
  if victim == "raylet":
    return raylet
  return next((p for p, args in below if "DashboardAgent" in args or "dashboard/agent.py" in args),
              None)


@pytest.mark.slow
@pytest.mark.parametrize("victim", ["agent", "raylet"])
def test_a_local_instance_losing_its_raylet_ends_the_run_in_one_line(tmp_path, victim):
  """An agent process of the local instance killed (as the OOM killer would: the raylet
  fate-shares with it and exits), or the raylet itself: the run ends rc 1 with one ``error:``
  line naming the local Ray instance and its raylet, its summary holding the error and its
  final checkpoint saved (Ray's core worker used to end the process at once, rc 1, silent)."""
  before, sessions = _ray_processes(), set(RAY_SESSIONS.glob("session_2*"))
  logdir, out, err = tmp_path / "run", tmp_path / "stdout", tmp_path / "stderr"
  with open(out, "w") as stdout, open(err, "w") as stderr:  # (files: a pipe left unread fills)
    proc = subprocess.Popen(
        [sys.executable, "experiments/dqn.py", "--mode", "ray", "--num-actors", "1",
         "--max-opts", "1000000", "--eval-interval", "0", "--record-interval", "200",
         "--no-progress", "--logdir", str(logdir)],
        cwd=REPO, stdout=stdout, stderr=stderr, text=True, start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
  try:
    # Learning under way (a record line: the actor delivered, the learner publishes params),
    # then the victim, once the Ray actor runs.
    deadline = time.monotonic() + 240
    while (not re.search(r"^\[\d+\] env_steps", out.read_text(), re.M)
           or (pid := _victim(proc.pid, victim)) is None):
      assert proc.poll() is None, err.read_text()[-3000:]
      assert time.monotonic() < deadline, f"no {victim} under {_children(proc.pid)}"
      time.sleep(0.5)
    os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=120)
  finally:
    if proc.poll() is None:
      os.killpg(proc.pid, signal.SIGKILL)  # (a Ray of the trainer's session included)
      proc.wait()
  err = err.read_text()
  errors = [line for line in err.splitlines() if line.startswith("error:")]
  assert proc.returncode == 1 and len(errors) == 1, (
      f"rc {proc.returncode}; stderr:\n{err}\nRay's driver log, last lines:\n"
      + _driver_log_tail(sessions, proc.pid))
  assert re.match(r"error: the local Ray instance failed \((its raylet exited|its node died)",
                  errors[0]), errors[0]
  if victim == "agent":
    assert "dashboard_agent" in errors[0], errors[0]  # (the reason the raylet logged)
  summary = json.loads((logdir / "summary.json").read_text())
  assert "the local Ray instance failed" in summary["error"]
  assert (logdir / "final").is_dir()
  deadline = time.monotonic() + 20
  while _ray_processes() - before and time.monotonic() < deadline:
    time.sleep(0.5)
  assert not _ray_processes() - before


class _Exited:
  """A raylet process that exited with ``code`` (``subprocess.Popen.poll``'s answer)."""

  def __init__(self, code: int):
    self.code = code

  def poll(self) -> int:
    return self.code

  def wait(self, timeout: float) -> int:
    return self.code


class _ExitingWhenWaitedFor:
  """A raylet process that is running until someone waits for it, and then exits with
  ``code``; ``exits=False``: it keeps running (``wait`` times out)."""

  def __init__(self, code: int, exits: bool = True):
    self.code, self.exits, self.waited = code, exits, False

  def poll(self) -> int | None:
    return self.code if self.waited and self.exits else None

  def wait(self, timeout: float) -> int:
    self.waited = True
    if not self.exits:
      raise subprocess.TimeoutExpired("raylet", timeout)
    return self.code


@pytest.mark.parametrize("exits", [True, False])
def test_a_ray_call_failing_as_the_local_raylet_exits_is_reported_as_that_exit(monkeypatch,
                                                                               exits):
  """A Ray call that fails while the raylet is going down (it kills its workers before it
  exits, so the call can fail first) ends the run naming the raylet's exit; a call failing
  while the raylet stays up ends it with the call's own error."""
  config = ja.ActorConfig(num_envs=1, chunk_steps=1, seed=0)
  store = ray_actors.RayParamStore()
  manager = ray_actors.RayActorManager(None, CARTPOLE, [config], ja.ChunkQueue(2), store)
  manager._raylet = _ExitingWhenWaitedFor(0, exits)
  monkeypatch.setattr(ray_actors, "RAYLET_EXIT_GRACE_S", 0.01)
  monkeypatch.setattr(ray_actors, "ray_logs", lambda: "")

  def a_failing_call(timeout):
    raise RuntimeError("a Ray call failed")

  monkeypatch.setattr(manager, "_receive_once", a_failing_call)
  manager._receive()
  expected = (r"the local Ray instance failed \(its raylet exited, exit code 0\).*a Ray call "
              r"failed as it went: RuntimeError: a Ray call failed\.$" if exits
              else "^a Ray call failed$")
  with pytest.raises(ja.ActorFailed if exits else RuntimeError, match=expected) as raised:
    manager.check()
  assert manager._node_gone == exits
  if exits:  # (the failed call's own exception is kept with the error)
    assert isinstance(raised.value.__cause__, RuntimeError)


class _FakeRay:
  """What the receiver calls of Ray, for one actor whose call failed: the GCS says the node
  of this process is ``alive`` or not."""

  class exceptions:
    RayError = type("RayError", (Exception,), {})
    ActorUnavailableError = type("ActorUnavailableError", (Exception,), {})

  def __init__(self, alive: bool):
    self.alive, self.killed = alive, []

  def wait(self, refs, num_returns, timeout):
    return refs[:1], refs[1:]

  def get(self, ref):
    raise self.exceptions.RayError("the actor died")

  def get_runtime_context(self):
    return type("Context", (), {"get_node_id": lambda self: "node-a"})()

  def nodes(self):
    return [{"NodeID": "node-a", "Alive": self.alive}, {"NodeID": "node-b", "Alive": True}]

  def kill(self, handle, no_restart):
    self.killed.append(handle)


def test_an_actor_unavailable_for_a_call_is_sent_the_params_again(monkeypatch):
  """A call that carried params and failed as unavailable (the actor busy or its node slow to
  answer) may not have delivered them: the next call carries them again (a Ray actor's
  process starts with its first params)."""
  config = ja.ActorConfig(num_envs=1, chunk_steps=1, seed=0)
  store = ray_actors.RayParamStore()
  store.publish(ja.ModelInfo(3, {"w": [1.0, 2.0]}))
  manager = ray_actors.RayActorManager(None, CARTPOLE, [config], ja.ChunkQueue(2), store)
  fake = _FakeRay(alive=True)
  fake.get = lambda ref: (_ for _ in ()).throw(fake.exceptions.ActorUnavailableError("busy"))
  monkeypatch.setattr(ray_actors, "import_ray", lambda: fake)
  sent = []
  collect = type("Collect", (), {"remote": staticmethod(lambda v, p: sent.append((v, p)))})
  manager.handles = [type("Handle", (), {"collect": collect})()]
  manager._by_value = True
  manager._call(0)
  assert sent == [(3, {"w": [1.0, 2.0]})]
  manager._calls = ["its call"]
  manager._receive_once(0.01)  # (unavailable: retried after RETRY_DELAY_S)
  manager._retry_at = [0.0]
  manager._call_idle_actors()
  assert sent[1:] == [(3, {"w": [1.0, 2.0]})]


@pytest.mark.parametrize("alive", [True, False])
def test_an_actor_dying_with_the_learners_node_is_not_replaced(monkeypatch, alive):
  """An actor whose call failed is replaced, unless the node of the learner's process is dead
  for Ray's control store (the case of a cluster node, whose raylet the learner did not
  start): then the run ends naming that node, and no actor is spawned or killed."""
  config = ja.ActorConfig(num_envs=1, chunk_steps=1, seed=0)
  store = ray_actors.RayParamStore()
  manager = ray_actors.RayActorManager(None, CARTPOLE, [config], ja.ChunkQueue(2), store,
                                       max_restarts=3)
  fake = _FakeRay(alive)
  monkeypatch.setattr(ray_actors, "import_ray", lambda: fake)
  monkeypatch.setattr(ray_actors, "ray_logs", lambda: "")
  spawned = []
  monkeypatch.setattr(manager, "_spawn", lambda i: spawned.append(i) or f"actor {i}, again")
  manager.handles, manager._calls = ["actor 0"], ["its call"]
  if alive:
    manager._receive_once(0.01)
    assert spawned == [0] and fake.killed == ["actor 0"] and manager.restarts == [1]
    assert manager.handles == ["actor 0, again"]
    return
  receiver = threading.Thread(target=manager._receive, daemon=True)  # (a regression: loops)
  receiver.start()
  receiver.join(10)
  assert not receiver.is_alive(), "the receiver went on after its node died"
  with pytest.raises(ja.ActorFailed, match=r"this machine's Ray node failed \(its node died\)"):
    manager.check()
  assert spawned == [] and fake.killed == [] and manager._node_gone


def test_the_receiver_stops_calling_ray_once_the_local_raylet_exited(monkeypatch):
  """Once the raylet of the local instance exited, the receiver makes no Ray call (one would
  end the process from Ray's core worker): the run fails with ``ActorFailed`` naming it, and
  stopping kills no actor."""
  config = ja.ActorConfig(num_envs=1, chunk_steps=1, seed=0)
  store = ray_actors.RayParamStore()
  store.publish(ja.ModelInfo(0, {"w": 0}))
  manager = ray_actors.RayActorManager(None, CARTPOLE, [config], ja.ChunkQueue(2), store)
  manager._raylet, manager.handles = _Exited(-9), ["a handle of a dead actor"]
  ray_calls = []  # (recorded, not raised: the receiver reports what it catches as the loss)
  monkeypatch.setattr(ray_actors, "import_ray", lambda: ray_calls.append("import_ray"))
  monkeypatch.setattr(ray_actors, "ray_logs", lambda: "/tmp/ray/logs")
  manager._receive()
  with pytest.raises(ja.ActorFailed, match=r"the local Ray instance failed \(its raylet "
                     r"exited, killed by signal 9\).*--resume.*/tmp/ray/logs"):
    manager.check()
  assert ray_calls == []
  manager.stop_and_join()
  assert ray_calls == [] and manager.handles == ["a handle of a dead actor"]  # (not killed)


def test_stopping_after_the_local_raylet_exited_makes_no_ray_call(monkeypatch):
  """The raylet of the local instance exits after the receiver's last look: stopping makes no
  Ray call (no ``close``, no kill: one would end the process from Ray's core worker), and
  ``check`` then names the lost instance."""
  config = ja.ActorConfig(num_envs=1, chunk_steps=1, seed=0)
  manager = ray_actors.RayActorManager(None, CARTPOLE, [config], ja.ChunkQueue(2),
                                       ray_actors.RayParamStore())
  manager._raylet, manager.handles = _Exited(-9), ["a handle of a live actor"]
  ray_calls = []
  monkeypatch.setattr(ray_actors, "import_ray", lambda: ray_calls.append("import_ray"))
  monkeypatch.setattr(ray_actors, "ray_logs", lambda: "")
  manager.stop_and_join()
  assert ray_calls == [] and manager.handles == ["a handle of a live actor"]
  with pytest.raises(ja.ActorFailed, match=r"the local Ray instance failed \(its raylet "
                     r"exited, killed by signal 9\)"):
    manager.check()


def test_the_raylet_exit_reason_is_read_from_its_log(tmp_path):
  (tmp_path / "raylet.out").write_text(
      'main.cc:481: Raylet graceful shutdown triggered with death info: reason: '
      'UNEXPECTED_TERMINATION\nreason_message: "dashboard_agent failed and raylet fate-shares '
      'with it."\n')
  assert (ray_actors.raylet_exit_reason(str(tmp_path))
          == "dashboard_agent failed and raylet fate-shares with it")
  assert ray_actors.raylet_exit_reason(str(tmp_path / "missing")) == ""


@pytest.fixture(scope="module")
def cluster():
  """A head node without CPUs (actors never land on it) and two worker nodes of 2 CPUs."""
  cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
  workers = [cluster.add_node(num_cpus=2) for _ in range(2)]
  ray.init(address=cluster.address)
  cluster.wait_for_nodes()
  # The test's env modules are not installed on the "nodes": ship them by value, as a user
  # would with runtime_env py_modules.
  ray.cloudpickle.register_pickle_by_value(faulty_envs)
  yield cluster, workers
  ray.shutdown()
  cluster.shutdown()


def _trainer(env, config, hooks=(), data=None, **actors_kw) -> ja.Trainer:
  """``data``: the agent's replay settings (``ReplayConfig`` fields) beside the replay ratio."""
  obs_space, action_space = ja.envs.spaces_of(CARTPOLE)
  agent_config = ja.DQNConfig(data=ja.ReplayConfig(samples_per_insert=64.0, **(data or {})))
  factory = functools.partial(ja.DQN, agent_config, obs_space, action_space)
  ac = ja.ActorsConfig(mode="ray", num_envs=4, sync_interval=10, **actors_kw)
  return ja.Trainer(factory(), env, config, ac, agent_factory=factory,
                    eval_env_factory=CARTPOLE, hooks=hooks)


@pytest.mark.slow
def test_ray_actors_learn_cartpole_while_a_worker_node_is_removed(cluster):
  """Two Ray actors, spread over the two worker nodes; at SGD step 2000 the node of actor 0
  is removed. Training goes on, the actor comes back on the other node (one restart,
  counted), no chunk arrives twice or out of order, and the run solves CartPole."""
  cluster, workers = cluster
  events: dict = {}

  def remove_a_node(loop):
    if "removed" in events:
      return
    nodes = loop.feed.manager.node_ids()
    events["nodes_before"] = nodes
    victim = next(w for w in workers if w.node_id == nodes[0])
    cluster.remove_node(victim)
    events["removed"] = victim.node_id

  def where_after_then_stop_when_solved(loop):
    # Ray notices a lost node after its health checks time out: wait for the restart before
    # asking where the actors run, and do not let the run stop (solved) before that.
    if "removed" in events and "nodes_after" not in events and loop.feed.manager.restarts[0]:
      events["nodes_after"] = loop.feed.manager.node_ids()
    if "nodes_after" in events and loop.ledger.best_eval_reward >= 475:
      loop.ledger.request_stop()

  config = ja.RunConfig(max_opts=50_000, progress=False, seed=0)
  trainer = _trainer(CARTPOLE, config, num_actors=2,
                     hooks=[ja.Hook(2000, remove_a_node),
                            ja.Hook(250, where_after_then_stop_when_solved)])
  summary = trainer.train()
  assert len(set(events["nodes_before"])) == 2  # SPREAD: one actor per worker node
  assert "nodes_after" in events, f"no restart seen in {summary['opt_steps']} SGD steps"
  survivor = next(w.node_id for w in workers if w.node_id != events["removed"])
  assert events["nodes_after"] == [survivor, survivor]
  assert summary["actor_restarts"] == 1
  assert [s.restarts for s in trainer.actor_stats] == [1, 0]
  assert trainer.loop.order_errors == 0  # a chunk delivered twice would repeat its seq
  # Every env step ingested was delivered once; what was delivered and not ingested is at most
  # the bounded queue's chunks left at the stop.
  delivered = sum(s.env_steps for s in trainer.actor_stats)
  ac = trainer.actors
  assert 0 <= delivered - trainer.loop.env_steps <= ac.queue_size * ac.chunk_steps * ac.num_envs
  assert summary["best_eval_reward"] >= 475, [round(e["eval_reward"]) for e in summary["evals"]]


@pytest.mark.slow
def test_a_failing_env_restarts_the_ray_actor_then_fails_the_run(cluster):
  before = {t.ident for t in threading.enumerate()}
  config = ja.RunConfig(max_opts=100_000, eval_interval=0, progress=False, duration=120)
  trainer = _trainer(RaisingEnvFactory(steps=5), config, data=dict(warmup_period=200),
                     num_actors=1, max_restarts=2)
  with pytest.raises(ja.ActorFailed, match="env exploded on purpose"):
    trainer.train()
  assert trainer.feed.manager.restarts == [2]
  assert trainer.feed.manager.handles == []  # killed
  assert {t.ident for t in threading.enumerate()} <= before | {None}


def test_missing_ray_is_a_config_error_naming_the_extra(monkeypatch):
  monkeypatch.setitem(sys.modules, "ray", None)  # import ray raises ImportError
  config = ja.RunConfig(max_opts=10, progress=False)
  with pytest.raises(ja.ConfigError, match=r"pip install 'jaxasync\[ray\]'"):
    _trainer(CARTPOLE, config)


@pytest.mark.parametrize("settings", [dict(inference_servers=1), dict(pin_cpus=True),
                                      dict(ray_chunks_ahead=0), dict(ray_gather_s=-0.1)])
def test_settings_that_do_not_apply_to_ray_actors_are_refused(settings):
  with pytest.raises(ja.ConfigError, match="ray|Ray"):
    ja.ActorsConfig(mode="ray", **settings).validate()


def _worker(env_factory, actor_id: int = 2) -> ray_actors.RayActorWorker:
  """A Ray actor's body, built in this process (as Ray would build it in a worker)."""
  obs_space, action_space = ja.envs.spaces_of(CARTPOLE)
  factory = functools.partial(ja.DQN, ja.DQNConfig(), obs_space, action_space)
  config = ja.ActorConfig(num_envs=2, chunk_steps=4, seed=7, num_actors=3)
  return ray_actors.RayActorWorker(actor_id, factory, env_factory, config, env_steps=40,
                                   max_chunks=2)


def _params():
  obs_space, action_space = ja.envs.spaces_of(CARTPOLE)
  agent = ja.DQN(ja.DQNConfig(), obs_space, action_space)
  return jax.device_get(agent.policy_params(agent.init(jax.random.PRNGKey(0))))


@pytest.fixture
def ray_actor_environ(monkeypatch):
  """The environment Ray gives its actors' workers (their children inherit it)."""
  for k, v in ray_actors.ACTOR_ENV_VARS.items():
    monkeypatch.setenv(k, v)


def test_a_ray_actor_steps_in_a_child_process_and_returns_its_chunks_in_order(ray_actor_environ):
  """The Ray actor's body starts its actor process with the first params, and a call returns
  1 to ``max_chunks`` chunks of that actor (its id kept), in order, acted on those params,
  and with ``gather_s`` waits for more; ``close`` stops the child, which exits by itself
  (code 0, not terminated). A call before any params is refused."""
  worker = _worker(CARTPOLE)
  try:
    first = _collect_some(worker, 5, _params())
    later = _collect_some(worker, 5, None)
    assert worker.process.pid != os.getpid() and worker.process.is_alive()
    chunks = first + later
    assert 1 <= len(first) <= 2 and 1 <= len(later) <= 2
    assert {c.actor_id for c in chunks} == {2} and {c.version for c in chunks} == {5}
    assert [c.seq for c in chunks] == list(range(chunks[0].seq, chunks[0].seq + len(chunks)))
    assert all(c.env_steps == 2 * 4 for c in chunks)
    assert worker.shared.env_steps[2] >= 40 + 8 * len(chunks)  # (counted on from a restart's)
    worker.gather_s = 1.0  # (a chunk of 8 env steps comes in milliseconds: the call fills up)
    assert len(worker.collect(5, None)) == 2
  finally:
    worker.close()
  assert not worker.process.is_alive() and worker.process.exitcode == 0
  with pytest.raises(RuntimeError, match="before it was sent params"):
    _worker(CARTPOLE).collect(-1, None)  # (no child is started)


@pytest.mark.skipif(not os.path.isdir(f"/proc/{os.getpid()}"), reason="Linux's /proc")
def test_a_ray_actor_makes_no_named_semaphore(ray_actor_environ):
  """A Ray actor's body and its child open no named semaphore: ``ray.kill`` ends the Ray
  actor's process without its finalizers, and Ray kills its resource tracker with it, so
  any (an errors ``multiprocessing.Queue`` opened three) outlived every run in /dev/shm."""
  before = mapped_semaphores(os.getpid())
  worker = _worker(CARTPOLE)
  try:
    _collect_some(worker, 0, _params())
    assert mapped_semaphores(os.getpid()) - before == set()
    assert mapped_semaphores(worker.process.pid) == set()
  finally:
    worker.close()


def test_the_error_pipe_reads_a_report_whole_and_a_cut_one_as_none():
  """A child's report is read whole (a long traceback's end); one cut short (a child killed
  while writing it, its end then closed) reads as no report, at once, not as a wait for the
  rest."""
  pipe = ray_actors.ErrorPipe(multiprocessing.get_context("spawn"))
  assert pipe.report() is None
  pipe.put((2, "Traceback: boom"))
  assert pipe.report() == (2, "Traceback: boom")
  pipe.put((2, "x" * 100_000 + "the end"))  # (more than a pipe holds: cut, not blocking)
  actor_id, text = pipe.report()
  assert actor_id == 2 and len(text) == pipe.MAX_TRACEBACK_CHARS and text.endswith("the end")
  writer = pipe._writer
  os.write(writer.fileno(), struct.pack("!i", 100) + b"abc")  # (a header for 100 bytes, 3 sent)
  pipe.child_started()  # (the only writer left was the child's: it is gone)
  read = []
  reader = threading.Thread(target=lambda: read.append(pipe.report(5.0)), daemon=True)
  reader.start()
  reader.join(2.0)
  assert read == [None]  # (a wait for the other 97 bytes would leave it empty)


def _collect_some(worker, version, params, timeout: float = 120.0) -> list:
  """The chunks of the first call that returns some (as the learner's receiver unpickles
  them); a call returns none while the child starts."""
  deadline = time.monotonic() + timeout
  while time.monotonic() < deadline:
    chunks = [pickle.loads(frame) for frame in worker.collect(version, params)]
    if chunks:
      return chunks
    params = None  # (sent once, as the manager does)
  raise AssertionError(f"no chunk in {timeout} s")


def test_a_ray_actor_with_no_chunk_returns_none_and_is_closed_bounded(ray_actor_environ):
  """An actor whose env hangs in ``step``: a call returns no chunk after about
  ``FIRST_CHUNK_WAIT_S`` (so ``close``, queued behind it in the Ray actor, is not held up),
  and ``close`` terminates the stuck child after its timeout."""
  worker = _worker(faulty_envs.HangingEnvFactory(steps=20))
  try:
    _collect_some(worker, 0, _params())  # (the chunks before its env hangs)
    while True:
      started = time.monotonic()
      chunks = worker.collect(0, None)
      if not chunks:
        break
    assert time.monotonic() - started < ray_actors.FIRST_CHUNK_WAIT_S + 5.0  # (not held)
    started = time.monotonic()
    worker.close(timeout=1.0)
    assert time.monotonic() - started < 1.0 + 5.0
    assert not worker.process.is_alive() and worker.process.exitcode == -signal.SIGTERM
  finally:
    if worker.process.is_alive():
      worker.process.kill()


def _collect_until_it_raises(worker, params) -> None:
  while True:
    worker.collect(0, params)
    params = None


def test_a_ray_actor_reports_its_env_failing_and_its_process_dying(ray_actor_environ):
  """An env that raises, or factories that cannot be loaded in the actor's process: a call
  raises with that traceback. An actor process killed: a call raises naming its exit code
  (Ray's receiver then replaces the actor)."""
  worker = _worker(RaisingEnvFactory(steps=5))
  with pytest.raises(RuntimeError, match="env exploded on purpose"):
    _collect_until_it_raises(worker, _params())
  worker.process.join(10)

  worker = _worker(faulty_envs.UnloadableEnvFactory())
  with pytest.raises(RuntimeError, match="cannot be loaded on purpose"):
    _collect_until_it_raises(worker, _params())
  worker.process.join(10)

  worker = _worker(CARTPOLE)
  worker.collect(0, _params())
  worker.process.kill()
  with pytest.raises(RuntimeError, match=r"actor process exited with code -9 without a traceback"):
    _collect_until_it_raises(worker, None)


@pytest.mark.slow
def test_throughput_harness_measures_ray_actors_on_a_simulated_cluster(tmp_path):
  """``scripts/bench_throughput.py``'s cluster variants: each starts a cluster (a head without
  CPUs, one or two worker nodes), measures two Ray actors training on its worker nodes (one
  node, then one actor on each of two; none on the learner's), and shuts it down; the two
  ratios are written, and no Ray daemon or actor process is left behind."""
  before = _ray_processes()
  out_json = tmp_path / "bench.json"
  out = subprocess.run(
      [sys.executable, "scripts/bench_throughput.py", "--variants", "ray", "ray_1node",
       "ray_2nodes", "--num-actors", "2", "--repeats", "1", "--duration", "2", "--warmup", "0.5",
       "--solve-seeds", "0", "--json", str(out_json)],
      cwd=REPO, capture_output=True, text=True, timeout=400)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  result = json.loads(out_json.read_text())
  for variant in ("ray", "ray_1node", "ray_2nodes"):
    assert result["medians"][variant]["env_steps_per_sec"] > 0, variant
    assert result["medians"][variant]["opt_steps_per_sec"] > 0, variant
  for variant, nodes in (("ray_1node", 1), ("ray_2nodes", 2)):
    assert result["medians"][variant]["actor_nodes"] == nodes, variant
    assert result["medians"][variant]["actors_on_learner_node"] == 0, variant
  med = {v: result["medians"][v]["env_steps_per_sec"] for v in ("ray", "ray_1node", "ray_2nodes")}
  assert result["ratios"]["ray_1node_over_ray"] == pytest.approx(med["ray_1node"] / med["ray"])
  assert result["ratios"]["ray_2nodes_over_1node"] == pytest.approx(
      med["ray_2nodes"] / med["ray_1node"])
  assert "simulated Ray cluster (2 actor(s))" in out.stdout
  deadline = time.monotonic() + 20
  while _ray_processes() - before and time.monotonic() < deadline:
    time.sleep(0.5)
  assert not _ray_processes() - before


class _PutCountingRay:
  def __init__(self):
    self.puts = []

  def put(self, value):
    self.puts.append(value)
    return f"ref {len(self.puts)}"


def test_params_go_by_value_below_the_inline_size_and_are_put_once_per_version_above(
    monkeypatch):
  """On a cluster (``ref()`` without ``by_value``): params up to ``INLINE_PARAMS_BYTES`` are
  the call's argument itself (no ``ray.put``); larger ones are put once per published
  version, and each call of that version carries the same reference. With ``by_value`` (the
  local instance) even large params go by value."""
  fake = _PutCountingRay()
  monkeypatch.setattr(ray_actors, "import_ray", lambda: fake)
  store = ray_actors.RayParamStore()
  assert store.ref() == (-1, None)
  small = {"w": np.zeros(ray_actors.INLINE_PARAMS_BYTES // 4, np.float32)}  # exactly the limit
  store.publish(ja.ModelInfo(1, small))
  version, params = store.ref()
  assert version == 1 and params is small and fake.puts == []
  large = {"w": np.zeros(ray_actors.INLINE_PARAMS_BYTES // 4, np.float32),
           "b": np.zeros(1, np.float32)}  # 4 bytes over
  store.publish(ja.ModelInfo(2, large))
  assert store.ref() == (2, "ref 1") and store.ref() == (2, "ref 1")
  assert len(fake.puts) == 1 and fake.puts[0] is large
  version, params = store.ref(by_value=True)
  assert version == 2 and params is large and len(fake.puts) == 1
  store.publish(ja.ModelInfo(3, large))
  assert store.ref() == (3, "ref 2") and len(fake.puts) == 2

"""Throughput of jaxasync's pieces and arrangements, measured in one invocation.

Each figure is measured for --duration wall seconds after a warm-up (jit compilation and
actor start-up excluded), --repeats times, variants interleaved (repeat 1 of every
variant, then repeat 2, ...) so that drift in the machine's load hits them alike; medians
are reported. On a shared machine single figures move 20-30 % between runs: compare the
ratios, which are measured in the same invocation.

Variants (--variants picks a subset):
  actor    (a) one actor exactly as jaxasync runs it: `jaxasync.actor.run_actor` in a thread,
           a ThreadParamStore published once, a ChunkQueue drained (and discarded) by a
           consumer thread; env-steps/s from the actor's own counter sampled at two times.
           Also "bare": the same vector env + `agent.act` (DQN: jitted greedy + numpy epsilon)
           in a plain loop, no collector, chunks or queue. Reported: actor / bare. With
           'sync' among the variants and --sync-num-envs != --envs-per-actor, also
           "actor_sync" (a'): the same actor with the lock-step actor's sub-envs, so that the
           sync loop's ideal rate, 1 / (1/(a') + 1/(b)), is taken at the env count it steps
           (one act per vector step: 4 sub-envs step at about half of 8's env steps/s).
  learner  (b) `jaxasync.Learner` on a pre-filled ReplayBuffer (sample + update calls of
           --updates-per-call steps), opt-steps/s. Also "pure": the jitted `DQN.update` alone
           on one device-resident batch reused (one call in flight, as the Learner does).
           Reported: learner / pure.
  sync     (c) `jaxasync.Trainer` with its lock-step actor (ActorsConfig(mode="sync")),
           max_opts=10**9, eval_interval=0.
  thread   (d) `jaxasync.Trainer` with thread actors (ActorsConfig(mode="thread")).
  process  (e) `jaxasync.Trainer` with process actors (spawn; ActorsConfig(mode="process",
           pin_cpus=False)), placed by the OS.
  pinned   (e') the same with pin_cpus=True (learner on the first usable core, actors on the
           others).
  default  (e'') the same with pin_cpus='auto', the default (jaxasync.placement: pinned when
           the learner and the actors fill the usable cores, one each, and no other jaxasync
           run holds them).
  ray      (f) the same with Ray actors (a local Ray instance, started once: not timed). Also
           "ray_actor": one Ray actor alone, its chunks pulled as fast as they come (a
           RayActorManager into a ChunkQueue read in a loop), against (a): per-chunk overhead = 1 / its chunks/s
           - 1 / (a)'s chunks/s. Not in the default --variants (it needs Ray:
           pip install 'jaxasync[ray]').
  ray_1node, ray_2nodes
           (f') the same Ray actors on a cluster simulated on this machine (ray.cluster_utils,
           started afresh for each measurement: not timed): a head node without CPUs, which
           the learner's process joins, and 1 or 2 worker nodes sharing --num-actors CPUs
           (SPREAD puts the actors on different nodes; ray_2nodes needs --num-actors >= 2).
           Each node has its own raylet and object store, so params go out as on a real
           cluster: over 100 KB with one ray.put per publication, pulled once by each node;
           smaller, inside the calls, as on the local instance jaxasync starts. Chunks come
           back inside the calls' replies either way, up to Ray's inline limit (100 KB on a
           cluster: a DQN CartPole call's chunks are less; above it, through the object store). Reported: ray_1node /
           ray (what running on a cluster costs) and ray_2nodes / ray_1node (what one more
           node adds; on a machine whose cores the nodes share, its daemons' cost rather
           than cores), and per figure the nodes the actors ran on.
For (c)-(e'') the trainers are `jaxasync.Trainer(agent, env, run, actors, recorder,
agent_factory=...)` (RunConfig, ActorsConfig; the agent's own data pipeline), with a recorder that
timestamps every record (one per 100 opt steps) and snapshots the counters and stage timers.
The first record comes after the first update call, i.e. once actors have delivered the
warm-up transitions and the update is compiled; rates are taken from the records between
first + --warmup and first + --warmup + --duration (the summary's own rates divide by a wall
time that includes actor start-up, a spawned process needs 2-4 s to import jax; they are kept
in the JSON as summary_*). Overlap efficiency = env-steps/s / (a) + opt-steps/s / (b): a
sync loop is at most 1.0, two fully used cores 2.0 (sync's also over (a'):
'sync_own_actor'). Env steps rather than inserted
transitions, so that numerator and (a) count the same thing (the two differ by gymnasium's
autoreset steps, one per episode). The table's time fractions are the learner thread's, over the
same window, from the trainers' stage timers ("other" = the rest: loop, records, acting in sync).
In sync, "update" is the Learner's dispatch plus its wait on the previous call; the loop's copy of
the params for acting, after every call, waits for the update, so part of it lands in "other".

  (h) with --learner-devices 1 2 4: the Learner of (b) (DQN, replay-fed) with its update split
      over that many devices (jaxasync.sharding), measured with the 'learner' variant, each
      count interleaved with the others; SGD steps/s, samples/s (SGD steps/s x batch) and the
      ratio to 1 device. The batch is global (each device takes batch / N): raise
      --batch-size to give the devices work. Without an accelerator the script splits the CPU
      into max(N) devices (XLA_FLAGS, set before JAX starts): that checks the path and its
      overhead, not a speed-up (they share the same cores).
  (g) with --solve-seeds N > 0: time to reach an evaluation >= --solve-reward (eval every
      1000 opt steps) for sync and for the async variant with the best overlap efficiency,
      one run per seed 0..N-1; env steps and wall seconds.

Run (from the repository root):
  python scripts/bench_throughput.py --json /tmp/bench.json        # everything, ~5 min on 2 cores
  python scripts/bench_throughput.py --variants actor learner --repeats 1 --duration 4
  python scripts/bench_throughput.py --variants sync pinned --solve-seeds 0 --num-actors 2
  python scripts/bench_throughput.py --agent impala --variants actor process --solve-seeds 0
  python scripts/bench_throughput.py --variants learner --learner-devices 1 2 4 --batch-size 1024
  python scripts/bench_throughput.py --variants actor ray ray_1node ray_2nodes --num-actors 2 --solve-seeds 0

With --agent impala (experiments/impala.py's agent and actors: unrolls through the queue,
params published after every SGD step) the replay measurements (b) are skipped, and each
trainer's ratio column is its env-steps/s over (a)'s: how much of an actor's own pace the
actor keeps beside the learner (the issue's >= 0.85 for on-policy agents).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import platform
import queue
import statistics
import sys
import threading
import time
import warnings
from typing import Literal


def _split_the_cpu_for(argv: list[str]) -> None:
  """(h) on a machine without an accelerator: XLA's CPU platform shows max(--learner-devices)
  devices. XLA_FLAGS is read once, when JAX starts, so this runs before ``import jax``."""
  if "--learner-devices" not in argv or "xla_force_host_platform_device_count" in os.environ.get(
      "XLA_FLAGS", ""):
    return
  counts = []
  for token in argv[argv.index("--learner-devices") + 1:]:
    if not token.isdigit():
      break
    counts.append(int(token))
  if counts:
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + f" --xla_force_host_platform_device_count={max(counts)}")


_split_the_cpu_for(sys.argv)

import jax  # noqa: E402 (after XLA_FLAGS)
import numpy as np
import tyro

import jaxasync as ja
from jaxasync.actor import ActorShared, run_actor
from jaxasync.param_store import to_cpu
from jaxasync.placement import usable_cores
from jaxasync.types import transition_example

Variant = Literal["actor", "learner", "sync", "thread", "process", "pinned", "default", "ray",
                  "ray_1node", "ray_2nodes"]
ASYNC_VARIANTS = {"thread": ("thread", False), "process": ("process", False),
                  "pinned": ("process", True), "default": ("process", "auto"),
                  "ray": ("ray", False), "ray_1node": ("ray", False), "ray_2nodes": ("ray", False)}
RAY_CLUSTER_NODES = {"ray_1node": 1, "ray_2nodes": 2}  # (f'): worker nodes of the simulated cluster
RECORD_INTERVAL = 100  # opt steps between the trainers' records (our timestamps)


@dataclasses.dataclass
class Args:
  env_id: str = "CartPole-v1"
  agent: Literal["dqn", "impala"] = "dqn"
  """'impala': the on-policy path (unrolls through the queue; experiments/impala.py's agent
  and actor settings); 'learner' and 'pure' are replay measurements and are skipped."""
  variants: tuple[Variant, ...] = ("actor", "learner", "sync", "thread", "process", "pinned",
                                   "default")
  """what to measure (see the docstring); 'actor' includes bare, 'learner' includes pure."""
  duration: float = 8.0
  """measured seconds per figure and repeat."""
  warmup: float = 2.0
  """seconds run and discarded before each measured window (after compilation / first update)."""
  repeats: int = 3
  num_actors: int = 1
  envs_per_actor: int = 8
  sync_num_envs: int = 4
  """sub-envs of the sync Trainer's env (ActorsConfig's default num_envs)."""
  updates_per_call: int = 4
  batch_size: int = 128
  hidden_sizes: tuple[int, ...] = (64, 64)
  learner_devices: tuple[int, ...] = ()
  """(h): learner device counts to measure the 'learner' variant on (DQN); empty: skip."""
  solve_seeds: int = 1
  """(g): runs per arrangement, seeds 0..N-1; 0 skips it."""
  solve_reward: float = 475.0
  solve_timeout: float = 300.0
  """give up a solve run after this many seconds."""
  seed: int = 0
  json: str | None = None
  """write every figure here."""


# --- (a) actor alone ------------------------------------------------------------------------------
def actor_config(args: Args, agent, mode: str, num_envs: int | None = None) -> ja.ActorConfig:
  """What ``Trainer`` gives one actor of ``mode`` with ``num_envs`` sub-envs (--envs-per-actor
  by default; ActorsConfig's default chunks): chunk steps and collector from the agent's data
  pipeline (transitions: n-step ``StepProcessor``; unrolls: ``UnrollCollector``, one unroll
  per chunk)."""
  actors = ja.ActorsConfig(mode=mode,
                           num_envs=args.envs_per_actor if num_envs is None else num_envs)
  return ja.ActorConfig(num_envs=actors.num_envs, chunk_steps=agent.data.chunk_steps(actors),
                        collector=agent.data.collector_factory(agent), seed=args.seed)


def measure_actor(args: Args, agent_factory, env: ja.EnvFactory, num_envs: int | None = None
                  ) -> dict:
  """One jaxasync actor in a thread with ``num_envs`` sub-envs (--envs-per-actor by default);
  its env-step counter sampled after warm-up and at the end."""
  agent = agent_factory()
  store = ja.ThreadParamStore()
  store.publish(ja.ModelInfo(0, jax.device_get(agent.init(jax.random.PRNGKey(args.seed)).params)))
  transport, stop, errors = ja.ChunkQueue(ja.ActorsConfig().queue_size), threading.Event(), queue.Queue()
  shared = ActorShared(np.zeros(1, np.int64), np.full(1, -1, np.int64))
  config = actor_config(args, agent, "thread", num_envs)
  actor = threading.Thread(target=run_actor, args=(0, agent_factory, env, config, transport, store,
                                                   stop, errors, shared), daemon=True)

  def consume():
    while not stop.is_set():
      transport.get(0.05)

  consumer = threading.Thread(target=consume, daemon=True)
  actor.start()
  consumer.start()
  try:
    while shared.env_steps[0] == 0 and actor.is_alive():  # first chunk: the policy is compiled
      time.sleep(0.01)
    time.sleep(args.warmup)
    t0, s0 = time.perf_counter(), int(shared.env_steps[0])
    time.sleep(args.duration)
    t1, s1 = time.perf_counter(), int(shared.env_steps[0])
  finally:
    stop.set()
    actor.join(10)
    consumer.join(10)
  if not errors.empty():
    raise RuntimeError(f"actor failed:\n{errors.get()[1]}")
  return {"env_steps_per_sec": (s1 - s0) / (t1 - t0), "window_s": t1 - t0,
          "num_envs": config.num_envs}


def measure_bare(args: Args, agent, env: ja.EnvFactory) -> dict:
  """The reference loop: vector env + ``agent.act`` (DQN: jitted greedy, numpy epsilon; IMPALA:
  jitted logits, numpy sampling), nothing else."""
  venv = env(args.envs_per_actor, seed=args.seed)
  params = to_cpu(agent.init(jax.random.PRNGKey(args.seed)).params)
  rng = np.random.default_rng(args.seed)
  # DQN: where the actor's epsilon schedule is after its warm-up.
  state = (agent.fixed_epsilon(agent.config.eps_end) if isinstance(agent, ja.DQN)
           else agent.initial_actor_state(ja.ActorContext(num_envs=args.envs_per_actor)))
  obs, _ = venv.reset(seed=args.seed)

  def run(seconds: float) -> int:
    nonlocal obs
    steps, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
      obs, _, _, _, _ = venv.step(agent.act(params, obs, state, rng)[0])
      steps += args.envs_per_actor
    return steps

  run(args.warmup)  # includes compiling the policy
  t0 = time.perf_counter()
  steps = run(args.duration)
  t1 = time.perf_counter()
  venv.close()
  return {"env_steps_per_sec": steps / (t1 - t0), "window_s": t1 - t0}


def measure_ray_actor(args: Args, agent_factory, env: ja.EnvFactory) -> dict:
  """One Ray actor alone: chunks pulled through ``RayActorManager.get`` as fast as they come
  (its calls in flight keep it busy), params published once."""
  from jaxasync.ray_actors import RayActorManager, RayParamStore
  agent = agent_factory()
  config = actor_config(args, agent, "ray")
  store = RayParamStore()
  store.publish(ja.ModelInfo(0, jax.device_get(agent.init(jax.random.PRNGKey(args.seed)).params)))
  transport = ja.ChunkQueue(ja.ActorsConfig().queue_size)
  manager = RayActorManager(agent_factory, env, [config], transport, store,
                            chunks_ahead=ja.ActorsConfig().ray_chunks_ahead,
                            gather_s=ja.ActorsConfig().ray_gather_s)
  manager.start()

  def run(seconds: float) -> tuple[int, int]:
    steps, chunks, end = 0, 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
      chunk = transport.get(0.1)
      if chunk is not None:
        steps, chunks = steps + chunk.env_steps, chunks + 1
    manager.check()
    return steps, chunks

  try:
    while transport.get(1.0) is None:  # the actor process starts and compiles its policy
      manager.check()
    run(args.warmup)
    t0 = time.perf_counter()
    steps, chunks = run(args.duration)
    t1 = time.perf_counter()
  finally:
    manager.stop_and_join()
  return {"env_steps_per_sec": steps / (t1 - t0), "chunks_per_sec": chunks / (t1 - t0),
          "env_steps_per_chunk": steps / max(1, chunks), "window_s": t1 - t0}


# --- (b) learner alone ----------------------------------------------------------------------------
def filled_replay(agent, env: ja.EnvFactory, items: int, seed: int) -> ja.ReplayBuffer:
  """A ReplayBuffer holding ``items`` real transitions of a uniformly random policy."""
  replay = ja.ReplayBuffer(transition_example(agent.obs_space, agent.action_space), items, seed=seed)
  venv = env(8, seed=seed)
  obs, _ = venv.reset(seed=seed)
  proc = ja.StepProcessor(8, obs[0], np.asarray(venv.single_action_space.sample()))
  proc.reset(obs)
  rng = np.random.default_rng(seed)
  while len(replay) < items:
    actions = rng.integers(0, agent.num_actions, 8).astype(venv.single_action_space.dtype)
    next_obs, reward, terminated, truncated, _ = venv.step(actions)
    replay.add(proc.step(actions, reward, next_obs, terminated, truncated))
  venv.close()
  return replay


def measure_learner(args: Args, agent, replay: ja.ReplayBuffer, num_devices: int | None = None
                    ) -> dict:
  """jaxasync.Learner on a ReplaySource: sample from the replay + update call, one in flight;
  on ``num_devices`` learner devices (None: the default one, numpy straight into the call)."""
  source = ja.ReplaySource(replay, args.batch_size, args.updates_per_call)
  devices = None if num_devices is None else ja.learner_devices(num_devices)
  learner = ja.Learner(agent, args.seed, devices)

  def run(seconds: float) -> int:
    calls, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
      learner.step(source)
      calls += 1
    jax.block_until_ready(learner.state)
    return calls

  run(args.warmup)  # the first call compiles
  t0 = time.perf_counter()
  calls = run(args.duration)
  t1 = time.perf_counter()
  return {"opt_steps_per_sec": calls * args.updates_per_call / (t1 - t0), "window_s": t1 - t0,
          "sample_frac": source.time_sample / max(1e-9, source.time_sample + learner.time_update)}


def measure_pure(args: Args, agent, replay: ja.ReplayBuffer) -> dict:
  """The jitted update alone: one batch sampled once, put on the learner's device, reused."""
  k, b = args.updates_per_call, args.batch_size
  batch = jax.device_put(jax.tree.map(lambda x: x.reshape((k, b) + x.shape[1:]), replay.sample(k * b)))
  state = agent.init(jax.random.PRNGKey(args.seed))

  def run(seconds: float) -> int:
    nonlocal state
    calls, metrics, end = 0, None, time.perf_counter() + seconds
    while time.perf_counter() < end:
      previous = metrics
      state, metrics, _ = agent.update(state, batch, None)
      if previous is not None:  # one call in flight, as in Learner.step
        jax.block_until_ready(previous)
      calls += 1
    jax.block_until_ready(state)
    return calls

  run(args.warmup)
  t0 = time.perf_counter()
  calls = run(args.duration)
  t1 = time.perf_counter()
  return {"opt_steps_per_sec": calls * k / (t1 - t0), "window_s": t1 - t0}


# --- where the machine's CPU goes (Linux /proc) ---------------------------------------------------
CPU_SAMPLE_S = 0.5  # seconds between snapshots taken at the trainers' records


def cpu_snapshot() -> dict | None:
  """CPU seconds so far of this process ('learner': loop thread, XLA's threads, evaluation),
  of each descendant by kind ('actors': spawned actor processes; 'ray_workers': a local Ray
  instance's worker processes, Ray actors and idle ones; 'ray_daemons': its raylet, GCS and
  agents) and of the whole machine (/proc/stat); None where /proc is not there."""
  try:
    tick = os.sysconf("SC_CLK_TCK")
    with open("/proc/stat") as f:
      fields = [int(x) for x in f.readline().split()[1:]]
  except (OSError, ValueError):
    return None
  busy = sum(fields) - fields[3] - fields[4]  # (all but idle and iowait)
  parent, cpu, cmd = {}, {}, {}
  for name in os.listdir("/proc"):
    if not name.isdigit():
      continue
    try:
      with open(f"/proc/{name}/stat") as f:
        stat = f.read()
      with open(f"/proc/{name}/cmdline", "rb") as f:
        cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:  # (gone since the listing)
      continue
    rest = stat[stat.rindex(")") + 2:].split()
    pid = int(name)
    parent[pid], cpu[pid], cmd[pid] = int(rest[1]), (int(rest[11]) + int(rest[12])) / tick, cmdline
  me, kinds = os.getpid(), {}
  for pid in cpu:  # (descendants of this process, by walking up)
    p, depth = parent.get(pid), 0
    while p not in (None, 0, 1, me) and depth < 64:
      p, depth = parent.get(p), depth + 1
    if pid == me:
      kinds[pid] = "learner"
    elif p == me:
      c = cmd[pid]
      worker = ("ray::" in c and "Agent" not in c) or "default_worker.py" in c
      daemon = any(s in c for s in ("ray::", "/ray/", "raylet", "gcs_server"))
      kinds[pid] = "ray_workers" if worker else "ray_daemons" if daemon else "actors"
  return {"t": time.perf_counter(), "machine": busy / tick, "per_pid": cpu, "kinds": kinds}


def cpu_cores_used(a: dict, z: dict) -> dict[str, float]:
  """Cores each kind used between two snapshots (CPU seconds / wall seconds); 'rest' is the
  machine's other load. A process started in between counts from 0, one gone is left out."""
  dt = max(1e-9, z["t"] - a["t"])
  used = dict.fromkeys(("learner", "actors", "ray_workers", "ray_daemons"), 0.0)
  for pid, kind in z["kinds"].items():
    used[kind] += (z["per_pid"][pid] - a["per_pid"].get(pid, 0.0)) / dt
  used["rest"] = max(0.0, (z["machine"] - a["machine"]) / dt - sum(used.values()))
  return used


# --- (c)-(e'') trainers ----------------------------------------------------------------------------
class WindowRecorder:
  """A Recorder that timestamps the trainer's records and snapshots its counters and stage timers.

  The first record marks "learning has started" (first update call done, so compiled; for async,
  actors are up and delivered warmup_period env steps). ``attach`` lets the recorder end the run
  right after the measured window [first + warmup, first + warmup + duration], through the
  trainer's ``ledger.request_stop``.
  """

  def __init__(self, warmup: float, duration: float):
    self.warmup, self.duration = warmup, duration
    self.points: list[dict] = []
    self.cpu: list[dict] = []  # cpu_snapshot()s, one per CPU_SAMPLE_S at most
    self.trainer, self.stage_times = None, lambda: {}

  def attach(self, trainer, stage_times) -> None:
    self.trainer, self.stage_times = trainer, stage_times

  def text(self, tag: str, text: str, step: int = 0) -> None:
    pass  # (the harness reads its figures, not the run's verdicts)

  def record(self, step: int, values) -> None:
    if "opt_steps" not in values:  # evaluation records
      return
    now = time.perf_counter()
    self.points.append({"t": now, "opt_steps": values["opt_steps"], "env_steps": values["env_steps"],
                        "samples": values["samples_total"],
                        "queue_length": values.get("queue_length", 0.0),
                        "policy_lag": values.get("policy_lag_mean", 0.0),
                        "stages": dict(self.stage_times())})
    if len(self.points) == 1 and self.trainer is not None:
      self.trainer.ledger.request_stop(after_s=self.warmup + self.duration + 0.01)
    if not self.cpu or now - self.cpu[-1]["t"] >= CPU_SAMPLE_S:
      snapshot = cpu_snapshot()
      if snapshot is not None:
        self.cpu.append(snapshot)

  def close(self) -> None:
    pass

  def window(self) -> dict:
    if not self.points:
      raise RuntimeError("the trainer never recorded: learning did not start (raise --duration?)")
    lo = self.points[0]["t"] + self.warmup
    pts = [p for p in self.points if lo <= p["t"] <= lo + self.duration + 0.5]
    if len(pts) < 2:  # too few updates to cut a window: fall back to every record
      pts = self.points
    a, z = pts[0], pts[-1]
    dt = max(1e-9, z["t"] - a["t"])
    stages = {k: (z["stages"][k] - a["stages"][k]) / dt for k in z["stages"]}
    stages["other"] = 1.0 - sum(stages.values())
    cpu = [s for s in self.cpu if a["t"] <= s["t"] <= z["t"]]
    return {**({"cpu_cores": cpu_cores_used(cpu[0], cpu[-1])} if len(cpu) >= 2 else {}),
            "env_steps_per_sec": (z["env_steps"] - a["env_steps"]) / dt,
            "samples_per_sec": (z["samples"] - a["samples"]) / dt,
            "opt_steps_per_sec": (z["opt_steps"] - a["opt_steps"]) / dt,
            "window_s": dt, "records_in_window": len(pts),
            "queue_length_mean": float(np.mean([p["queue_length"] for p in pts])),
            "policy_lag_mean": float(np.mean([p["policy_lag"] for p in pts])),
            "stage_fractions": stages}


def run_config(args: Args, **kw) -> ja.RunConfig:
  base = dict(max_opts=10**9, eval_interval=0, record_interval=RECORD_INTERVAL, save_interval=0,
              updates_per_call=args.updates_per_call, seed=args.seed, progress=False)
  base.update(kw)
  return ja.RunConfig(**base)


def actors_config(args: Args, variant: str) -> ja.ActorsConfig:
  """The actors of ``variant``: 'sync' is the lock-step actor with --sync-num-envs sub-envs;
  the others --num-actors actors of --envs-per-actor sub-envs each."""
  if variant == "sync":
    return ja.ActorsConfig(mode="sync", num_envs=args.sync_num_envs)
  mode, pin = ASYNC_VARIANTS[variant]
  # IMPALA publishes after every SGD step, as experiments/impala.py does.
  return ja.ActorsConfig(mode=mode, num_actors=args.num_actors, num_envs=args.envs_per_actor,
                         pin_cpus=pin, **({"sync_interval": 1} if args.agent == "impala" else {}))


def summary_figures(summary: dict) -> dict:
  out = {f"summary_{k}": summary[k] for k in ("samples_per_sec", "opt_steps_per_sec", "wall_s")}
  if "stage_fractions" in summary:
    out["summary_stage_fractions"] = summary["stage_fractions"]
  return out


def measure_sync(args: Args, agent_factory, env: ja.EnvFactory) -> dict:
  recorder = WindowRecorder(args.warmup, args.duration)
  trainer = ja.Trainer(agent_factory(), env, run_config(args, duration=60 + args.duration),
                       actors_config(args, "sync"), recorder)
  recorder.attach(trainer, trainer.stage_times)
  summary = trainer.train()
  return {**recorder.window(), **summary_figures(summary)}


@contextlib.contextmanager
def simulated_cluster(nodes: int, num_actors: int):
  """(f'): a Ray cluster on this machine, joined by this process for the block: a head node
  without CPUs and ``nodes`` worker nodes with ``num_actors`` CPUs between them. A local
  instance an earlier 'ray' measurement started is shut down first (one connection per
  process); the cluster is shut down after, so the next 'ray' starts its local instance
  again."""
  import ray
  from ray.cluster_utils import Cluster
  if num_actors < nodes:
    raise SystemExit(f"error: {nodes} worker nodes need --num-actors {nodes} or more (SPREAD "
                     f"puts one actor per node; a node without one measures nothing).")
  if ray.is_initialized():
    ray.shutdown()
  # As jaxasync's local instance and the README's `ray start` lines: at Ray's nice 15 the
  # learner starves the actors on a machine they share.
  os.environ.setdefault("RAY_worker_niceness", "0")
  cluster = None
  try:
    with warnings.catch_warnings():
      # JAX warns on any os.fork once it runs threads; the nodes start with subprocess (fork
      # then exec at once), which that warning is not about (as in ray_actors.connect).
      warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called",
                              category=RuntimeWarning)
      cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
      for _ in range(nodes):
        cluster.add_node(num_cpus=-(-num_actors // nodes))
    ray.init(address=cluster.address)
    cluster.wait_for_nodes()
    yield
  finally:
    ray.shutdown()
    if cluster is not None:
      cluster.shutdown()


def record_ray_actor_nodes(where: dict, loop) -> None:
  """(f'), once: on how many nodes the Ray actors run, and how many on the learner's node
  (the cluster's head, without CPUs: none)."""
  if not where:
    import ray
    nodes = loop.feed.manager.node_ids()
    here = ray.get_runtime_context().get_node_id()
    where.update(actor_nodes=len(set(nodes)), actors_on_learner_node=nodes.count(here))


def measure_async(args: Args, agent_factory, env: ja.EnvFactory, variant: str) -> dict:
  recorder = WindowRecorder(args.warmup, args.duration)
  cluster = variant in RAY_CLUSTER_NODES
  where: dict = {}
  hooks = [ja.Hook(RECORD_INTERVAL, functools.partial(record_ray_actor_nodes, where))] if cluster else []
  # Process and Ray actors build their own agent with agent_factory.
  trainer = ja.Trainer(agent_factory(), env, run_config(args, duration=60 + args.duration),
                       actors_config(args, variant), recorder, agent_factory=agent_factory,
                       hooks=hooks)
  recorder.attach(trainer, trainer.stage_times)
  with (simulated_cluster(RAY_CLUSTER_NODES[variant], args.num_actors) if cluster
        else contextlib.nullcontext()):
    summary = trainer.train()  # (the feed unpins this thread at its close, whatever ended it)
  return {**recorder.window(), **summary_figures(summary), **where,
          "dropped_chunks": summary["dropped_chunks"], "placement": summary["placement"]}


# --- (g) time to solve ----------------------------------------------------------------------------
def solve(args: Args, agent_factory, env: ja.EnvFactory, variant: str, seed: int) -> dict:
  run = run_config(args, seed=seed, duration=args.solve_timeout,
                   target_eval_reward=args.solve_reward, eval_interval=1_000, record_interval=0)
  t0 = time.perf_counter()
  summary = ja.Trainer(agent_factory(), env, run, actors_config(args, variant),
                       agent_factory=agent_factory).train()
  total = time.perf_counter() - t0
  at = summary["solved_at"]
  return {"seed": seed, "solved": at is not None,
          "env_steps": at["env_steps"] if at else summary["env_steps"],
          "opt_steps": at["opt_steps"] if at else summary["opt_steps"],
          "wall_s": at["wall_s"] if at else summary["wall_s"],  # from the trainer's construction
          "total_wall_s": total,  # the whole call, stop and clean-up included
          "best_eval_reward": summary["best_eval_reward"]}


# --- driver ---------------------------------------------------------------------------------------
def median_of(runs: list[dict]) -> dict:
  """Per-key medians over repeats (nested dicts too), of the keys every repeat has."""
  out = {}
  for key, value in runs[0].items():
    if not all(key in r for r in runs):
      continue
    if isinstance(value, dict):
      out[key] = median_of([r[key] for r in runs])
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
      out[key] = statistics.median(r[key] for r in runs)
  return out


def machine_info() -> dict:
  return {"cpu_count": os.cpu_count(),
          "cpus_usable": len(usable_cores()),
          "platform": platform.platform(), "python": sys.version.split()[0],
          "jax": jax.__version__, "jax_backend": jax.default_backend(),
          "jax_devices": [str(d) for d in jax.devices()],
          "loadavg_start": os.getloadavg() if hasattr(os, "getloadavg") else None}


def agent_class_and_config(args: Args) -> tuple[type, object]:
  """The agent --agent names, with the settings every measurement uses."""
  if args.agent == "impala":
    # experiments/impala.py's CartPole agent (one unroll of 5 steps per SGD step, tanh torsos);
    # no policy-lag bound (UnrollConfig's default), so that no unroll is dropped.
    return ja.IMPALA, ja.IMPALAConfig(
        hidden_sizes=tuple(args.hidden_sizes), batch_size=1, learning_rate=7e-4,
        entropy_cost=0.0, activation="tanh", orthogonal_init=True, max_grad_norm=1.0,
        data=ja.UnrollConfig(unroll_length=5))
  return ja.DQN, ja.DQNConfig(hidden_sizes=tuple(args.hidden_sizes), batch_size=args.batch_size)


def build_agent(args: Args) -> tuple[object, functools.partial, object, ja.EnvFactory]:
  """The env factory, the agent's config and factory, and one agent built from it."""
  ja.check_env_id(args.env_id)
  env = ja.EnvFactory(args.env_id)
  obs_space, action_space = ja.envs.spaces_of(env)
  agent_cls, agent_config = agent_class_and_config(args)
  agent_factory = functools.partial(agent_cls, agent_config, obs_space, action_space, args.env_id)
  return agent_config, agent_factory, agent_factory(), env


def print_header(args: Args) -> None:
  print(f"jaxasync throughput on {args.env_id}: {args.duration:g} s per figure after {args.warmup:g} s "
        f"warm-up, {args.repeats} repeat(s); jax {jax.default_backend()} {jax.devices()}, "
        f"{os.cpu_count()} CPUs", flush=True)


# Each measure_*_variant gives one repeat's figures as (name, figure) pairs, in the order measured
# (a list, not a dict: a device count named twice is measured, and kept, twice), and the text of
# its progress line.
def measure_actor_variant(args: Args, agent_factory, agent, env: ja.EnvFactory
                          ) -> tuple[list[tuple[str, dict]], str]:
  """(a): the actor, then the bare loop; with 'sync' measured on another env count, then
  (a') the actor with the lock-step actor's --sync-num-envs ('actor_sync')."""
  actor = measure_actor(args, agent_factory, env)
  bare = measure_bare(args, agent, env)
  figs = [("actor", actor), ("bare", bare)]
  shown = (f"actor {actor['env_steps_per_sec']:,.0f} bare {bare['env_steps_per_sec']:,.0f} "
           "env-steps/s")
  if "sync" in args.variants and args.sync_num_envs != args.envs_per_actor:
    fig = measure_actor(args, agent_factory, env, args.sync_num_envs)
    figs.append(("actor_sync", fig))
    shown += f" | {args.sync_num_envs} envs {fig['env_steps_per_sec']:,.0f}"
  return figs, shown


def measure_learner_variant(args: Args, agent, replay: ja.ReplayBuffer
                            ) -> tuple[list[tuple[str, dict]], str]:
  """(b): the Learner, the pure update, then (h) the Learner on each --learner-devices count."""
  learner = measure_learner(args, agent, replay)
  pure = measure_pure(args, agent, replay)
  figs = [("learner", learner), ("pure", pure)]
  shown = (f"learner {learner['opt_steps_per_sec']:,.0f} pure {pure['opt_steps_per_sec']:,.0f} "
           "opt-steps/s")
  for n in args.learner_devices:
    fig = measure_learner(args, agent, replay, num_devices=n)
    figs.append((f"learner_{n}dev", fig))
    shown += f" | {n} device(s) {fig['opt_steps_per_sec']:,.0f}"
  return figs, shown


def measure_trainer_variant(args: Args, agent_factory, env: ja.EnvFactory, variant: str
                            ) -> tuple[list[tuple[str, dict]], str]:
  """(c)-(f): the trainer of ``variant``; for 'ray' then one Ray actor alone."""
  fig = (measure_sync(args, agent_factory, env) if variant == "sync"
         else measure_async(args, agent_factory, env, variant))
  figs = [(variant, fig)]
  shown = f"{fig['env_steps_per_sec']:,.0f} env-steps/s {fig['opt_steps_per_sec']:,.0f} opt-steps/s"
  if variant == "ray":
    ray_actor = measure_ray_actor(args, agent_factory, env)
    figs.append(("ray_actor", ray_actor))
    shown += f" | ray_actor alone {ray_actor['env_steps_per_sec']:,.0f} env-steps/s"
  return figs, shown


def measure_variants(args: Args, agent_factory, agent, env: ja.EnvFactory) -> dict[str, list[dict]]:
  """Every figure of --variants, --repeats times, interleaved (repeat 1 of every variant, then
  repeat 2, ...), with a progress line after each variant; each figure's repeats by name."""
  # Filled once, on the first 'learner' measurement, so its filling counts in that line's time.
  replay = functools.cache(lambda: filled_replay(agent, env, 50_000, args.seed))
  runs: dict[str, list[dict]] = {}
  for r in range(args.repeats):
    for variant in args.variants:
      if variant == "learner" and args.agent != "dqn":
        continue  # a replay measurement
      t0 = time.perf_counter()
      if variant == "actor":
        figs, shown = measure_actor_variant(args, agent_factory, agent, env)
      elif variant == "learner":
        figs, shown = measure_learner_variant(args, agent, replay())
      else:
        figs, shown = measure_trainer_variant(args, agent_factory, env, variant)
      for name, fig in figs:
        runs.setdefault(name, []).append(fig)
      print(f"  repeat {r + 1}/{args.repeats} {variant:10s} {shown}  ({time.perf_counter() - t0:.1f} s)",
            flush=True)
  return runs


def median_rate(med: dict, name: str, key: str) -> float | None:
  """``med[name][key]``, None where that figure was not measured."""
  return med.get(name, {}).get(key)


def rate_ratios(med: dict) -> dict:
  """actor / bare, learner / pure, and each trainer's env-steps/s over the actor alone's."""
  actor_alone = median_rate(med, "actor", "env_steps_per_sec")
  ratios = {}
  if "actor" in med:
    ratios["actor_over_bare"] = actor_alone / median_rate(med, "bare", "env_steps_per_sec")
  if "learner" in med:
    ratios["learner_over_pure"] = (median_rate(med, "learner", "opt_steps_per_sec")
                                   / median_rate(med, "pure", "opt_steps_per_sec"))
  for name in ("sync", *ASYNC_VARIANTS):  # how much of the actor's own rate each keeps
    if name in med and actor_alone:
      ratios[f"{name}_over_actor"] = med[name]["env_steps_per_sec"] / actor_alone
  return ratios


def overlap_efficiency(med: dict) -> dict:
  """Per trainer: env-steps/s / (a) + opt-steps/s / (b) (needs both measured). For sync,
  whose actor steps --sync-num-envs sub-envs, also 'sync_own_actor': over (a'), the actor
  alone with that many (the sync loop at the ideal rate 1 / (1/(a') + 1/(b)) makes 1.0)."""
  actor_alone = median_rate(med, "actor", "env_steps_per_sec")
  learner_alone = median_rate(med, "learner", "opt_steps_per_sec")
  overlap = {}
  for name in ("sync", *ASYNC_VARIANTS):
    if name in med and actor_alone and learner_alone:
      overlap[name] = (med[name]["env_steps_per_sec"] / actor_alone
                       + med[name]["opt_steps_per_sec"] / learner_alone)
  own_actor = median_rate(med, "actor_sync", "env_steps_per_sec")
  if "sync" in med and own_actor and learner_alone:
    overlap["sync_own_actor"] = (med["sync"]["env_steps_per_sec"] / own_actor
                                 + med["sync"]["opt_steps_per_sec"] / learner_alone)
  return overlap


def run_solves(args: Args, agent_factory, env: ja.EnvFactory, overlap: dict) -> dict[str, list[dict]]:
  """(g): --solve-seeds runs of sync and of the async variant with the best overlap efficiency
  (process where none was measured), with a progress line after each."""
  solves: dict[str, list[dict]] = {}
  if args.solve_seeds <= 0:
    return solves
  # (the simulated cluster's variants are measured, not solved: a solve runs without one)
  measured = [v for v in ASYNC_VARIANTS if v in overlap and v not in RAY_CLUSTER_NODES]
  best = max(measured, key=overlap.get) if measured else "process"
  for variant in ("sync", best):
    for seed in range(args.solve_seeds):
      res = solve(args, agent_factory, env, variant, seed)
      solves.setdefault(variant, []).append(res)
      print(f"  solve {variant:8s} seed {seed}: solved={res['solved']} at {res['env_steps']:,} env "
            f"steps, {res['wall_s']:.1f} s (call {res['total_wall_s']:.1f} s)", flush=True)
  return solves


# --- the report -----------------------------------------------------------------------------------
def table_ratio(name: str, ratios: dict) -> float | None:
  """A table row's ratio column: actor / bare, learner / pure, a trainer's over the actor."""
  return {"actor": ratios.get("actor_over_bare"),
          "learner": ratios.get("learner_over_pure")}.get(name, ratios.get(f"{name}_over_actor"))


def stages_text(name: str, m: dict) -> str:
  """A table row's time fractions, and for async trainers the queue length and policy lag."""
  stages = " ".join(f"{k}={v:.2f}" for k, v in m.get("stage_fractions", {}).items())
  if "queue_length_mean" in m and name != "sync":
    stages += f" | queue {m['queue_length_mean']:.0f} lag {m['policy_lag_mean']:.0f}"
  if "cpu_cores" in m:  # (kinds that used no CPU left out)
    stages += " | cores: " + " ".join(f"{k}={v:.2f}" for k, v in m["cpu_cores"].items()
                                      if v >= 0.005)
  return stages


def print_table(args: Args, med: dict, ratios: dict, overlap: dict) -> None:
  """The medians' table: one row per measured figure of (a)-(f)."""
  print(f"\nmedians of {args.repeats} repeat(s), {args.duration:g} s windows "
        f"({args.num_actors} actor(s) x {args.envs_per_actor} envs, sync {args.sync_num_envs} envs, "
        f"batch {args.batch_size}, {args.updates_per_call} updates/call)")
  print(f"{'variant':10s} {'env-steps/s':>12s} {'opt-steps/s':>12s} {'ratio':>7s} {'overlap':>8s}  "
        "steady-state time fractions (learner thread)")
  fmt = lambda x: "-" if x is None else f"{x:,.0f}"
  for name in ("actor", "bare", "actor_sync", "learner", "pure", "sync", *ASYNC_VARIANTS):
    if name not in med:
      continue
    m, ratio = med[name], table_ratio(name, ratios)
    print(f"{name:10s} {fmt(m.get('env_steps_per_sec')):>12s} {fmt(m.get('opt_steps_per_sec')):>12s} "
          f"{'' if ratio is None else f'{ratio:.2f}':>7s} "
          f"{'' if name not in overlap else f'{overlap[name]:.2f}':>8s}  {stages_text(name, m)}")
  if "sync_own_actor" in overlap:
    print(f"sync against the actor at its env count (actor_sync) and the learner: "
          f"{overlap['sync_own_actor']:.2f} of the ideal 1 / (1/actor_sync + 1/learner)")


def ray_actor_ratios(med: dict) -> dict:
  """With 'ray_actor' measured: it over the actor alone, the ray trainer over the process one,
  and the per-chunk overhead in ms (1 / its chunks/s - 1 / (a)'s chunks/s)."""
  if "ray_actor" not in med:
    return {}
  actor_alone, ray_alone = median_rate(med, "actor", "env_steps_per_sec"), med["ray_actor"]
  ratios = {"ray_actor_over_actor":
            ray_alone["env_steps_per_sec"] / actor_alone if actor_alone else None}
  if "process" in med and "ray" in med:
    ratios["ray_over_process"] = med["ray"]["env_steps_per_sec"] / med["process"]["env_steps_per_sec"]
  per_chunk = ray_alone["env_steps_per_chunk"]
  overhead = (1 / ray_alone["chunks_per_sec"] - per_chunk / actor_alone) if actor_alone else None
  ratios["ray_chunk_overhead_ms"] = None if overhead is None else 1e3 * overhead
  return ratios


def print_ray_actor(med: dict, ratios: dict) -> None:
  """The Ray actor alone's line, with ``ray_actor_ratios``' figures."""
  if "ray_actor" not in med:
    return
  ray_alone, actor_alone = med["ray_actor"], median_rate(med, "actor", "env_steps_per_sec")
  per_chunk = ray_alone["env_steps_per_chunk"]
  print(f"\nray_actor alone: {ray_alone['env_steps_per_sec']:,.0f} env-steps/s, "
        f"{ray_alone['chunks_per_sec']:,.0f} chunks/s of {per_chunk:.0f} env steps"
        + (f"; over the actor alone {ratios['ray_actor_over_actor']:.2f}, per-chunk overhead "
           f"{ratios['ray_chunk_overhead_ms']:.2f} ms" if actor_alone else "")
        + (f"; ray / process trainer env-steps/s {ratios['ray_over_process']:.2f}"
           if "ray_over_process" in ratios else ""))


def ray_cluster_ratios(med: dict) -> dict:
  """(f'): env-steps/s of Ray actors on the simulated cluster's one worker node over the local
  instance's ('ray'), and on two worker nodes over one."""
  rate = lambda name: median_rate(med, name, "env_steps_per_sec")
  ratios = {}
  if rate("ray_1node") and rate("ray"):
    ratios["ray_1node_over_ray"] = rate("ray_1node") / rate("ray")
  if rate("ray_2nodes") and rate("ray_1node"):
    ratios["ray_2nodes_over_1node"] = rate("ray_2nodes") / rate("ray_1node")
  return ratios


def print_ray_cluster(args: Args, ratios: dict) -> None:
  """(f')'s ratios, one line."""
  parts = []
  if "ray_1node_over_ray" in ratios:
    parts.append(f"one worker node / local instance {ratios['ray_1node_over_ray']:.2f}")
  if "ray_2nodes_over_1node" in ratios:
    parts.append(f"two worker nodes / one {ratios['ray_2nodes_over_1node']:.2f}")
  if parts:
    print(f"\nsimulated Ray cluster ({args.num_actors} actor(s)), env-steps/s: " + "; ".join(parts))


def learner_device_ratios(args: Args, med: dict) -> dict:
  """(h): each device count's Learner opt-steps/s over the smallest count's."""
  if not (args.learner_devices and "learner" in med):
    return {}
  least = min(args.learner_devices)
  base = median_rate(med, f"learner_{least}dev", "opt_steps_per_sec")
  ratios = {}
  for n in args.learner_devices:
    ratios[f"learner_{n}dev_over_{least}dev"] = (
        median_rate(med, f"learner_{n}dev", "opt_steps_per_sec") / base)
  return ratios


def print_learner_devices(args: Args, med: dict, ratios: dict) -> None:
  """(h)'s table: one row per --learner-devices count, in the order given."""
  if not (args.learner_devices and "learner" in med):
    return
  print(f"\n(h) the Learner on N devices ({jax.default_backend()}; global batch "
        f"{args.batch_size}, {args.updates_per_call} updates/call)")
  print(f"{'devices':>8s} {'opt-steps/s':>12s} {'samples/s':>12s} {'ratio':>7s}")
  for n in args.learner_devices:
    ops = median_rate(med, f"learner_{n}dev", "opt_steps_per_sec")
    ratio = ratios[f"learner_{n}dev_over_{min(args.learner_devices)}dev"]
    print(f"{n:8d} {ops:12,.0f} {ops * args.batch_size:12,.0f} {ratio:7.2f}")


def print_solves(args: Args, solves: dict[str, list[dict]]) -> None:
  """(g): one line per solve run."""
  for variant, rs in solves.items():
    for res in rs:
      print(f"solve {variant:8s} seed {res['seed']}: "
            + (f"eval >= {args.solve_reward:g} at {res['env_steps']:,} env steps, {res['wall_s']:.1f} s"
               if res["solved"] else f"not solved in {args.solve_timeout:g} s "
               f"(best eval {res['best_eval_reward']:.0f}, {res['env_steps']:,} env steps)"))


def result_record(args: Args, agent_config, machine: dict, start: float, runs: dict, med: dict,
                  ratios: dict, overlap: dict, solves: dict) -> dict:
  """Everything measured, with the settings and machine it was measured on (the JSON)."""
  return {
      "config": {"args": dataclasses.asdict(args), "agent": dataclasses.asdict(agent_config),
                 "run": dataclasses.asdict(run_config(args)),
                 "actors": {v: dataclasses.asdict(actors_config(args, v))
                            for v in ("sync", *ASYNC_VARIANTS)},
                 "ray_cluster": {v: {"worker_nodes": n, "cpus_per_node": -(-args.num_actors // n)}
                                 for v, n in RAY_CLUSTER_NODES.items()},
                 "record_interval": RECORD_INTERVAL,
                 "overlap_efficiency": "env_steps_per_sec / actor + opt_steps_per_sec / learner",
                 "trainer_rates": "from timestamped records in [first + warmup, first + warmup + duration]"},
      "machine": {**machine, "loadavg_end": os.getloadavg() if hasattr(os, "getloadavg") else None},
      "medians": med, "ratios": ratios, "overlap_efficiency": overlap,
      "repeats": runs, "solve": solves, "wall_s": time.perf_counter() - start,
  }


def write_json(path: str | None, result: dict) -> None:
  if path:
    with open(path, "w") as f:
      json.dump(result, f, indent=1, default=float)
    print(f"JSON: {path}")


def main(args: Args) -> dict:
  start, machine = time.perf_counter(), machine_info()
  agent_config, agent_factory, agent, env = build_agent(args)
  print_header(args)
  runs = measure_variants(args, agent_factory, agent, env)
  med = {name: median_of(rs) for name, rs in runs.items()}
  ratios, overlap = rate_ratios(med), overlap_efficiency(med)
  solves = run_solves(args, agent_factory, env, overlap)
  print_table(args, med, ratios, overlap)
  # The Ray and (h) ratios are taken after the table, beside their own lines, so that a failing
  # one (no Ray chunk in a short window) stops the run with the table already printed.
  ratios.update(ray_actor_ratios(med))
  print_ray_actor(med, ratios)
  ratios.update(ray_cluster_ratios(med))
  print_ray_cluster(args, ratios)
  ratios.update(learner_device_ratios(args, med))
  print_learner_devices(args, med, ratios)
  print_solves(args, solves)
  result = result_record(args, agent_config, machine, start, runs, med, ratios, overlap, solves)
  write_json(args.json, result)
  return result


if __name__ == "__main__":
  main(tyro.cli(Args))

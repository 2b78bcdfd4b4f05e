"""Everything that needs an accelerator, measured by one command into one report.

  python scripts/accelerator_check.py --out accel        # accel.json and accel.md
  python scripts/accelerator_check.py --quick --out /tmp/accel   # the CPU parts, short (CI)

Whenever a GPU is lent to the project, run this first and put its report in docs/ with the
date and the device. The parts:

1. devices: the backend, every device, and each accelerator's memory in use and its peak
   (``Device.memory_stats``) after the other parts ran.
2. updates: SGD steps/s of each preset's jitted update (DQN CartPole, SAC's MuJoCo preset on
   HalfCheetah-v5's shapes, PPO CartPole, DQN MinAtar CNN, Rainbow's Atari Nature CNN), on the
   CPU and on the accelerator: random batches in the preset's shapes and dtypes, placed on the
   device once, ``k`` SGD steps per call, one call in flight (the update's own rate).
3. harness: ``scripts/bench_throughput.py`` (learner, sync and async variants on CartPole; on
   an accelerator also ``--learner-devices`` over every local device), its JSON kept whole.
4. runs (accelerator, or ``--runs`` on the CPU): central inference on the accelerator against
   per-actor CPU inference (DQN's MinAtar preset, ``--num-actors`` process actors, each way for
   ``--run-seconds``), and short Rainbow runs on MinAtar Breakout and Atari Pong (when ale-py
   is installed) with env frames/s per CPU core next to Cleanba's 24.7k frames/s on an A100
   with 10 CPUs (2.47k per core; Huang et al. 2023, Cleanba's README).

Without an accelerator it says so, runs parts 1-3 on the CPU and exits 0. The report is
written after every part (a check stopped by a time limit keeps what it measured); a harness or
run that fails is recorded with the end of its output, the other parts still run, and the check
exits 1. Its own process and those it starts do not preallocate GPU memory
(``XLA_PYTHON_CLIENT_PREALLOCATE=false`` unless set), unlike a user's run.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# This process keeps its device buffers while the harness and the runs start their own
# processes on the same GPU: JAX's default (preallocating 75 % of the GPU's memory in each
# process) would leave them none.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import gymnasium as gym  # noqa: E402
import jax  # noqa: E402
import numpy as np
import tyro

import jaxasync as ja
from jaxasync.collectors.unrolls import Unroll
from jaxasync.placement import usable_cores
from jaxasync.train import dqn as dqn_job, ppo as ppo_job, rainbow as rainbow_job, sac as sac_job

REPO = Path(__file__).resolve().parents[1]
CLEANBA_FRAMES_PER_CPU = 24_700 / 10  # Cleanba's Atari figure: A100, 10 CPU cores
HALFCHEETAH = (gym.spaces.Box(-np.inf, np.inf, (17,), np.float64),
               gym.spaces.Box(-1.0, 1.0, (6,), np.float32))


@dataclasses.dataclass
class Args:
  out: str = "accelerator_check"
  """the report's path without extension: <out>.json and <out>.md."""
  quick: bool = False
  """short windows (CI): 1 s per update figure, no Atari CNN on the CPU (~1 SGD step/s
  there), a 1 s harness window, no runs."""
  update_seconds: float = 5.0
  """measured seconds per update figure (after the compiling call)."""
  updates_per_call: int = 4
  harness_repeats: int = 2
  """repeats of each harness variant (the harness reports their medians)."""
  runs: bool = False
  """also run part 4 on a machine without an accelerator."""
  run_seconds: float = 120.0
  """trainer seconds per run of part 4."""
  num_actors: int = 8
  """process actors in the central-inference comparison."""


# --- 1. devices ---------------------------------------------------------------------------------
def accelerators() -> list[jax.Device]:
  return [d for d in jax.devices() if d.platform != "cpu"]


def device_report() -> dict:
  """The backend, the devices, and each accelerator's memory figures (bytes)."""
  memory = {}
  for d in accelerators():
    stats = d.memory_stats() or {}
    memory[str(d)] = {k: stats[k] for k in ("bytes_in_use", "peak_bytes_in_use", "bytes_limit")
                      if k in stats}
  return {"backend": jax.default_backend(), "devices": [str(d) for d in jax.devices()],
          "cpu_cores": len(usable_cores()), "jax": jax.__version__, "memory": memory}


# --- 2. updates ---------------------------------------------------------------------------------
def preset_agents() -> dict[str, ja.Agent]:
  """Each preset's agent on its env's spaces (MinAtar and Atari shapes without their envs)."""
  cartpole = gym.make("CartPole-v1")
  spaces = cartpole.observation_space, cartpole.action_space
  agents = {
      "dqn-cartpole": ja.DQN(dqn_job.cartpole_agent(), *spaces, "CartPole-v1"),
      "sac-mujoco (HalfCheetah-v5 shapes)": ja.SAC(sac_job.mujoco_preset().agent, *HALFCHEETAH,
                                                   "HalfCheetah-v5"),
      "ppo-cartpole": ja.PPO(ppo_job.cartpole_agent(), *spaces, "CartPole-v1"),
      "dqn-minatar (Breakout CNN)": ja.DQN(
          dqn_job.minatar_preset().agent,
          gym.spaces.Box(0, 1, (10, 10, 4), np.bool_), gym.spaces.Discrete(3),
          "MinAtar/Breakout-v1"),
      "rainbow-atari (Nature CNN)": ja.DQN(
          rainbow_job.atari_preset().agent,
          gym.spaces.Box(0, 255, (84, 84, 4), np.uint8), gym.spaces.Discrete(6), "ALE/Pong-v5"),
  }
  return agents


def random_batch(agent: ja.Agent, k: int, unroll_columns: int, seed: int = 0) -> tuple:
  """One update call's ``(batch, weights)`` in the agent's shapes and dtypes, random values."""
  rng = np.random.default_rng(seed)
  space, obs_space = agent.action_space, agent.obs_space

  def obs(shape):
    if np.issubdtype(obs_space.dtype, np.integer) or obs_space.dtype == np.bool_:
      high = 2 if obs_space.dtype == np.bool_ else 256
      return rng.integers(0, high, shape + obs_space.shape).astype(obs_space.dtype)
    return rng.normal(size=shape + obs_space.shape).astype(np.float32)

  def actions(shape):
    if isinstance(space, gym.spaces.Discrete):
      return rng.integers(0, space.n, shape).astype(space.dtype)
    return rng.uniform(space.low, space.high, shape + space.shape).astype(space.dtype)

  floats = lambda shape: rng.normal(size=shape).astype(np.float32)
  if isinstance(agent.data, ja.UnrollConfig):
    shape = (k, agent.data.unroll_length + 1, agent.batch_size * unroll_columns)
    first = rng.random(shape) < 0.05
    extras = jax.tree.map(lambda e: floats(shape + np.shape(e)), agent.extras_example())
    return Unroll(obs=obs(shape), action=actions(shape), extras=extras, reward=floats(shape),
                  discount=np.full(shape, 0.99, np.float32), first=first,
                  last=np.roll(first, -1, axis=1)), None
  shape = (k, agent.batch_size)
  extras = jax.tree.map(lambda e: floats(shape + np.shape(e)), agent.extras_example())
  batch = ja.Transition(obs=obs(shape), action=actions(shape), reward=floats(shape),
                        discount=np.full(shape, 0.99, np.float32), next_obs=obs(shape),
                        extras=extras)
  return batch, np.ones(shape, np.float32)


def update_rate(agent: ja.Agent, device: jax.Device, k: int, seconds: float,
                unroll_columns: int) -> float:
  """SGD steps/s of ``agent.update`` on ``device``: the batch placed once, one call in flight."""
  with jax.default_device(device):
    state = jax.device_put(agent.init(jax.random.PRNGKey(0)), device)
    batch, weights = jax.device_put(random_batch(agent, k, unroll_columns), device)
    state, metrics, _ = agent.update(state, batch, weights)  # compiles
    jax.block_until_ready(metrics)
    calls, previous, t0 = 0, None, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
      state, metrics, _ = agent.update(state, batch, weights)
      if previous is not None:
        jax.block_until_ready(previous)
      previous, calls = metrics, calls + 1
    jax.block_until_ready(state)
    return calls * k / (time.perf_counter() - t0)


def measure_updates(args: Args) -> list[dict]:
  seconds = 1.0 if args.quick else args.update_seconds
  columns = ja.ActorsConfig().num_envs  # unroll agents: one actor's sub-envs per unroll
  rows = []
  for name, agent in preset_agents().items():
    if args.quick and not accelerators() and "atari" in name:
      rows.append({"agent": name, "batch": agent.batch_size, "skipped": "--quick on a CPU"})
      continue
    row = {"agent": name, "batch": agent.batch_size, "updates_per_call": args.updates_per_call,
           "cpu_sgd_steps_per_sec": update_rate(agent, jax.devices("cpu")[0],
                                                args.updates_per_call, seconds, columns)}
    accel = accelerators()
    if accel:
      rate = update_rate(agent, accel[0], args.updates_per_call, seconds, columns)
      row.update(accelerator_sgd_steps_per_sec=rate,
                 accelerator_over_cpu=rate / row["cpu_sgd_steps_per_sec"])
    rows.append(row)
    print(f"  update {name}: " + ", ".join(f"{k} {v:,.1f}" for k, v in row.items()
                                           if isinstance(v, float)), flush=True)
  return rows


# --- 3. harness ---------------------------------------------------------------------------------
def run_harness(args: Args, workdir: Path) -> dict:
  """scripts/bench_throughput.py in its own process (its XLA flags are set before jax starts)."""
  out = workdir / "throughput.json"
  cmd = [sys.executable, str(REPO / "scripts" / "bench_throughput.py"), "--json", str(out),
         "--solve-seeds", "0"]
  if args.quick:
    cmd += ["--variants", "learner", "sync", "--duration", "1", "--warmup", "0.5",
            "--repeats", "1"]
  else:
    cmd += ["--variants", "actor", "learner", "sync", "process", "pinned", "default",
            "--duration", "5", "--repeats", str(args.harness_repeats)]
    if len(jax.devices()) > 1:
      cmd += ["--learner-devices", "1", str(len(jax.devices()))]
  print("  harness: " + " ".join(cmd[1:]), flush=True)
  done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1800)
  if done.returncode != 0:
    raise RuntimeError(f"bench_throughput.py failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
  return {"command": " ".join(cmd[1:]), **json.loads(out.read_text())}


# --- 4. runs ------------------------------------------------------------------------------------
def training_run(script: str, flags: list[str], workdir: Path, name: str, seconds: float) -> dict:
  """One experiment run for ``seconds``; its summary's rates."""
  logdir = workdir / name
  cmd = [sys.executable, f"experiments/{script}", *flags, "--duration", str(seconds),
         "--no-progress", "--logdir", str(logdir), "--seed", "0"]
  print(f"  run {name}: " + " ".join(cmd[1:]), flush=True)
  done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                        timeout=seconds * 2 + 240)
  summary = logdir / "summary.json"
  if done.returncode != 0 or not summary.is_file():
    raise RuntimeError(f"{name} failed (exit {done.returncode}):\n{done.stdout[-2000:]}\n"
                       f"{done.stderr[-2000:]}")
  s = json.loads(summary.read_text())
  return {"command": " ".join(cmd[1:]), "env_steps": s["env_steps"], "opt_steps": s["opt_steps"],
          "wall_s": s["wall_s"], "env_steps_per_sec": s["env_steps"] / s["wall_s"],
          "opt_steps_per_sec": s["opt_steps_per_sec"], "best_eval_reward": s.get("best_eval_reward"),
          "bottleneck": s.get("bottleneck")}


def measure_runs(args: Args, workdir: Path, cores: int, report: dict, out: Path) -> dict:
  """Part 4, each run written into the report as it ends; a run that fails is recorded with
  the end of its output (the others still run) and makes the check exit 1."""
  minatar = ["--preset", "minatar", "--env-id", "MinAtar/Breakout-v1"]
  actors = ["--mode", "process", "--num-actors", str(args.num_actors)]
  planned = {
      "dqn-minatar, per-actor CPU inference": ("dqn.py", minatar + actors, "inference_cpu"),
      "dqn-minatar, central inference": (
          "dqn.py", minatar + actors + ["--inference-servers", "1"], "inference_central"),
      "rainbow-minatar": ("rainbow.py", minatar, "rainbow_minatar"),
  }
  try:
    import ale_py  # noqa: F401  (Atari's emulator)
    planned["rainbow-atari Pong"] = ("rainbow.py", ["--preset", "atari", "--env-id",
                                                    "ALE/Pong-v5"], "rainbow_pong")
  except ImportError:
    report["runs"]["rainbow-atari Pong"] = {
        "skipped": "ale-py is not installed (pip install 'jaxasync[atari]')"}
  for name, (script, flags, logname) in planned.items():
    try:
      run = training_run(script, flags, workdir, logname, args.run_seconds)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
      print(f"  run {name} FAILED: {str(e)[-600:]}", flush=True)
      run = {"failed": str(e)[-2000:]}
    if name == "rainbow-atari Pong" and "failed" not in run:
      run["frames_per_sec"] = 4 * run["env_steps_per_sec"]  # (frame skip 4)
      run["frames_per_sec_per_cpu"] = run["frames_per_sec"] / cores
      run["cleanba_frames_per_sec_per_cpu"] = CLEANBA_FRAMES_PER_CPU
    report["runs"][name] = run
    write_report(report, out)
  return report["runs"]


# --- the report ---------------------------------------------------------------------------------
def markdown(report: dict) -> str:
  dev = report["devices"]
  lines = [f"# Accelerator check, {report['date']}", "",
           f"Backend {dev['backend']}, devices {', '.join(dev['devices'])}, {dev['cpu_cores']} CPU "
           f"cores, jax {dev['jax']}. Command: `{report['command']}`.", ""]
  if not report["accelerator"]:
    lines += ["**No accelerator on this machine**: the CPU parts only.", ""]
  lines += ["## Updates (SGD steps/s, one call in flight, batch placed once)", "",
            "| agent | batch | CPU | accelerator | accelerator / CPU |", "|---|---|---|---|---|"]
  for r in report.get("updates", []):
    if "skipped" in r:
      lines.append(f"| {r['agent']} | {r['batch']} | - | - | {r['skipped']} |")
      continue
    acc = r.get("accelerator_sgd_steps_per_sec")
    lines.append(f"| {r['agent']} | {r['batch']} | {r['cpu_sgd_steps_per_sec']:,.0f} | "
                 + (f"{acc:,.0f} | {r['accelerator_over_cpu']:.2f} |" if acc else "- | - |"))
  h = report.get("harness") or {"command": "(not reached)", "medians": {}}
  if "failed" in h:
    h = {"command": "failed: " + _cell(h["failed"]), "medians": {}}
  lines += ["", f"## Harness (`{h['command']}`)", "",
            "| variant | env steps/s | SGD steps/s |", "|---|---|---|"]
  for name, m in h["medians"].items():
    lines.append(f"| {name} | {m.get('env_steps_per_sec', 0):,.0f} | "
                 f"{m.get('opt_steps_per_sec', 0):,.0f} |")
  if report.get("runs"):
    lines += ["", "## Runs", "", "| run | env steps/s | SGD steps/s | best eval | note |",
              "|---|---|---|---|---|"]
    for name, r in report["runs"].items():
      if "skipped" in r or "failed" in r:
        why = r.get("skipped") or "failed: " + _cell(r["failed"])
        lines.append(f"| {name} | - | - | - | {why} |")
        continue
      note = (f"{r['frames_per_sec_per_cpu']:,.0f} frames/s per CPU core (Cleanba: "
              f"{r['cleanba_frames_per_sec_per_cpu']:,.0f})" if "frames_per_sec" in r
              else r.get("bottleneck") or "")
      lines.append(f"| {name} | {r['env_steps_per_sec']:,.0f} | {r['opt_steps_per_sec']:,.1f} | "
                   f"{r['best_eval_reward']} | {note} |")
  if dev["memory"]:
    lines += ["", "## Accelerator memory (bytes)", ""]
    lines += [f"- {d}: {m}" for d, m in dev["memory"].items()]
  return "\n".join(lines) + "\n"


def _cell(failure: str) -> str:
  """A failure's last line, fit for a Markdown table cell."""
  lines = failure.strip().splitlines() or ["(no output)"]
  return lines[-1][:200].replace("|", "\\|")


def write_report(report: dict, out: Path) -> None:
  """<out>.json and <out>.md as they stand: written after every part, so a check stopped by a
  time limit keeps what it measured."""
  out.parent.mkdir(parents=True, exist_ok=True)
  out.with_suffix(".json").write_text(json.dumps(report, indent=1, default=str))
  out.with_suffix(".md").write_text(markdown(report))


def main(args: Args) -> dict:
  start = time.perf_counter()
  accel = bool(accelerators())
  out = Path(args.out)
  print(f"accelerator check: {jax.default_backend()} {jax.devices()}"
        + ("" if accel else ": no accelerator on this machine, the CPU parts only"), flush=True)
  report = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "command": "python scripts/accelerator_check.py " + " ".join(sys.argv[1:]),
            "accelerator": accel, "devices": device_report()}
  with tempfile.TemporaryDirectory() as tmp:
    workdir = Path(tmp)
    report["updates"] = measure_updates(args)
    write_report(report, out)
    try:
      report["harness"] = run_harness(args, workdir)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
      print(f"  harness FAILED: {str(e)[-600:]}", flush=True)
      report["harness"] = {"failed": str(e)[-2000:]}
    write_report(report, out)
    if (accel or args.runs) and not args.quick:
      report["runs"] = {}
      measure_runs(args, workdir, report["devices"]["cpu_cores"], report, out)
  report["devices"] = device_report()  # (after the runs: the memory peaks they reached)
  report["seconds"] = time.perf_counter() - start
  write_report(report, out)
  print(f"report: {out.with_suffix('.json')}, {out.with_suffix('.md')} "
        f"({report['seconds']:.0f} s)", flush=True)
  return report


if __name__ == "__main__":
  final = main(tyro.cli(Args))
  failed = ("failed" in final["harness"]
            or any("failed" in r for r in final.get("runs", {}).values()))
  sys.exit(1 if failed else 0)

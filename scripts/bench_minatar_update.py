"""The SGD step alone of the DQN and PQN MinAtar presets, on one batch used again and again.

What `bench_minatar.py` cannot say by itself: whether a learner-bound run's SGD steps/s is
the network's own arithmetic or the loop around it. This times the preset agent's jitted
`update` (its own settings, the learning-rate annealing included, MinAtar's reference CNN)
called back to back on one random numpy batch of the preset's shape, with nothing else
running: no actor, no queue, no replay, no sampling. The batch goes from numpy into the
jitted call each time, as the learner's does (on a GPU that copy is part of the figure). A
run whose learner keeps this pace spends nothing on plumbing.

  DQN: `--updates-per-call` SGD steps of `--agent.batch-size` transitions per call (the
       preset's: 4 x 32).
  PQN: `--updates-per-call` iterations per call (the preset's 1: 128 envs x 32 steps, 2
       epochs x 32 minibatches of 128, after the Q(lambda) targets over the whole unroll).

Flags after --algo go to the preset (`--agent.batch-size 128`, `--agent.no-layer-norm`): the
cost of a setting, per SGD step and per sample.

  python scripts/bench_minatar_update.py --algo dqn
  python scripts/bench_minatar_update.py --algo dqn --calls 30 --agent.batch-size 128
  python scripts/bench_minatar_update.py --algo pqn --calls 5
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import jaxasync as ja  # noqa: E402
from jaxasync.collectors.unrolls import Unroll  # noqa: E402
from jaxasync.experiment import annealed_agent  # noqa: E402
from jaxasync.minatar import MinAtarEnvFactory  # noqa: E402
from jaxasync.train import dqn as dqn_job  # noqa: E402
from jaxasync.train import pqn as pqn_job  # noqa: E402


def random_obs(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
  """MinAtar-like boolean grids, ~10 % of cells on."""
  return rng.random(shape) < 0.1


def dqn_setup(preset_flags: list[str], env_id: str, rng: np.random.Generator):
  """The DQN preset's agent and one batch ``[k, B, ...]``; SGD steps and samples per call."""
  args = dqn_job.parse(["--preset", "minatar", "--env-id", env_id, *preset_flags])
  env = MinAtarEnvFactory(env_id)(1)
  agent = ja.DQN(annealed_agent(args), env.single_observation_space, env.single_action_space)
  k, b = args.run.updates_per_call, args.agent.batch_size
  shape = env.single_observation_space.shape
  batch = ja.Transition(obs=random_obs(rng, (k, b, *shape)),
                        action=rng.integers(0, env.single_action_space.n, (k, b)).astype(np.int32),
                        reward=np.zeros((k, b), np.float32),
                        discount=np.full((k, b), args.agent.data.gamma, np.float32),
                        next_obs=random_obs(rng, (k, b, *shape)))
  env.close()
  return agent, batch, k, k * b


def pqn_setup(preset_flags: list[str], env_id: str, rng: np.random.Generator):
  """The PQN preset's agent and one batch of unrolls ``[k, T + 1, N, ...]``; SGD steps and
  samples per call (each transition once per epoch)."""
  args = pqn_job.parse(["--preset", "minatar", "--env-id", env_id, *preset_flags])
  env = MinAtarEnvFactory(env_id)(1)
  agent = ja.PQN(annealed_agent(args), env.single_observation_space, env.single_action_space)
  # The learner concatenates --agent.batch-size unrolls along the env axis.
  k = args.run.updates_per_call
  t, n = args.agent.data.unroll_length, args.actors.num_envs * args.agent.batch_size
  shape = env.single_observation_space.shape
  batch = Unroll(obs=random_obs(rng, (k, t + 1, n, *shape)),
                 action=rng.integers(0, env.single_action_space.n, (k, t + 1, n)).astype(np.int32),
                 extras=None, reward=np.zeros((k, t + 1, n), np.float32),
                 discount=np.ones((k, t + 1, n), np.float32),
                 first=np.zeros((k, t + 1, n), bool), last=np.zeros((k, t + 1, n), bool))
  env.close()
  sgd = k * args.agent.num_epochs * args.agent.num_minibatches
  return agent, batch, sgd, k * args.agent.num_epochs * t * n


SETUPS = {"dqn": dqn_setup, "pqn": pqn_setup}


def main(argv: list[str] | None = None) -> dict:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--algo", choices=sorted(SETUPS), required=True)
  parser.add_argument("--env-id", default="MinAtar/Breakout-v1")
  parser.add_argument("--calls", type=int, default=100, help="update calls per timed window")
  parser.add_argument("--repeats", type=int, default=3, help="timed windows (median reported)")
  args, preset_flags = parser.parse_known_args(argv)
  rng = np.random.default_rng(0)
  agent, batch, sgd_per_call, samples_per_call = SETUPS[args.algo](preset_flags, args.env_id, rng)
  state = agent.init(jax.random.PRNGKey(0))
  state, metrics, _ = agent.update(state, batch)  # compile outside the timed windows
  jax.block_until_ready(metrics)
  seconds = []
  for _ in range(args.repeats):
    start = time.perf_counter()
    for _ in range(args.calls):
      state, metrics, _ = agent.update(state, batch)
    jax.block_until_ready(metrics)
    seconds.append((time.perf_counter() - start) / args.calls)
  per_call = float(np.median(seconds))
  result = {"algo": args.algo, "preset_flags": preset_flags, "sgd_steps_per_call": sgd_per_call,
            "sgd_steps_per_sec": sgd_per_call / per_call,
            "ms_per_sgd_step": per_call / sgd_per_call * 1e3,
            "us_per_sample": per_call / samples_per_call * 1e6}
  print(f"{args.algo} {' '.join(preset_flags)}: {result['sgd_steps_per_sec']:.1f} SGD steps/s, "
        f"{result['ms_per_sgd_step']:.2f} ms per SGD step, {result['us_per_sample']:.0f} us per "
        f"sample (median of {args.repeats} x {args.calls} calls, {os.cpu_count()} cores)")
  return result


if __name__ == "__main__":
  main()

"""The SGD step's cost of experiments/dqn.py's CartPole agent with and without its value bound.

  python scripts/bench_dqn_update.py --calls 500 --repeats 6

Times the jitted update (``--updates-per-call`` SGD steps of ``--batch-size`` per call, the
run's own settings) of the agent ``jaxasync.train.dqn.cartpole_agent()`` builds, once with
``bound_targets`` on (the default job) and once off, alternated bounded, unbounded, ... so
that both see the same machine; prints microseconds per SGD step (median, min, max over the
repeats) and the ratio per pair. The batch is CartPole-shaped: random observations, the
5-step reward and discount of a non-terminal item (so the bound is 100.40 and binds where
the target network's values exceed it).
"""

import argparse
import dataclasses
import time

import gymnasium as gym
import jax
import numpy as np

import jaxasync as ja
from jaxasync.train.dqn import cartpole_agent


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--calls", type=int, default=500, help="update calls per timed window")
  parser.add_argument("--repeats", type=int, default=6, help="alternated pairs of windows")
  parser.add_argument("--updates-per-call", type=int, default=4)
  parser.add_argument("--batch-size", type=int, default=128)
  args = parser.parse_args()

  obs_space = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
  agents = {}
  for name, bound in (("bounded", True), ("unbounded", False)):
    config = cartpole_agent()
    config = dataclasses.replace(config, batch_size=args.batch_size,
                                 loss=dataclasses.replace(config.loss, bound_targets=bound),
                                 learning_rate_decay_steps=50_000)
    agents[name] = ja.DQN(config, obs_space, gym.spaces.Discrete(2))
  rng = np.random.default_rng(0)
  k, b = args.updates_per_call, args.batch_size
  batch = ja.Transition(obs=rng.normal(size=(k, b, 4)).astype(np.float32),
                        action=rng.integers(0, 2, (k, b)).astype(np.int32),
                        reward=np.full((k, b), sum(0.99 ** i for i in range(5)), np.float32),
                        discount=np.full((k, b), 0.99 ** 5, np.float32),
                        next_obs=rng.normal(size=(k, b, 4)).astype(np.float32))
  states = {name: agent.init(jax.random.PRNGKey(0)) for name, agent in agents.items()}
  for name, agent in agents.items():  # compile outside the timed windows
    states[name], metrics, _ = agent.update(states[name], batch)
    jax.block_until_ready(metrics)
  us = {name: [] for name in agents}
  for _ in range(args.repeats):
    for name, agent in agents.items():
      t0 = time.perf_counter()
      for _ in range(args.calls):
        states[name], metrics, _ = agent.update(states[name], batch)
      jax.block_until_ready(metrics)
      us[name].append((time.perf_counter() - t0) / (args.calls * k) * 1e6)
  for name, figures in us.items():
    print(f"{name}: {np.median(figures):.1f} us per SGD step (median; min {min(figures):.1f}, "
          f"max {max(figures):.1f}) over {args.repeats} windows of {args.calls} calls")
  pairs = [round(x / y, 3) for x, y in zip(us["bounded"], us["unbounded"])]
  print(f"bounded / unbounded: {np.median(us['bounded']) / np.median(us['unbounded']):.3f} "
        f"(medians); per pair: {pairs}")


if __name__ == "__main__":
  main()

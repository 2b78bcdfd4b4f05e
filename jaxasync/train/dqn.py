"""DQN, synchronous or asynchronous, on any gymnasium env with Box observations and Discrete actions.

  python -m jaxasync.train dqn                         # CartPole-v1, the default arrangement
  python -m jaxasync.train dqn --mode sync --seed 3
  python -m jaxasync.train dqn --mode thread --num-actors 2
  python -m jaxasync.train dqn --seed 3 agent.loss:q-learning --agent.loss.num-q-networks 2
  python -m jaxasync.train dqn agent.target-update:hard-copy --agent.target-update.period 500
  python -m jaxasync.train dqn --help                  # every flag but a subcommand's own
  python -m jaxasync.train dqn agent.loss:munchausen --help   # the loss's flags

Logs (TensorBoard), checkpoints (<logdir>/best, <logdir>/<opt_steps>, <logdir>/final),
<logdir>/config.json (these flags) and <logdir>/summary.json go under --logdir. The run's
and the actors' flags are jaxasync.RunConfig's and jaxasync.ActorsConfig's; the agent's,
its replay's included, are --agent.*. The loss (agent.loss:q-learning, agent.loss:munchausen,
agent.loss:categorical; default: Munchausen) and the target update
(agent.target-update:polyak, agent.target-update:hard-copy; default: Polyak) are subcommands,
given after every other flag, each followed by its own flags (--agent.loss.*).
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, ClassVar

import jaxasync as ja
from jaxasync import experiment


def cartpole_agent() -> ja.DQNConfig:
  # Munchausen targets with double Q and LayerNorm: plain double DQN collapsed after solving
  # CartPole in about one run in eight, its Q-values above the largest possible return;
  # Munchausen's log-policy bonus keeps successive policies close, but alone still failed about
  # one run in five; its soft value weighted by the online network's policy (double Q),
  # normalised features (LayerNorm, which keeps bootstrapped targets from feeding back into
  # ever larger activations) and 5-step returns held more seeds (docs/bench_learning_results.md
  # has the tables): with them, values converge sooner, so fewer greedy evaluations come from
  # half-learnt Q-values. Actors: 64 sampled items per inserted transition (the lock-step run:
  # one SGD step of 128 per env step).
  return ja.DQNConfig(loss=ja.Munchausen(double_q=True), layer_norm=True,
                      data=ja.ReplayConfig(n_step=5, samples_per_insert=64.0))


@dataclasses.dataclass
class Args(experiment.AnnealedRunArgs):
  """DQN's flags: the run's, the actors', the learning-rate annealing and the agent's
  (--agent.*, its replay's included)."""

  algo: ClassVar[str] = "dqn"

  run: Annotated[ja.RunConfig, experiment.Flat] = dataclasses.field(
      default_factory=lambda: ja.RunConfig(save_interval=10_000))
  agent: ja.DQNConfig = dataclasses.field(default_factory=cartpole_agent)
  """the agent (DQNConfig): Munchausen double DQN with LayerNorm (agent.loss:q-learning etc.)."""


def main(args: Args) -> dict:
  return experiment.run(args, "DQN", ja.DQN, experiment.annealed_agent(args))


def cli(argv: list[str] | None = None) -> None:
  """``python -m jaxasync.train dqn [flags]``: parses ``argv`` (default: the command line)
  and runs, with one ``error:`` line for bad input or a failed run."""
  experiment.run_cli(lambda: main(experiment.parse_args(Args, argv, __doc__)))

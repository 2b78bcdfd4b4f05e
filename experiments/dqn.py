"""DQN, synchronous or asynchronous, on any gymnasium env with Box observations and Discrete actions.

  python experiments/dqn.py                         # CartPole-v1, the default arrangement
  python experiments/dqn.py --mode sync --seed 3
  python experiments/dqn.py --mode async --async.actor-mode thread --async.num-actors 2
  python experiments/dqn.py --help                  # every flag

Logs (TensorBoard), checkpoints (<logdir>/best, <logdir>/<opt_steps>, <logdir>/final),
<logdir>/config.json (these flags) and <logdir>/summary.json go under --logdir. The run's
flags are jaxasync.experiment.RunArgs; the agent's are --agent.*.
"""

from __future__ import annotations

import dataclasses

import tyro

import jaxasync as ja
from jaxasync import experiment


@dataclasses.dataclass
class Args(experiment.RunArgs):
  """DQN's flags: the run's, the learning-rate annealing and the agent's (--agent.*)."""

  # Annealed, the final params settle instead of being shaken by full-size Adam steps to the
  # end (scripts/bench_learning.py measures the difference).
  anneal_lr: bool = True
  """anneal the LR to --agent.learning-rate-end over --max-opts if no LR decay steps are set."""
  # Munchausen targets with double Q and LayerNorm: plain double DQN collapsed after solving
  # CartPole in about one run in eight, its Q-values above the largest possible return;
  # Munchausen's log-policy bonus keeps successive policies close, but alone still failed about
  # one run in five; its soft value weighted by the online network's policy (double Q),
  # normalised features (LayerNorm, which keeps bootstrapped targets from feeding back into
  # ever larger activations) and 5-step returns held more seeds (docs/bench_learning_results.md
  # has the tables).
  agent: ja.DQNConfig = dataclasses.field(
      default_factory=lambda: ja.DQNConfig(munchausen=True, layer_norm=True))
  """the agent (DQNConfig): Munchausen double DQN with LayerNorm (--agent.no-munchausen etc.)."""


def main(args: Args) -> dict:
  agent = experiment.anneal_over_opts(args.agent, args.anneal_lr, args.max_opts)
  return experiment.run(args, "DQN", ja.DQN, agent)


if __name__ == "__main__":
  experiment.run_cli(lambda: main(tyro.cli(Args)))

"""SAC, synchronous or asynchronous, on any gymnasium env with Box observations and a bounded
one-axis Box of actions.

  python -m jaxasync.train sac                          # Pendulum-v1, the default arrangement
  python -m jaxasync.train sac --mode sync --seed 3
  python -m jaxasync.train sac --mode thread
  python -m jaxasync.train sac --env-id MountainCarContinuous-v0 --max-env-steps 50000
  python -m jaxasync.train sac --help                   # every flag

The run's and the actors' flags are jaxasync.train.dqn's (the same loop, checkpoints and
summary); the agent's, its replay's included, are --agent.* (SACConfig). Logs, checkpoints and
<logdir>/summary.json go under --logdir.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, ClassVar

import jaxasync as ja
from jaxasync import experiment


def pendulum_agent() -> ja.SACConfig:
  # 128x128 rather than SB3's 256x256: a quarter of the FLOPs per SGD step on a CPU learner
  # (1.1 vs 4.1 ms with a batch of 128 vs 256 here), and Pendulum does not need more. Actors
  # keep the sync run's replay ratio (one SGD step of --agent.batch-size per env step).
  return ja.SACConfig(hidden_sizes=(128, 128), batch_size=128,
                      data=ja.ReplayConfig(n_step=1, warmup_period=500, samples_per_insert=128.0))


def pendulum_run() -> ja.RunConfig:
  # Pendulum's episode returns range from about 0 to -400 with the start state, so a 10-episode
  # mean moves by +-30 between evaluations of the same policy; 50 episodes cost ~0.2 s here.
  return ja.RunConfig(max_opts=20_000, max_env_steps=20_000, eval_episodes=50,
                      save_interval=5_000)


@dataclasses.dataclass
class Args(experiment.RunArgs):
  """SAC's flags: the run's and the actors' (as jaxasync.train.dqn's) and the agent's
  (--agent.*, its replay's included)."""

  algo: ClassVar[str] = "sac"

  env_id: str = "Pendulum-v1"
  """gymnasium id, or 'module:EnvName-v0' (imports module)."""
  run: Annotated[ja.RunConfig, experiment.Flat] = dataclasses.field(
      default_factory=pendulum_run)
  agent: ja.SACConfig = dataclasses.field(default_factory=pendulum_agent)


def main(args: Args) -> dict:
  return experiment.run(args, "SAC", ja.SAC, args.agent)


def cli(argv: list[str] | None = None) -> None:
  """``python -m jaxasync.train sac [flags]``: parses ``argv`` (default: the command line)
  and runs, with one ``error:`` line for bad input or a failed run."""
  experiment.run_cli(lambda: main(experiment.parse_args(Args, argv, __doc__)))

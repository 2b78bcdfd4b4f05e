"""SAC, synchronous or asynchronous, on any gymnasium env with Box observations and a bounded
one-axis Box of actions.

  python experiments/sac.py                          # Pendulum-v1, the default arrangement
  python experiments/sac.py --mode sync --seed 3
  python experiments/sac.py --mode async --async.actor-mode thread
  python experiments/sac.py --env-id MountainCarContinuous-v0 --max-env-steps 50000
  python experiments/sac.py --help                   # every flag

The run's flags are jaxasync.experiment.RunArgs, as experiments/dqn.py's (the same loop, replay, checkpoints and summary);
the agent's are --agent.* (SACConfig). Logs, checkpoints and <logdir>/summary.json go under
--logdir.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated

import tyro

import jaxasync as ja
from jaxasync import experiment


def pendulum_agent() -> ja.SACConfig:
  # 128x128 rather than SB3's 256x256: a quarter of the FLOPs per SGD step on a CPU learner
  # (1.1 vs 4.1 ms with a batch of 128 vs 256 here), and Pendulum does not need more.
  return ja.SACConfig(hidden_sizes=(128, 128), batch_size=128)


@dataclasses.dataclass
class Args(experiment.RunArgs):
  """SAC's flags: the run's (as experiments/dqn.py's) and the agent's (--agent.*)."""

  env_id: str = "Pendulum-v1"
  """gymnasium id, or 'module:EnvName-v0' (imports module)."""
  n_step: int = 1
  """n-step returns (1: the paper's soft Bellman target)."""
  max_opts: int = 20_000
  """stop after this many SGD steps."""
  max_env_steps: int | None = 20_000
  """stop after this many env steps (all sub-envs together); None: no limit."""
  warmup_period: int = 500
  """env steps collected before the first SGD step."""
  # Pendulum's episode returns range from about 0 to -400 with the start state, so a 10-episode
  # mean moves by +-30 between evaluations of the same policy; 50 episodes cost ~0.2 s here.
  eval_episodes: int = 50
  """episodes per evaluation (its return is their mean)."""
  logdir: str = "runs/sac"
  """where TensorBoard logs, checkpoints and summary.json go; refused if it holds another run."""
  save_interval: int = 5_000
  """SGD steps between numbered checkpoints; 0: none (best/ and final/ are still saved)."""
  agent: ja.SACConfig = dataclasses.field(default_factory=pendulum_agent)
  async_: Annotated[ja.AsyncConfig, tyro.conf.arg(name="async")] = dataclasses.field(
      # One actor process with 4 envs; the replay ratio of the sync run (one SGD step of
      # --agent.batch-size per env step); params published every 10 SGD steps.
      default_factory=lambda: ja.AsyncConfig(envs_per_actor=4, samples_per_insert=128.0,
                                             sync_interval=10))


def main(args: Args) -> dict:
  return experiment.run(args, "SAC", ja.SAC, args.agent)


if __name__ == "__main__":
  experiment.run_cli(lambda: main(tyro.cli(Args, description=__doc__)))

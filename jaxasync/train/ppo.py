"""PPO, synchronous or asynchronous (Sebulba-style), on any gymnasium env with Box observations
and Discrete actions.

  python -m jaxasync.train ppo                         # CartPole-v1, one actor process
  python -m jaxasync.train ppo --mode sync --seed 3    # lock-step: every unroll from the newest params
  python -m jaxasync.train ppo --agent.num-epochs 4 --agent.num-minibatches 4
  python -m jaxasync.train ppo --help                  # every flag

One SGD step of the loop is one PPO iteration: --agent.num-epochs passes of
--agent.num-minibatches minibatches over --agent.batch-size unrolls. The ratio is taken
against the policy the actor acted with, so unrolls from older params (async) are clipped
like any other; those older than --agent.max-policy-lag iterations are dropped. The run's
and the actors' flags are jaxasync.train.impala's.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, ClassVar

import tyro

import jaxasync as ja
from jaxasync import experiment


def cartpole_agent() -> ja.PPOConfig:
  # RL Zoo's tuned CartPole-v1 PPO (8 envs x 32 steps, 20 epochs of one 256 minibatch,
  # gamma 0.98, GAE 0.8, no entropy bonus, lr annealed linearly; the clip stays 0.2) on tanh
  # torsos with orthogonal init (CleanRL's, the "37 details"): with ReLU and Flax's init 9 of
  # 10 tuning seeds held and 7 stayed at 500 once there; with tanh 10 and 10
  # (docs/bench_learning_results.md, issue 28).
  return ja.PPOConfig(batch_size=1, gamma=0.98, gae_lambda=0.8, learning_rate=1e-3,
                      num_epochs=20, num_minibatches=1, entropy_cost=0.0, activation="tanh",
                      orthogonal_init=True,
                      data=ja.UnrollConfig(unroll_length=32, max_policy_lag=8))


def cartpole_run() -> ja.RunConfig:
  # One SGD step of the loop is one PPO iteration: evaluations, records and saves count those.
  return ja.RunConfig(max_opts=1_000_000, max_env_steps=150_000, updates_per_call=1,
                      eval_interval=20, record_interval=10, save_interval=200)


@dataclasses.dataclass
class Args(experiment.AnnealedRunArgs):
  """PPO's flags: the run's and the actors' (as jaxasync.train.impala's) and the agent's
  (--agent.*)."""

  algo: ClassVar[str] = "ppo"

  run: Annotated[ja.RunConfig, experiment.Flat] = dataclasses.field(
      default_factory=cartpole_run)
  actors: Annotated[ja.ActorsConfig, experiment.Flat] = dataclasses.field(
      default_factory=experiment.on_policy_actors)
  agent: ja.PPOConfig = dataclasses.field(default_factory=cartpole_agent)


def main(args: Args) -> dict:
  return experiment.run(args, "PPO", ja.PPO, experiment.annealed_agent(args))


def cli(argv: list[str] | None = None) -> None:
  """``python -m jaxasync.train ppo [flags]``: parses ``argv`` (default: the command line)
  and runs, with one ``error:`` line for bad input or a failed run."""
  experiment.run_cli(lambda: main(tyro.cli(Args, args=argv, description=__doc__)))

"""PPO, synchronous or asynchronous (Sebulba-style), on any gymnasium env with Box observations
and Discrete actions.

  python experiments/ppo.py                         # CartPole-v1, one actor process
  python experiments/ppo.py --mode sync --seed 3    # lock-step: every unroll from the newest params
  python experiments/ppo.py --agent.num-epochs 4 --agent.num-minibatches 4
  python experiments/ppo.py --help                  # every flag

One SGD step of the loop is one PPO iteration: --agent.num-epochs passes of
--agent.num-minibatches minibatches over --agent.batch-size unrolls. The ratio is taken
against the policy the actor acted with, so unrolls from older params (async) are clipped
like any other; those older than --max-policy-lag iterations are dropped. The run's flags
are jaxasync.experiment.OnPolicyArgs, as experiments/impala.py's.
"""

from __future__ import annotations

import dataclasses

import tyro

import jaxasync as ja
from jaxasync import experiment


def cartpole_agent() -> ja.PPOConfig:
  # RL Zoo's tuned CartPole-v1 PPO (8 envs x 32 steps, 20 epochs of one 256 minibatch,
  # gamma 0.98, GAE 0.8, no entropy bonus, lr annealed linearly; the clip stays 0.2) on tanh
  # torsos with orthogonal init (CleanRL's, the "37 details"): with ReLU and Flax's init 9 of
  # 10 tuning seeds held and 7 stayed at 500 once there; with tanh 10 and 10
  # (docs/bench_learning_results.md, issue 28).
  return ja.PPOConfig(unroll_length=32, batch_size=1, gamma=0.98, gae_lambda=0.8,
                      learning_rate=1e-3, num_epochs=20, num_minibatches=1, entropy_cost=0.0,
                      activation="tanh", orthogonal_init=True)


@dataclasses.dataclass
class Args(experiment.OnPolicyArgs):
  """PPO's flags: the run's (as experiments/impala.py's) and the agent's (--agent.*)."""

  max_env_steps: int | None = 150_000
  """stop after this many env steps (all sub-envs together); None: no limit."""
  max_policy_lag: int | None = 8
  """drop unrolls made by params more than this many iterations old (counted); None: keep all."""
  eval_interval: int = 20
  """iterations between evaluations (the final params are evaluated too); 0: none."""
  record_interval: int = 10
  """iterations between logged metrics (TensorBoard, and console with --no-progress); 0: none."""
  save_interval: int = 200
  """iterations between numbered checkpoints; 0: none (best/ and final/ are still saved)."""
  logdir: str = "runs/ppo"
  """where TensorBoard logs, checkpoints and summary.json go; refused if it holds another run."""
  agent: ja.PPOConfig = dataclasses.field(default_factory=cartpole_agent)


def main(args: Args) -> dict:
  return experiment.run(args, "PPO", ja.PPO, experiment.anneal_over_env_steps(args))


if __name__ == "__main__":
  experiment.run_cli(lambda: main(tyro.cli(Args, description=__doc__)))

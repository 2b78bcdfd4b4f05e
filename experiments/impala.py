"""IMPALA (V-trace), synchronous or asynchronous, on any gymnasium env with Box observations
and Discrete actions.

  python experiments/impala.py                        # CartPole-v1, one actor process
  python experiments/impala.py --mode sync --seed 3   # lock-step: every unroll from the newest params
  python experiments/impala.py --async.num-actors 2 --max-policy-lag 8
  python experiments/impala.py --help                 # every flag

Actors push unrolls of --agent.unroll-length steps of their --async.envs-per-actor sub-envs
with the behaviour logits; the learner takes --agent.batch-size unrolls per SGD step, oldest
first, each once, and drops those older than --max-policy-lag SGD steps. The run's flags are
jaxasync.experiment.OnPolicyArgs (experiments/dqn.py's, less the replay's and the n-step
return's); the agent's are --agent.*.
"""

from __future__ import annotations

import dataclasses

import tyro

import jaxasync as ja
from jaxasync import experiment


def cartpole_agent() -> ja.IMPALAConfig:
  # Many small updates, as A2C's tuned CartPole (RL Zoo: 8 envs x 5 steps, ~7e-4, no entropy
  # bonus, tanh torsos with orthogonal init, a gradient clip that binds): one unroll of 5 steps
  # x 8 envs per SGD step, Adam 7e-4 annealed to 0, global-norm clip 1. The earlier preset (2
  # unrolls of 16 steps, 5e-4, ReLU, clip 40) took 1,172 SGD steps in 300k env steps and its
  # policy never sharpened (entropy ~0.58; 1 of 10 fresh seeds held). With ReLU torsos these
  # small updates collapsed. Clip 40 held 8 of fresh seeds 100-109 (two fell after gradient-norm
  # spikes of 20-40); clip 1 held every tuning seed and 17 of 100-119, its three failures a
  # value stuck at the return bound (the clip shrinks the rare batches holding an episode's
  # end). docs/bench_learning_results.md, issue 28.
  return ja.IMPALAConfig(unroll_length=5, batch_size=1, learning_rate=7e-4, entropy_cost=0.0,
                         activation="tanh", orthogonal_init=True, max_grad_norm=1.0)


@dataclasses.dataclass
class Args(experiment.OnPolicyArgs):
  """IMPALA's flags: the run's (as experiments/dqn.py's, less replay and n-step) and the
  agent's (--agent.*)."""

  max_env_steps: int | None = 300_000
  """stop after this many env steps (all sub-envs together); None: no limit."""
  logdir: str = "runs/impala"
  """where TensorBoard logs, checkpoints and summary.json go; refused if it holds another run."""
  agent: ja.IMPALAConfig = dataclasses.field(default_factory=cartpole_agent)


def main(args: Args) -> dict:
  return experiment.run(args, "IMPALA", ja.IMPALA, experiment.anneal_over_env_steps(args))


if __name__ == "__main__":
  experiment.run_cli(lambda: main(tyro.cli(Args, description=__doc__)))

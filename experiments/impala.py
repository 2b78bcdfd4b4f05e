"""IMPALA (V-trace), synchronous or asynchronous, on any gymnasium env with Box observations
and Discrete actions.

  python experiments/impala.py                        # CartPole-v1, one actor process
  python experiments/impala.py --mode sync --seed 3   # lock-step: every unroll from the newest params
  python experiments/impala.py --async.num-actors 2 --max-policy-lag 8
  python experiments/impala.py --help                 # every flag

Actors push unrolls of --agent.unroll-length steps of their --async.envs-per-actor sub-envs
with the behaviour logits; the learner takes --agent.batch-size unrolls per SGD step, oldest
first, each once, and drops those older than --max-policy-lag SGD steps. The run's flags are
experiments/dqn.py's, less the replay's and the n-step return's; the agent's are --agent.*.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated

import tyro

import jaxasync as ja

import dqn as dqn_experiment  # experiments/dqn.py: a script's own directory is on sys.path

Hidden = tyro.conf.Suppress  # replay and n-step settings: an on-policy agent has neither


@dataclasses.dataclass
class OnPolicyArgs(dqn_experiment.RunArgs):
  """The run's flags for agents that learn from unrolls in a queue (IMPALA, PPO)."""

  gamma: Hidden[float] = 0.99  # the agent's own --agent.gamma is the discount
  n_step: Hidden[int] = 1
  reward_clip: Hidden[float] = 0.0
  warmup_period: Hidden[int] = 1_000
  opt_interval: Hidden[float] = 1.0
  replay_capacity: Hidden[int] = 100_000
  num_envs: int = 8
  """sub-envs of the sync actor (async: --async.envs-per-actor); an unroll holds all of them."""
  max_opts: int = 1_000_000
  """stop after this many SGD steps (PPO: iterations)."""
  max_policy_lag: int | None = 50
  """drop unrolls made by params more than this many SGD steps old (counted); None: keep all."""
  eval_interval: int = 100
  """SGD steps between evaluations (the final params are evaluated too); 0: none."""
  record_interval: int = 50
  """SGD steps between logged metrics (TensorBoard, and console with --no-progress); 0: none."""
  save_interval: int = 1_000
  """SGD steps between numbered checkpoints; 0: none (best/ and final/ are still saved)."""
  updates_per_call: int = 1
  """SGD steps per jitted update call, each on its own batch of unrolls."""
  anneal_lr: bool = True
  """anneal the LR linearly to 0 over --max-env-steps if no --agent.learning-rate-decay-steps."""
  async_: Annotated[ja.AsyncConfig, tyro.conf.arg(name="async")] = dataclasses.field(
      # One actor process with 8 envs, pinned: learner on core 0, actors on the others (the
      # actor then keeps 1.0x its lone pace beside the learner, 0.63x unpinned: README,
      # Performance); params published after every SGD step (on-policy learning wants the
      # freshest behaviour policy); no replay ratio: each unroll is used once.
      default_factory=lambda: ja.AsyncConfig(envs_per_actor=8, sync_interval=1, pin_cpus=True))


def agent_config(args: OnPolicyArgs):
  """``--agent.*`` with ``--anneal-lr`` applied: the decay spans the SGD steps (PPO:
  iterations) that ``--max-env-steps`` pays for, each taking ``unroll_length x batch_size``
  steps of every sub-env of an actor."""
  agent = args.agent
  if not args.anneal_lr or agent.learning_rate_decay_steps or args.max_env_steps is None:
    return agent
  envs = args.num_envs if dqn_experiment.resolved_mode(args) == "sync" else args.async_.envs_per_actor
  steps = max(1, args.max_env_steps // (agent.unroll_length * agent.batch_size * envs))
  return dataclasses.replace(agent, learning_rate_decay_steps=steps)


def cartpole_agent() -> ja.IMPALAConfig:
  # Two unrolls of 16 steps x 8 envs per SGD step, Adam 5e-4 annealed to 0, the paper's
  # gradient clip of 40: a clip of 1 let the value's large gradients (returns up to ~100)
  # use up the global norm and starve the policy's (scripts/bench_learning.py, README).
  return ja.IMPALAConfig(unroll_length=16, batch_size=2, learning_rate=5e-4, max_grad_norm=40.0)


@dataclasses.dataclass
class Args(OnPolicyArgs):
  """IMPALA's flags: the run's (as experiments/dqn.py's, less replay and n-step) and the
  agent's (--agent.*)."""

  max_env_steps: int | None = 300_000
  """stop after this many env steps (all sub-envs together); None: no limit."""
  logdir: str = "runs/impala"
  """where TensorBoard logs, checkpoints and summary.json go; refused if it holds another run."""
  agent: ja.IMPALAConfig = dataclasses.field(default_factory=cartpole_agent)


def main(args: Args) -> dict:
  return dqn_experiment.run(args, "IMPALA", agent_cls=ja.IMPALA, agent_cfg=agent_config(args))


if __name__ == "__main__":
  dqn_experiment.run_cli(lambda: main(tyro.cli(Args, description=__doc__)))

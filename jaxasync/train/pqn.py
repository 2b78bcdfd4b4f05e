"""PQN (Q(lambda) without replay or target network), synchronous or asynchronous, on any
gymnasium env with Box observations and Discrete actions.

  python -m jaxasync.train pqn                          # --preset cartpole: CartPole-v1, lock-step
  python -m jaxasync.train pqn --mode process           # one actor process beside the learner (lag 1)
  python -m jaxasync.train pqn --agent.q-lambda 0.9 --agent.num-epochs 2
  python -m jaxasync.train pqn --preset minatar         # purejaxql's MinAtar settings, Breakout
  python -m jaxasync.train pqn --preset minatar --env-id MinAtar/Asterix-v1
  python -m jaxasync.train pqn --preset minatar --help  # every flag, with that preset's defaults

One SGD step of the loop is one PQN iteration: Q(lambda) returns of --agent.batch-size unrolls
of --agent.unroll-length steps from the learner's current network, then --agent.num-epochs
passes of --agent.num-minibatches minibatches. Unrolls older than --agent.max-policy-lag
iterations are dropped. The run's and the actors' flags are jaxasync.train.impala's. A
preset only sets defaults: any flag given after it overrides them.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, ClassVar, Literal

import jaxasync as ja
from jaxasync import experiment


def cartpole_agent() -> ja.PQNConfig:
  # CleanRL's pqn.py for CartPole-v1: 512 env steps per iteration (there 4 envs x 128 steps,
  # here 16 envs x 32: the same data in fewer policy calls), 4 epochs x 4 minibatches, lambda
  # 0.65, gradient clip 10, a LayerNorm MLP, and the time limit ending the return as
  # CleanRL's done flag does (bootstrapped through it, once every episode lasts 500 steps
  # both actions' values sit at the same bound and the greedy policy drifts).
  # Different from CleanRL (docs/bench_learning_results.md has the runs): epsilon 1 -> 0.05 over
  # 150k env steps, not half of 500k (the greedy policy passes 475 sooner and holds as often;
  # purejaxql's 100k got there sooner still but dipped after it on more seeds), Adam where it
  # uses RAdam, at twice its step size (CleanRL's left the values swinging into the annealed
  # end; a smaller step or a larger iteration learnt too little), 128x128 layers where it has
  # 120 and 84, and Huber's loss: the returns of the last pairs before a time limit fall up to
  # ~100 short of what their states are worth elsewhere, and squared, those few errors made the
  # minibatch's gradient (loss spikes to 67, the clip binding) and swung the greedy policy after
  # it had learnt.
  return ja.PQNConfig(learning_rate=5e-4, q_lambda=0.65, num_epochs=4, num_minibatches=4,
                      max_grad_norm=10.0, eps_decay_steps=150_000, huber_delta=1.0,
                      truncation_as_termination=True,
                      data=ja.UnrollConfig(unroll_length=32, max_policy_lag=4))


def cartpole_actors() -> ja.ActorsConfig:
  # Lock-step by default; --mode process for the asynchronous run, which takes the rest:
  # params published after every iteration (an unroll older than max_policy_lag is dropped,
  # so publishing every 50 SGD steps, the class default, starved the learner), and a queue
  # of one unroll, so that the unrolls in flight (one in the queue, two calls' worth at the
  # learner, one being collected) stay within max_policy_lag: with the default queue of 4 the
  # actor ran ahead, a sixth of the unrolls were dropped as stale, and the learning rate,
  # annealed over the iterations 500k env steps pay for, never reached 0
  # (docs/bench_learning_results.md).
  return ja.ActorsConfig(mode="sync", num_envs=16, sync_interval=1, queue_size=1)


def cartpole_run() -> ja.RunConfig:
  # One SGD step of the loop is one PQN iteration (512 env steps): evaluations every 10k env
  # steps.
  return ja.RunConfig(max_opts=1_000_000, max_env_steps=500_000, updates_per_call=1,
                      eval_interval=20, record_interval=10, save_interval=200)


Preset = Literal["cartpole", "minatar"]


@dataclasses.dataclass
class Args(experiment.AnnealedRunArgs):
  """PQN's flags: the run's and the actors' (as jaxasync.train.impala's) and the agent's
  (--agent.*, its unrolls' included). The defaults are the cartpole preset's."""

  algo: ClassVar[str] = "pqn"

  preset: Preset = "cartpole"
  """sets every other flag's default: CleanRL's CartPole; purejaxql's MinAtar."""

  run: Annotated[ja.RunConfig, experiment.Flat] = dataclasses.field(
      default_factory=cartpole_run)
  actors: Annotated[ja.ActorsConfig, experiment.Flat] = dataclasses.field(
      default_factory=cartpole_actors)
  agent: ja.PQNConfig = dataclasses.field(default_factory=cartpole_agent)


def minatar_preset() -> Args:
  """The MinAtar games with purejaxql's PQN settings (``config/alg/pqn_minatar.yaml``, adapted
  there from their Atari settings): 128 envs x 32 steps per iteration, 2 epochs x 32
  minibatches, Adam 5e-4 annealed linearly to 0, gradient clip 10, lambda 0.65, gamma 0.99,
  epsilon 1 -> 0.05 over the first 10 % of 10M env steps, greedy evaluation; on MinAtar's
  reference network (conv 3x3x16 + dense 128, ``MinAtarCNN``) with LayerNorm. purejaxql
  steps MinAtar's JAX port (gymnax) on an accelerator; here one actor process steps the 128
  envs of the ``minatar`` package (sticky actions 0.1, episodes truncated at 27k steps:
  ``MinAtarEnvFactory``), about ten times slower per env step, so 10M env steps is a long run on
  a CPU: pass --max-env-steps or --duration for less.
  """
  agent = ja.PQNConfig(hidden_sizes=(128,), learning_rate=5e-4, q_lambda=0.65, num_epochs=2,
                       num_minibatches=32, max_grad_norm=10.0, eps_decay_steps=1_000_000,
                       data=ja.UnrollConfig(unroll_length=32, max_policy_lag=4))
  run = ja.RunConfig(max_opts=1_000_000, max_env_steps=10_000_000, updates_per_call=1,
                     eval_interval=50, record_interval=10, save_interval=250)
  return Args(preset="minatar", env_id="MinAtar/Breakout-v1", agent=agent, run=run,
              actors=ja.ActorsConfig(mode="auto", num_envs=128, sync_interval=1, queue_size=1))


PRESETS = {"cartpole": Args, "minatar": minatar_preset}


def parse(argv: list[str] | None = None) -> Args:
  """Reads ``--preset`` first, then parses every flag with that preset's values as defaults."""
  return experiment.parse_with_presets(PRESETS, argv, __doc__)


def main(args: Args) -> dict:
  return experiment.run(args, f"PQN, preset {args.preset}", ja.PQN,
                        experiment.annealed_agent(args))


def cli(argv: list[str] | None = None) -> None:
  """``python -m jaxasync.train pqn [flags]``: parses ``argv`` (default: the command line)
  and runs, with one ``error:`` line for bad input or a failed run."""
  experiment.run_cli(lambda: main(parse(argv)))

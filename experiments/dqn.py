"""DQN, synchronous or asynchronous, on any gymnasium env with Box observations and Discrete actions.

  python experiments/dqn.py                         # CartPole-v1, the default arrangement
  python experiments/dqn.py --mode sync --seed 3
  python experiments/dqn.py --mode async --async.actor-mode thread --async.num-actors 2
  python experiments/dqn.py --help                  # every flag

Logs (TensorBoard), checkpoints (<logdir>/best, <logdir>/<opt_steps>, <logdir>/final) and
<logdir>/summary.json go under --logdir.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Annotated, Any, Callable, Literal

import tyro

import jaxasync as ja
from jaxasync.minatar import is_minatar_id


def default_mode() -> str:
  """Async (an actor process beside the learner, see ``Args.async_``) when there are >= 2
  cores, else sync: with one core there is nothing to overlap. (README, 'Choosing a mode',
  has the figures.)"""
  return "async" if (os.cpu_count() or 1) >= 2 else "sync"


@dataclasses.dataclass
class RunArgs:
  """The flags of a run, whatever the agent (experiments/rainbow.py and sac.py reuse them)."""

  # Each field's docstring is its --help text: one line each (tyro keeps the line breaks of a
  # field docstring), the longer story in a comment above the field.

  # A MinAtar id needs pip install 'jaxasync[minatar]' (the error says so).
  env_id: str = "CartPole-v1"
  """gymnasium id, 'module:EnvName-v0' (imports module), or MinAtar id ('MinAtar/Breakout-v1')."""
  eval_env_id: str | None = None
  """env id to evaluate on; None: --env-id."""
  mode: Literal["auto", "sync", "async"] = "auto"
  """'auto': async (one actor process) on >= 2 cores, sync on one core."""
  seed: int = 0
  """seeds envs, network init, exploration and replay sampling."""
  num_envs: int = 4
  """sub-envs of the sync training env (async: --async.envs-per-actor)."""
  gamma: float = 0.99
  """discount factor per env step."""
  # 5, not 3: with LayerNorm and double Munchausen targets, 5-step returns held 19 of 20 sync
  # CartPole seeds (10-29) and their evaluations dipped less often after first reaching 475
  # (docs/bench_learning_results.md, issue 28): values converge sooner, so fewer greedy
  # evaluations come from half-learnt Q-values.
  n_step: int = 5
  """n-step returns (5: failures reach the Q-values five times sooner than with 1)."""
  # Clipped for learning only: episode returns and evaluations stay the game's score.
  reward_clip: float = 0.0
  """clip each env reward to [-c, c] before the n-step sum (Atari: 1); 0: none."""
  max_opts: int = 50_000
  """stop after this many SGD steps."""
  max_env_steps: int | None = None
  """stop after this many env steps (all sub-envs together); None: no limit."""
  duration: float | None = None
  """stop after this many wall-clock seconds; None: no limit."""
  target_eval_reward: float | None = None
  """stop once an evaluation's mean return reaches this; None: never."""
  warmup_period: int = 1_000
  """env steps collected before the first SGD step."""
  opt_interval: float = 1.0
  """sync only: env steps per SGD step (async: --async.samples-per-insert sets the ratio)."""
  updates_per_call: int = 4
  """SGD steps per jitted update call (one dispatch to the device)."""
  replay_capacity: int = 100_000
  """transitions the replay holds (the oldest go first)."""
  eval_interval: int = 1_000
  """SGD steps between evaluations (the final params are evaluated too); 0: none."""
  eval_episodes: int = 10
  """episodes per evaluation (its return is their mean)."""
  record_interval: int = 500
  """SGD steps between logged metrics (TensorBoard, and console with --no-progress); 0: none."""
  save_interval: int = 10_000
  """SGD steps between numbered checkpoints; 0: none (best/ and final/ are still saved)."""
  logdir: str = "runs/dqn"
  """where TensorBoard logs, checkpoints and summary.json go; refused if it holds another run."""
  overwrite: bool = False
  """delete the run already in --logdir (its checkpoints, summary and event files) first."""
  keep_checkpoints: int = 5
  """numbered checkpoints kept, the newest (best/ and final/ always stay); 0 keeps all."""
  resume: bool = False
  """continue the run in --logdir from its newest complete checkpoint (replay included)."""
  resume_from: str | None = None
  """continue from this checkpoint directory instead (implies --resume)."""
  # None: saved when the replay is at most 4 GiB and the disk has room for it twice over.
  save_replay: bool | None = None
  """checkpoints hold the replay (and its priorities), for --resume; None: when it fits."""
  progress: bool = True
  """show a progress bar (--no-progress: print metrics lines instead)."""
  # The first N of jax.devices(); the batch is global (each device takes batch / N items), so
  # the replay ratio and learning figures do not change with N. Actors stay on the CPU.
  learner_devices: int | None = None
  """devices the learner's update is split over, data-parallel; None: all accelerators, or the CPU."""
  async_: Annotated[ja.AsyncConfig, tyro.conf.arg(name="async")] = dataclasses.field(
      # One actor process with 4 envs, 64 sampled items per inserted transition, params
      # published every 10 SGD steps: chosen with scripts/bench_learning.py (README, 'Choosing
      # a mode' and 'Learning', has the figures).
      default_factory=lambda: ja.AsyncConfig(envs_per_actor=4, samples_per_insert=64.0,
                                             sync_interval=10))


@dataclasses.dataclass
class Args(RunArgs):
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


def resolved_mode(args: RunArgs) -> str:
  """'sync' or 'async': ``--mode``, with 'auto' resolved by ``default_mode``."""
  return default_mode() if args.mode == "auto" else args.mode


def trainer_config(args: RunArgs) -> ja.TrainerConfig:
  """The loop's settings: every ``Args`` field that ``TrainerConfig`` has, plus the logdir."""
  names = {f.name for f in dataclasses.fields(ja.TrainerConfig)} - {"model_dir"}
  return ja.TrainerConfig(model_dir=args.logdir,
                          **{n: getattr(args, n) for n in names if hasattr(args, n)})


def agent_config(args: Args) -> ja.DQNConfig:
  """``--agent.*`` with ``--anneal-lr`` applied: the decay spans ``--max-opts``."""
  if args.anneal_lr and args.agent.learning_rate_decay_steps == 0:
    return dataclasses.replace(args.agent, learning_rate_decay_steps=args.max_opts)
  return args.agent


def default_envs(args: RunArgs) -> tuple[Any, Any]:
  """(training, evaluation) env factories for --env-id / --eval-env-id: ``MinAtarEnvFactory``
  for MinAtar ids, else ``EnvFactory`` (checked, so a bad id fails here with the fix)."""
  ids = args.env_id, args.eval_env_id or args.env_id
  if is_minatar_id(args.env_id):
    return tuple(ja.MinAtarEnvFactory(i) for i in ids)
  for i in ids:
    ja.check_env_id(i)
  return tuple(ja.EnvFactory(i) for i in ids)


def run(args: RunArgs, title: str, make_replay: Callable[[ja.Agent], Any] | None = None,
        envs: tuple[Any, Any] | None = None, agent_cls: type[ja.Agent] = ja.DQN,
        agent_cfg: Any = None) -> dict:
  """Builds envs, agent and recorders from ``args`` and trains sync or async; prints where
  everything went. ``make_replay(agent)`` may return a replay to use instead of a uniform one;
  ``envs`` = (training, evaluation) env factories instead of ``default_envs(args)``; the agent
  is ``agent_cls(agent_cfg, obs_space, action_space, env_id)`` (default: DQN with
  ``agent_config(args)``)."""
  mode = resolved_mode(args)
  env, eval_env = envs if envs is not None else default_envs(args)
  config = trainer_config(args)
  resume = args.resume_from or args.resume
  obs_space, action_space = ja.envs.spaces_of(env)
  agent_cfg = agent_config(args) if agent_cfg is None else agent_cfg
  agent = agent_cls(agent_cfg, obs_space, action_space, args.env_id)
  # Every setting checked before the logdir is touched: a refused run leaves no event file
  # that would make its corrected rerun need --overwrite.
  config.validate(agent.batch_size)
  if mode == "async":
    args.async_.validate()
  if not resume:
    ja.claim_run_dir(args.logdir, args.overwrite)  # before the recorder writes its event file
  replay = make_replay(agent) if make_replay is not None else None
  recorder = ja.MultiRecorder(
      ja.TensorboardRecorder(args.logdir),
      ja.ConsoleRecorder(("env_steps", "opt_steps", "samples_per_sec", "opt_steps_per_sec",
                          "loss", "eval_reward")) if not args.progress else ja.NullRecorder())
  ac = args.async_
  replay_text = (f" ({type(replay).__name__}: {replay.bytes_per_item:.0f} bytes per transition, "
                 f"{replay.nbytes / 2**30:.2f} GiB)" if replay is not None else "")
  print(f"jaxasync {title} on {args.env_id}{replay_text}: mode={mode}"
        + (f" ({ac.num_actors} {ac.actor_mode} actor(s) x {ac.envs_per_actor} envs)"
           if mode == "async" else f" ({args.num_envs} envs)")
        + f", logs and checkpoints in {os.path.abspath(args.logdir)}", flush=True)
  if mode == "sync":
    summary = ja.Trainer(agent, env, config, recorder, eval_env, replay=replay,
                         resume=resume).train()
  else:
    summary, _ = ja.train_async(agent_cls, agent_cfg, env, config, ac, recorder, eval_env,
                                replay=replay, resume=resume)
  # Env frames: env steps times the env's frame skip (Atari), for comparison with other libraries.
  summary["env_frames_per_sec"] = (summary["env_steps"] * getattr(env, "frame_skip", 1)
                                   / summary["wall_s"])
  shown = {k: summary[k] for k in ("samples_total", "env_steps", "opt_steps", "wall_s",
                                   "samples_per_sec", "env_frames_per_sec", "opt_steps_per_sec",
                                   "best_eval_reward", "final_eval_reward", "solved_at")}
  print(json.dumps(shown, indent=1, default=float))
  logdir = os.path.abspath(args.logdir)
  best = os.path.join(logdir, "best")
  best = best if os.path.isdir(best) else "none (no evaluation ran)"
  print(f"summary: {os.path.join(logdir, 'summary.json')}; best model: {best}; "
        f"TensorBoard: tensorboard --logdir {args.logdir}")
  return summary


def main(args: Args) -> dict:
  return run(args, "DQN")


def run_cli(main: Callable[[], Any]) -> None:
  """Runs ``main()``: bad input exits 2, a run that failed (diverged, stalled, actors failing)
  exits 1, each with one ``error: ...`` line instead of a traceback."""
  try:
    main()
  except ja.ConfigError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  except (ja.NonFiniteError, ja.StallError, ja.ActorFailed) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
  run_cli(lambda: main(tyro.cli(Args)))

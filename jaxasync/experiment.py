"""The run driver behind every experiment script: a run's flags, building envs and agent from
them, training sync or async, the run's saved config, and the CLI's error lines.

A script declares its flags as a dataclass over ``RunArgs`` (or ``OnPolicyArgs``) with the
agent's config in ``agent``, and calls ``run``::

  @dataclasses.dataclass
  class Args(experiment.RunArgs):
    agent: ja.SACConfig = dataclasses.field(default_factory=ja.SACConfig)

  experiment.run_cli(lambda: experiment.run(tyro.cli(Args), "SAC", ja.SAC, args.agent))

``run`` writes the flags it was given to ``<logdir>/config.json`` and a ``--resume`` compares
them with the saved ones: settings that change what is learnt (the env, the agent, the data
pipeline) are refused unless named in ``--allow-changes``; the rest (limits, intervals,
logging, the actors' arrangement) are applied and listed.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import sys
from pathlib import Path
from typing import Annotated, Any, Callable, Literal

import tyro

import jaxasync as ja
from jaxasync.minatar import is_minatar_id

CONFIG_FILE = "config.json"


def default_mode() -> str:
  """Async (an actor process beside the learner, see ``RunArgs.async_``) when there are >= 2
  cores, else sync: with one core there is nothing to overlap. (README, 'Choosing a mode',
  has the figures.)"""
  return "async" if (os.cpu_count() or 1) >= 2 else "sync"


@dataclasses.dataclass
class RunArgs:
  """The flags of a run, whatever the agent (each script adds its ``agent``)."""

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
  """where TensorBoard logs, checkpoints, config.json and summary.json go; refused if it holds another run."""
  overwrite: bool = False
  """delete the run already in --logdir (its checkpoints, config, summary and event files) first."""
  keep_checkpoints: int = 5
  """numbered checkpoints kept, the newest (best/ and final/ always stay); 0 keeps all."""
  resume: bool = False
  """continue the run in --logdir from its newest complete checkpoint (replay included)."""
  resume_from: str | None = None
  """continue from this checkpoint directory instead (implies --resume)."""
  allow_changes: tuple[str, ...] = ()
  """on --resume: settings that may differ from the saved run's (e.g. agent.learning_rate gamma)."""
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


Hidden = tyro.conf.Suppress  # replay and n-step settings: an on-policy agent has neither


@dataclasses.dataclass
class OnPolicyArgs(RunArgs):
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


def resolved_mode(args: RunArgs) -> str:
  """'sync' or 'async': ``--mode``, with 'auto' resolved by ``default_mode``."""
  return default_mode() if args.mode == "auto" else args.mode


def trainer_config(args: RunArgs) -> ja.TrainerConfig:
  """The loop's settings: every ``args`` field that ``TrainerConfig`` has, plus the logdir."""
  names = {f.name for f in dataclasses.fields(ja.TrainerConfig)} - {"model_dir"}
  return ja.TrainerConfig(model_dir=args.logdir,
                          **{n: getattr(args, n) for n in names if hasattr(args, n)})


def anneal_over_opts(agent: Any, anneal_lr: bool, max_opts: int) -> Any:
  """``agent`` (a config with ``learning_rate_decay_steps``) with its decay spanning
  ``max_opts`` SGD steps, when ``anneal_lr`` and no decay is set (a ``max_opts`` below 1 is
  left for ``TrainerConfig.validate`` to refuse by its own name)."""
  if anneal_lr and agent.learning_rate_decay_steps == 0 and max_opts >= 1:
    return dataclasses.replace(agent, learning_rate_decay_steps=max_opts)
  return agent


def anneal_over_env_steps(args: OnPolicyArgs) -> Any:
  """``args.agent`` (an ``ActorCriticConfig``) with ``--anneal-lr`` applied: the decay spans
  the SGD steps (PPO: iterations) that ``--max-env-steps`` pays for, each taking
  ``unroll_length x batch_size`` steps of every sub-env of an actor."""
  agent = args.agent
  if (not args.anneal_lr or agent.learning_rate_decay_steps or args.max_env_steps is None
      or args.max_env_steps < 1):
    return agent
  envs = args.num_envs if resolved_mode(args) == "sync" else args.async_.envs_per_actor
  steps = max(1, args.max_env_steps // (agent.unroll_length * agent.batch_size * envs))
  return dataclasses.replace(agent, learning_rate_decay_steps=steps)


def default_envs(args: RunArgs) -> tuple[Any, Any]:
  """(training, evaluation) env factories for --env-id / --eval-env-id: ``MinAtarEnvFactory``
  for MinAtar ids, else ``EnvFactory`` (checked, so a bad id fails here with the fix)."""
  ids = args.env_id, args.eval_env_id or args.env_id
  if is_minatar_id(args.env_id):
    return tuple(ja.MinAtarEnvFactory(i) for i in ids)
  for i in ids:
    ja.check_env_id(i)
  return tuple(ja.EnvFactory(i) for i in ids)


# --- the run's saved config -------------------------------------------------------------------
# What a resume may change without asking: when to stop, what is logged and kept, and how the
# actors are arranged. Anything else changes what is learnt and must be named in --allow-changes.
RESUME_SAFE = ("max_opts", "max_env_steps", "duration", "target_eval_reward", "eval_interval",
               "eval_episodes", "record_interval", "save_interval", "logdir",
               "keep_checkpoints", "save_replay", "mode", "num_envs", "learner_devices",
               "async_")
# How a run is started or shown, not what it is: never compared.
NOT_COMPARED = ("resume", "resume_from", "allow_changes", "overwrite", "progress")


def flat_settings(args: Any) -> dict[str, Any]:
  """``args`` (a dataclass of flags, nested dataclasses included) as ``{"agent.gamma": 0.99,
  ...}``, values as JSON gives them back (tuples as lists)."""
  return json.loads(json.dumps(_flatten(dataclasses.asdict(args)), default=str))


def _flatten(tree: dict, prefix: str = "") -> dict:
  out = {}
  for key, value in tree.items():
    if isinstance(value, dict):
      out.update(_flatten(value, f"{prefix}{key}."))
    else:
      out[prefix + key] = value
  return out


def flag(field: str) -> str:
  """The command-line spelling of a dotted field name: ``agent.learning_rate`` ->
  ``--agent.learning-rate``, ``async_.num_actors`` -> ``--async.num-actors``."""
  return "--" + ".".join(part.rstrip("_").replace("_", "-") for part in field.split("."))


def field_name(text: str) -> str:
  """The dotted field a user names in ``--allow-changes``, however spelt: ``agent.learning_rate``,
  ``--agent.learning-rate`` or ``async.num-actors`` (``async_.num_actors``)."""
  parts = text.strip().removeprefix("--").replace("-", "_").split(".")
  return ".".join(["async_" if parts[0] == "async" else parts[0], *parts[1:]])


def described(obj: Any) -> dict:
  """A dataclass instance (an agent config, an env factory) as ``{"class": "module.Name",
  "fields": {...}}``, which ``rebuilt`` turns back into an equal instance."""
  return {"class": f"{type(obj).__module__}.{type(obj).__qualname__}",
          "fields": json.loads(json.dumps(dataclasses.asdict(obj), default=str))}


def importable(cls: type) -> str:
  return f"{cls.__module__}.{cls.__qualname__}"


def imported(path: str) -> Any:
  """The object ``"package.module.Name"`` names."""
  module, _, name = path.rpartition(".")
  return getattr(importlib.import_module(module), name)


def rebuilt(record: dict) -> Any:
  """The instance ``described`` recorded (JSON lists back to tuples)."""
  fields = {k: tuple(v) if isinstance(v, list) else v for k, v in record["fields"].items()}
  return imported(record["class"])(**fields)


def write_config(logdir: str | os.PathLike, settings: dict, title: str, env: Any,
                 agent_cls: type | None = None, agent_cfg: Any = None,
                 eval_env: Any = None) -> Path:
  """Writes ``<logdir>/config.json`` (replacing it whole: a crash leaves the old one or the
  new one, never half of either): the run's flags, the algorithm, the env's spaces, the
  package version and, for ``jaxasync.enjoy``, the agent (class and resolved config) and the
  evaluation env factory."""
  obs_space, action_space = ja.envs.spaces_of(env)
  record = {"algorithm": title, "jaxasync_version": ja.__version__,
            "observation_space": str(obs_space), "action_space": str(action_space),
            "settings": settings}
  if agent_cls is not None:
    record["agent"] = {"class": importable(agent_cls), "config": described(agent_cfg)}
  if eval_env is not None and dataclasses.is_dataclass(eval_env):
    record["eval_env"] = described(eval_env)
  path = Path(logdir) / CONFIG_FILE
  tmp = path.with_suffix(".json.tmp")
  tmp.write_text(json.dumps(record, indent=1, default=str) + "\n")
  os.replace(tmp, path)
  return path


def saved_config(args: RunArgs) -> tuple[Path, dict] | None:
  """The config saved by the run being resumed: ``--logdir``'s, or for ``--resume-from`` the
  one beside that checkpoint (its run directory's); None if there is none."""
  places = [Path(args.logdir)]
  if args.resume_from:
    places = [Path(args.resume_from).parent, *places]
  for place in places:
    path = place / CONFIG_FILE
    if path.is_file():
      try:
        return path, json.loads(path.read_text())
      except (OSError, ValueError) as e:
        raise ja.ConfigError(f"{path} cannot be read ({e}); the run it belongs to cannot be "
                             "checked for changes. Restore it, or start a new --logdir.") from None
  return None


def resume_changes(saved: dict, current: dict, allowed: tuple[str, ...] = ()
                   ) -> tuple[list[str], list[str]]:
  """Compares a saved run's flags with a resume's (both ``flat_settings``): returns (refused,
  applied), each a list of ``"--flag NEW (was OLD)"``. A change is applied when its field or
  the group above it is in ``RESUME_SAFE`` or ``allowed``, or when the saved config predates
  the field; refused otherwise; the fields of ``NOT_COMPARED`` are left out."""
  permitted = set(RESUME_SAFE) | {field_name(a) for a in allowed}
  refused, applied = [], []
  for name in sorted((set(saved) | set(current)) - set(NOT_COMPARED)):
    old, new = saved.get(name, "<absent>"), current.get(name, "<absent>")
    if old == new:
      continue
    if name not in saved:  # a setting added since the run was saved: its old value is unknown
      applied.append(f"{flag(name)} {_shown(new)} (not in the saved config)")
      continue
    text = f"{flag(name)} {_shown(new)} (was {_shown(old)})"
    parts = name.split(".")
    ok = any(".".join(parts[:i]) in permitted for i in range(1, len(parts) + 1))
    (applied if ok else refused).append(text)
  return refused, applied


def _shown(value: Any) -> str:
  return " ".join(map(str, value)) if isinstance(value, list) else str(value)


def check_resume(args: RunArgs, settings: dict, agent_cfg: Any = None) -> None:
  """Raises ``ConfigError`` naming every setting of a ``--resume`` that differs from the saved
  run's and is neither safe nor in ``--allow-changes``; prints the changes it applies,
  including those of the agent's resolved config that follow from them (a learning-rate decay
  spanning a new ``--max-opts``)."""
  if not args.resume_from and not Path(args.logdir).is_dir():
    raise ja.ConfigError(f"--resume: {args.logdir} does not exist, so there is no run to "
                         "continue; pass the --logdir of the run (or --resume-from a checkpoint).")
  found = saved_config(args)
  if found is None:
    print(f"resume: no {CONFIG_FILE} in {args.logdir} (a run saved before jaxasync wrote one): "
          "its settings cannot be compared with these.", flush=True)
    return
  path, record = found
  refused, applied = resume_changes(record.get("settings", {}), settings, args.allow_changes)
  if refused:
    names = " ".join(field_name(r.split()[0]) for r in refused)
    raise ja.ConfigError(
        f"--resume would continue the run saved in {path.parent} with settings it was not "
        f"trained with: "
        f"{'; '.join(refused)}. Start a new --logdir for a new run, or pass --allow-changes "
        f"{names} to continue with them.")
  saved_agent = record.get("agent", {}).get("config", {}).get("fields")
  if saved_agent is not None and dataclasses.is_dataclass(agent_cfg):
    now = described(agent_cfg)["fields"]
    for key in sorted(now):  # resolved values that moved while their own flag did not
      if (now[key] != saved_agent.get(key, now[key])
          and settings.get(f"agent.{key}") == record["settings"].get(f"agent.{key}")):
        applied.append(f"{flag('agent.' + key)} {_shown(now[key])} (was "
                       f"{_shown(saved_agent[key])}, following the changes above)")
  if applied:
    print(f"resume: applying {'; '.join(applied)}", flush=True)


# --- running ----------------------------------------------------------------------------------
def run(args: RunArgs, title: str, agent_cls: type[ja.Agent], agent_cfg: Any,
        make_replay: Callable[[ja.Agent], Any] | None = None,
        envs: tuple[Any, Any] | None = None) -> dict:
  """Builds envs, agent and recorders from ``args`` and trains sync or async; prints where
  everything went and returns the summary. The agent is ``agent_cls(agent_cfg, obs_space,
  action_space, env_id)``; ``make_replay(agent)`` may return a replay to use instead of a
  uniform one; ``envs`` = (training, evaluation) env factories instead of
  ``default_envs(args)``."""
  mode = resolved_mode(args)
  env, eval_env = envs if envs is not None else default_envs(args)
  config = trainer_config(args)
  resume = args.resume_from or args.resume  # a checkpoint path, or True: the newest
  obs_space, action_space = ja.envs.spaces_of(env)
  agent = agent_cls(agent_cfg, obs_space, action_space, args.env_id)
  # Every setting checked before the logdir is touched: a refused run leaves no event file
  # that would make its corrected rerun need --overwrite.
  config.validate(agent.batch_size)
  if mode == "async":
    args.async_.validate()
  settings = flat_settings(args)
  save_config = lambda: write_config(args.logdir, settings, title, env, agent_cls, agent_cfg,
                                     eval_env)
  if resume:
    check_resume(args, settings, agent_cfg)
    Path(args.logdir).mkdir(parents=True, exist_ok=True)  # (--resume-from into a new logdir)
  else:
    ja.claim_run_dir(args.logdir, args.overwrite)  # before the recorder writes its event file
    save_config()
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
  try:
    if mode == "sync":
      summary = ja.Trainer(agent, env, config, recorder, eval_env, replay=replay,
                           resume=resume).train()
    else:
      summary, _ = ja.train_async(agent_cls, agent_cfg, env, config, ac, recorder, eval_env,
                                  replay=replay, resume=resume)
  except ja.ConfigError:  # nothing trained (no checkpoint could be resumed): the saved
    raise                 # config still describes the checkpoints
  except BaseException:
    if resume:  # it trained with these settings before failing: its checkpoints have them
      save_config()
    raise
  if resume:  # written once training ran, so a resume that could not load keeps the old one
    save_config()
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


def run_cli(main: Callable[[], Any]) -> None:
  """Runs ``main()``: bad input exits 2, a run that failed (diverged, stalled, actors failing,
  a checkpoint or the run directory unwritable) exits 1, each with one ``error: ...`` line
  instead of a traceback."""
  try:
    main()
  except ja.ConfigError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
  except (ja.NonFiniteError, ja.StallError, ja.ActorFailed, ja.CheckpointError) as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(1)
  except OSError as e:  # the run directory (summary, event files) failing under the run
    where = f" ({e.filename})" if e.filename else ""
    print(f"error: {e.strerror or e}{where}: the run could not write its files; free space "
          "(or fix the directory) and continue with --resume.", file=sys.stderr)
    sys.exit(1)

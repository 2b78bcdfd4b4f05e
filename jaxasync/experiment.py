"""The run driver behind every experiment script: a run's flags, building envs and agent from
them, training, the run's saved config, and the CLI's error lines.

A script declares its flags as a dataclass over ``RunArgs`` (or ``AnnealedRunArgs``) that
nests the library's configs, each declared once where it is owned: the run's
(``jaxasync.RunConfig``) and the actors' (``jaxasync.ActorsConfig``) with unprefixed flags
(``--max-opts``, ``--mode``), the agent's (with its data pipeline) under ``--agent.*``::

  @dataclasses.dataclass
  class Args(experiment.RunArgs):
    agent: ja.SACConfig = dataclasses.field(default_factory=ja.SACConfig)

  experiment.run_cli(lambda: experiment.run(tyro.cli(Args), "SAC", ja.SAC, args.agent))

``run`` writes the flags it was given to ``<logdir>/config.json`` and a ``--resume`` compares
them with the saved ones: settings that change what is learnt (the env, the agent and its data
pipeline) are refused unless named in ``--allow-changes``; the rest (limits, intervals,
logging, the actors' arrangement) are applied and listed.
"""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import functools
import gc
import importlib
import json
import os
import re
import sys
import time
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Callable, ClassVar

import tyro

import jaxasync as ja
from jaxasync.ledger import early_interrupts_remembered
from jaxasync.minatar import is_minatar_id

CONFIG_FILE = "config.json"
# config.json's "settings" layout: 2 since the settings were split by owner (run., actors.,
# agent.data.), 3 since a union field records its class (DQN's agent.loss); a saved config
# without it cannot be compared field by field.
SETTINGS_LAYOUT = 3

Flat = tyro.conf.arg(name="")  # a nested config whose flags carry no prefix of their own


@dataclasses.dataclass
class RunArgs:
  """The flags of a run, whatever the agent (each script adds its ``agent``)."""

  # Groups whose flags have no prefix (tyro's name="" above): ``flag`` spells a field the way
  # the command line does. A script that flattens its agent too (rainbow.py) adds "agent".
  flattened: ClassVar[tuple[str, ...]] = ("run", "actors", "data")
  # Runs without --logdir go to runs/<algo>/<env>__seed<seed>__<time> (CleanRL's naming), so
  # running a command twice keeps both runs.
  algo: ClassVar[str] = "run"

  # Each field's docstring is its --help text: one line each (tyro keeps the line breaks of a
  # field docstring), the longer story in a comment above the field.

  # A MinAtar id needs pip install 'jaxasync[minatar]' (the error says so).
  env_id: str = "CartPole-v1"
  """gymnasium id, 'module:EnvName-v0' (imports module), or MinAtar id ('MinAtar/Breakout-v1')."""
  eval_env_id: str | None = None
  """env id to evaluate on; None: --env-id."""
  resume: bool = False
  """continue the run in --logdir from its newest complete checkpoint (replay included)."""
  resume_from: str | None = None
  """continue from this checkpoint directory instead (implies --resume)."""
  allow_changes: tuple[str, ...] = ()
  """on --resume: settings that may differ from the saved run's (e.g. --agent.learning-rate)."""
  # Recorded from one render_mode="rgb_array" env of the evaluation env id, never the training
  # vector env, by a thread of its own (the learner does not wait).
  capture_video: int = 0
  """record one evaluation episode to <logdir>/videos every N evaluations and of the final params (GIF; MP4 with the video extra); 0: none."""
  # A run's <logdir>/config.json (or that directory): its settings become the defaults of
  # every flag, so a flag given beside it overrides the file (parse_args); where the run went
  # and how it was started are not taken (NOT_RERUN): the rerun is a run of its own.
  config: str | None = None
  """rerun the run saved in this config.json (or run directory) in a new logdir; flags given override its settings."""
  # What is then bit-reproducible, and what is not: README, Reproducibility.
  deterministic: bool = False
  """lock-step actors (--mode sync) and XLA's deterministic GPU ops: the same flags and seed give the same run."""
  # JAX's persistent compilation cache (use_compile_cache): a run whose programs an earlier
  # run compiled loads them instead of compiling again (docs/bench_learning_results.md, "PQN
  # and DQN CartPole with the compile cache", has the start-up figures). The directory is this
  # machine's, not the run's: never compared on --resume, never taken by --config.
  compile_cache: str | None = "~/.cache/jaxasync/xla"
  """keep XLA's compiled programs here and reuse them in later runs (JAX_COMPILATION_CACHE_DIR, when set, wins); None: compile every run afresh."""
  # Scalars mirrored as TensorBoard gets them, the flags as the W&B config (jaxasync.tracking).
  track: bool = False
  """log the scalars, the config and the videos to Weights & Biases too (pip install 'jaxasync[wandb]')."""
  wandb_project: str = "jaxasync"
  """the W&B project of --track."""
  wandb_entity: str | None = None
  """the W&B team or user of --track; None: your default entity."""
  run: Annotated[ja.RunConfig, Flat] = dataclasses.field(
      default_factory=lambda: ja.RunConfig(save_interval=10_000))
  # One actor process beside the learner on >= 2 cores ('auto'), params published every 10 SGD
  # steps: chosen with scripts/bench_learning.py (README, 'Choosing a mode', has the figures).
  actors: Annotated[ja.ActorsConfig, Flat] = dataclasses.field(
      default_factory=lambda: ja.ActorsConfig(mode="auto", num_envs=4, sync_interval=10))

  def preset_defaults(self) -> RunArgs:
    """The flags' defaults this command line was parsed over: the chosen preset's for a
    script with ``--preset`` (its module's ``PRESETS``, as ``parse_with_presets`` reads
    them), else the class's."""
    presets = getattr(sys.modules[type(self).__module__], "PRESETS", None)
    preset = getattr(self, "preset", None)
    base = presets[preset]() if presets and preset else type(self)()
    # With --config the flags were parsed over the saved run's settings: what the file set
    # is a default too, not something the user typed.
    return config_defaults(self.config, base) if self.config else base

  @property
  def logdir(self) -> str:
    """The run's directory (``with_logdir`` fills it in when no --logdir was given)."""
    if self.run.logdir is None:
      raise ja.ConfigError("no logdir yet: experiment.with_logdir(args) names one.")
    return self.run.logdir


def runs_root(args: RunArgs) -> Path:
  """Where runs without --logdir go: ``runs/<algo>``."""
  return Path("runs") / type(args).algo


def run_name_prefix(args: RunArgs) -> str:
  """``<env>__seed<seed>__``: how the runs of one env and seed are named under ``runs_root``."""
  return f"{args.env_id.replace('/', '-').replace(':', '-')}__seed{args.run.seed}__"


def with_logdir(args: RunArgs, now: float | None = None) -> RunArgs:
  """``args`` with ``run.logdir`` set when it was not given: for a new run a fresh
  ``runs/<algo>/<env>__seed<seed>__<YYYYmmdd-HHMMSS>`` (``-2``, ``-3``... when taken); for
  ``--resume-from`` the checkpoint's run directory; for ``--resume`` the newest run of the same
  env and seed under ``runs/<algo>`` (``ConfigError`` when there is none)."""
  if args.run.logdir is not None:
    return args
  if args.resume_from:
    logdir = str(Path(args.resume_from).resolve().parent)
  elif args.resume:
    # The newest start of this env and seed, by the time in its name (a config.json's mtime
    # moves each time a run is resumed).
    prefix = run_name_prefix(args)
    runs = sorted(p.parent for p in runs_root(args).glob(f"{prefix}*/{CONFIG_FILE}"))
    if not runs:
      raise ja.ConfigError(f"--resume without --logdir continues the newest run of "
                           f"{runs_root(args)}/{prefix}*, and there is none; pass the --logdir "
                           "of the run.")
    logdir = str(runs[-1])
    print(f"resume: the newest run of this env and seed: {logdir}", flush=True)
  else:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    name = f"{run_name_prefix(args)}{stamp}"
    base = runs_root(args) / name
    logdir, n = base, 1
    while logdir.exists():
      n += 1
      logdir = base.with_name(f"{name}-{n}")
    logdir = str(logdir)
  return dataclasses.replace(args, run=dataclasses.replace(args.run, logdir=logdir))


def mujoco_off_policy(warmup_period: int) -> tuple[ja.ReplayConfig, ja.RunConfig]:
  """The replay and run of the off-policy MuJoCo presets (SAC's, TD3's): a 1M replay of
  one-step transitions, gamma 0.99, ``warmup_period`` env steps before the first SGD step,
  then one SGD step of 256 per env step (actors: 256 sampled per inserted), 1M env steps;
  10 evaluation episodes every 10k SGD steps."""
  data = ja.ReplayConfig(replay_capacity=1_000_000, warmup_period=warmup_period, n_step=1,
                         gamma=0.99, samples_per_insert=256.0)
  run = ja.RunConfig(max_opts=1_000_000, max_env_steps=1_000_000, eval_interval=10_000,
                     eval_episodes=10, save_interval=100_000)
  return data, run


def on_policy_actors() -> ja.ActorsConfig:
  """The actors of the on-policy scripts (IMPALA, PPO): one actor process with 8 envs,
  params published after every SGD step (on-policy learning wants the freshest behaviour
  policy). Placement is the default's ('auto': pinned where the cores are free). Ray actors
  return what they hold at each call and hold at most 4 chunks: their default's gathering
  (up to 0.2 s a call, 16 chunks ahead) trades policy lag for CPU, which suits a replay, not
  an unroll."""
  return ja.ActorsConfig(mode="auto", num_envs=8, sync_interval=1, ray_chunks_ahead=4,
                         ray_gather_s=0.0)


def lockstep_actors(actors: ja.ActorsConfig, defaults: ja.ActorsConfig) -> ja.ActorsConfig:
  """``actors`` as a lock-step run takes them: when its resolved mode is 'sync', each field
  only actors beside the learner read (``ActorsConfig.actor_fields``) that keeps the script's
  default (``defaults``: its preset's, which may publish every SGD step or keep one unroll
  in the queue for the async run) goes back to the class default. So ``--mode sync`` over
  such a preset runs, and ``ActorsConfig.validate`` refuses only what the user set (``--mode
  sync --num-actors 4``); a flag given at its script's default cannot be told from an absent
  one and is dropped too."""
  if not actors.lockstep:
    return actors
  base = type(actors)()
  kept = {name: getattr(base, name) for name in actors.actor_fields()
          if getattr(actors, name) == getattr(defaults, name)}
  return dataclasses.replace(actors, **kept)


@dataclasses.dataclass
class AnnealedRunArgs(RunArgs):
  """``RunArgs`` for agents whose config has ``learning_rate_decay_steps``."""

  # Annealed, the final params settle instead of being shaken by full-size steps to the end
  # (scripts/bench_learning.py measures the difference).
  anneal_lr: bool = True
  """decay the LR over the whole run (SGD steps, or the env steps of unroll agents) unless --agent.learning-rate-decay-steps is set."""


def annealed_agent(args: AnnealedRunArgs) -> Any:
  """``args.agent`` with ``--anneal-lr`` applied: its learning-rate decay spans ``--max-opts``
  SGD steps, or, for agents learning from unrolls, the SGD steps (PPO: iterations) that
  ``--max-env-steps`` pays for (each takes ``unroll_length x batch_size`` steps of every
  sub-env of an actor). Bad limits are left for ``RunConfig.validate`` to refuse by name."""
  agent, run = args.agent, args.run
  if not args.anneal_lr or agent.learning_rate_decay_steps:
    return agent
  if isinstance(agent.data, ja.UnrollConfig):
    if run.max_env_steps is None or run.max_env_steps < 1:
      return agent
    per_step = agent.data.unroll_length * agent.batch_size * args.actors.num_envs
    steps = max(1, run.max_env_steps // per_step)
  else:
    if run.max_opts < 1:
      return agent
    steps = run.max_opts
  return dataclasses.replace(agent, learning_rate_decay_steps=steps)


def default_envs(args: RunArgs) -> tuple[ja.VectorEnvFactory, ja.VectorEnvFactory]:
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
RESUME_SAFE = ("run.max_opts", "run.max_env_steps", "run.duration", "run.target_eval_reward",
               "run.eval_interval", "run.eval_episodes", "run.record_interval",
               "run.save_interval", "run.logdir", "run.keep_checkpoints", "run.save_replay",
               "run.stall_warning", "run.stall_timeout", "run.learner_devices", "actors",
               "capture_video", "deterministic", "track", "wandb_project", "wandb_entity")
# How a run is started or shown, not what it is: never compared.
NOT_COMPARED = ("resume", "resume_from", "allow_changes", "run.overwrite", "run.progress",
                "config", "compile_cache")
# What a rerun (--config) does not take from the file: how the run was started, where it went
# (a rerun writes a logdir of its own) and whether it went to W&B (which may not be installed
# where it reruns).
NOT_RERUN = ("resume", "resume_from", "allow_changes", "run.overwrite", "config", "run.logdir",
             "track", "compile_cache")


def flat_settings(args: Any) -> dict[str, Any]:
  """``args`` (a dataclass of flags, nested dataclasses included) as ``{"agent.data.gamma":
  0.99, ...}``, values as JSON gives them back (tuples as lists). A field whose type is a
  union of dataclasses (a subcommand on the command line) also names the variant chosen:
  ``{"agent.loss": "munchausen", "agent.loss.alpha": 0.9, ...}``."""
  return json.loads(json.dumps(_flatten(args), default=str))


def _flatten(obj: Any, prefix: str = "", leaf: Callable[[dataclasses.Field, Any], Any]
             = lambda field, value: value, variants: bool = True) -> dict:
  """``{"a.b.c": leaf(field, value)}`` over ``obj``'s nested dataclass fields (a ``leaf`` of
  ``MISSING`` leaves the setting out); with ``variants``, a union field also names the variant
  chosen."""
  out = {}
  for f in dataclasses.fields(obj):
    value = getattr(obj, f.name)
    if dataclasses.is_dataclass(value):
      if variants and _is_union(type(obj), f.name):
        out[prefix + f.name] = variant_name(type(value))
      out.update(_flatten(value, f"{prefix}{f.name}.", leaf, variants))
    elif (shown := leaf(f, value)) is not dataclasses.MISSING:
      out[prefix + f.name] = shown
  return out


def class_defaults(args: Any) -> dict[str, Any]:
  """Each setting's default in the class that declares it, keyed as ``flat_settings``
  (``{"agent.target_kl_cost": 0.0, ...}``): what a run saved before a setting existed had,
  when the class default keeps the behaviour of before (the rule for new settings)."""
  return json.loads(json.dumps(_flatten(args, leaf=_declared_default, variants=False),
                               default=str))


def _declared_default(field: dataclasses.Field, value: Any) -> Any:
  if field.default is not dataclasses.MISSING:
    return field.default
  if field.default_factory is not dataclasses.MISSING:
    return field.default_factory()
  return dataclasses.MISSING


def _is_union(cls: type, field: str) -> bool:
  """Whether ``cls.field`` is declared as a union (``QLearning | Munchausen | Categorical``)."""
  try:
    hint = typing.get_type_hints(cls)[field]
  except (NameError, TypeError):  # (a class declared in a function, with forward references)
    hint = next(f.type for f in dataclasses.fields(cls) if f.name == field)
  return typing.get_origin(hint) in (typing.Union, types.UnionType)


def variant_name(cls: type) -> str:
  """The name of a union field's variant as its subcommand spells it (tyro's: the class name
  in kebab case, ``QLearning`` -> ``q-learning``)."""
  return re.sub(r"((?<=[a-z0-9])[A-Z]|(?!^)[A-Z](?=[a-z]))", r"-\1", cls.__name__).lower()


def flag(field: str, flattened: tuple[str, ...] = RunArgs.flattened) -> str:
  """The command-line spelling of a dotted field name, the ``flattened`` groups leaving no
  prefix: ``agent.learning_rate`` -> ``--agent.learning-rate``, ``run.max_opts`` ->
  ``--max-opts``, ``agent.data.n_step`` -> ``--agent.n-step``."""
  parts = [p for p in field.split(".") if p not in flattened] or field.split(".")[-1:]
  return "--" + ".".join(part.replace("_", "-") for part in parts)


def field_name(text: str, fields, flattened: tuple[str, ...] = RunArgs.flattened) -> str:
  """The dotted field among ``fields`` that a user names in ``--allow-changes``, however spelt
  (``--agent.learning-rate``, ``agent.learning_rate``, ``max-opts``, ``run.max_opts``); the
  text itself, normalised, when none matches (a group such as ``actors`` or ``agent``)."""
  text = text.strip()
  wanted = flag(text.removeprefix("--").replace("-", "_"), flattened)
  by_flag = {flag(f, flattened): f for f in fields}
  return by_flag.get(wanted, text.removeprefix("--").replace("-", "_"))


def spelt_for_cli(message: str, fields, flattened: tuple[str, ...] = RunArgs.flattened) -> str:
  """``message`` (a library error, which names config fields) with each field it names followed
  by its flag: ``"lower learner_devices"`` -> ``"lower learner_devices (--learner-devices)"``,
  ``"num_q_networks=1"`` -> ``"num_q_networks=1 (--agent.loss.num-q-networks)"``. The one place
  fields become flags. A field is recognised by its name when that has an underscore, by
  ``name=`` otherwise (``seed=3``; a bare ``seed`` may be prose); names that two groups share
  (``batch_size``) are left alone."""
  by_leaf: dict[str, list[str]] = {}
  for f in fields:
    by_leaf.setdefault(f.split(".")[-1], []).append(f)
  for leaf, owners in sorted(by_leaf.items(), key=lambda kv: -len(kv[0])):
    if len(owners) != 1:
      continue
    cli = flag(owners[0], flattened)
    if "_" in leaf:
      pattern = rf"(?<![\w.-]){re.escape(leaf)}(=[^\s,;:)]*[^\s,;:).])?(?![\w(])"
    else:
      pattern = rf"(?<![\w.-]){re.escape(leaf)}=[^\s,;:)]*[^\s,;:).]"
    message = re.sub(pattern, lambda m: f"{m.group(0)} ({cli})", message, count=1)
  return message


def described(obj: Any) -> dict:
  """A dataclass instance (an agent config, an env factory) as ``{"class": "module.Name",
  "fields": {...}}`` (nested dataclasses described alike), which ``rebuilt`` turns back into
  an equal instance."""
  fields = {}
  for f in dataclasses.fields(obj):
    value = getattr(obj, f.name)
    fields[f.name] = (described(value) if dataclasses.is_dataclass(value)
                      else json.loads(json.dumps(value, default=str)))
  return {"class": importable(type(obj)), "fields": fields}


def described_flat(record: dict, prefix: str = "") -> dict:
  """``described``'s fields as ``{"data.n_step": 5, ...}``, each nested config's class under
  its own name (``{"loss": "jaxasync.agents.dqn_losses.Munchausen", "loss.alpha": 0.9}``)."""
  out = {}
  for key, value in record["fields"].items():
    if isinstance(value, dict) and "class" in value and "fields" in value:
      out[prefix + key] = value["class"]
      out.update(described_flat(value, f"{prefix}{key}."))
    else:
      out[prefix + key] = value
  return out


def importable(cls: type) -> str:
  return f"{cls.__module__}.{cls.__qualname__}"


def imported(path: str) -> Any:
  """The object ``"package.module.Name"`` names."""
  module, _, name = path.rpartition(".")
  return getattr(importlib.import_module(module), name)


def rebuilt(record: dict) -> Any:
  """The instance ``described`` recorded (JSON lists back to tuples)."""
  def value(v):
    if isinstance(v, dict) and "class" in v and "fields" in v:
      return rebuilt(v)
    return tuple(v) if isinstance(v, list) else v
  cls = imported(record["class"])
  try:
    return cls(**{k: value(v) for k, v in record["fields"].items()})
  except TypeError as e:  # fields a later jaxasync moved or renamed
    raise ja.ConfigError(f"the saved {cls.__name__} does not fit this jaxasync's ({e}): the run "
                         "was saved by an earlier version; rebuild its config in Python to "
                         "restore it.") from None


def write_config(logdir: str | os.PathLike, settings: dict, title: str,
                 env: ja.VectorEnvFactory, agent_cls: type | None = None, agent_cfg: Any = None,
                 eval_env: ja.VectorEnvFactory | None = None, algo: str | None = None) -> Path:
  """Writes ``<logdir>/config.json`` (replacing it whole: a crash leaves the old one or the
  new one, never half of either): the run's flags, the algorithm (``title``, and ``algo``: the
  script that reruns it with ``--config``), the env's spaces, the package version, what ran it
  (``provenance``) and, for ``jaxasync.enjoy``, the agent (class and resolved config) and the
  evaluation env factory."""
  obs_space, action_space = ja.envs.spaces_of(env)
  record = {"algorithm": title, "jaxasync_version": ja.__version__,
            "observation_space": str(obs_space), "action_space": str(action_space),
            "settings_layout": SETTINGS_LAYOUT, "settings": settings,
            "provenance": provenance()}
  if algo is not None:
    record["algo"] = algo
  if agent_cls is not None:
    record["agent"] = {"class": importable(agent_cls), "config": described(agent_cfg)}
  if eval_env is not None and dataclasses.is_dataclass(eval_env):
    record["eval_env"] = described(eval_env)
  path = Path(logdir) / CONFIG_FILE
  tmp = path.with_suffix(".json.tmp")
  tmp.write_text(json.dumps(record, indent=1, default=str) + "\n")
  os.replace(tmp, path)
  return path


PROVENANCE_PACKAGES = ("jax", "jaxlib", "flax", "optax", "numpy", "gymnasium")


def provenance() -> dict:
  """What a run ran on, for telling two runs' results apart (README, Reproducibility): the
  Python and package versions, jax's devices and the jaxasync source's git commit (None
  outside a git checkout; ``git_dirty``: uncommitted changes to tracked files)."""
  import importlib.metadata
  import platform
  import subprocess

  import jax
  versions = {"python": platform.python_version()}
  for name in PROVENANCE_PACKAGES:
    try:
      versions[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      versions[name] = None
  source = Path(ja.__file__).resolve().parent.parent
  commit = dirty = None
  try:
    git = lambda *a: subprocess.run(["git", "-C", str(source), *a], capture_output=True,
                                     text=True, timeout=10)
    # Only a checkout of jaxasync itself: an installed package's site-packages may sit inside
    # another project's repository (a venv in a checkout), whose commit says nothing here.
    if git("ls-files", "--error-unmatch", "jaxasync/__init__.py").returncode == 0:
      out = git("rev-parse", "HEAD")
      status = git("status", "--porcelain", "--untracked-files=no")
      if out.returncode == 0:
        commit = out.stdout.strip()
        dirty = bool(status.stdout.strip()) if status.returncode == 0 else None
  except (OSError, subprocess.TimeoutExpired):  # (no git on this machine)
    pass
  environment = {k: v for k, v in os.environ.items()
                 if k == "XLA_FLAGS" or k.startswith(("JAX_", "XLA_PYTHON_"))}
  return {"versions": versions, "devices": [str(d) for d in jax.devices()],
          "machine": platform.machine(), "environment": environment, "git_commit": commit,
          "git_dirty": dirty}


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


def comparable_layout(record: dict, settings: dict) -> bool:
  """Whether a saved config's settings compare field by field with ``settings``: this
  layout, or layout 2 when every field it saved is still a field (the runs of the agents
  without a union field: layout 3 only added the unions' variant names)."""
  layout = record.get("settings_layout")
  return layout == SETTINGS_LAYOUT or (
      layout == 2 and set(record.get("settings", {})) <= set(settings) | set(NOT_COMPARED))


def resume_changes(saved: dict, current: dict, allowed: tuple[str, ...] = (),
                   flattened: tuple[str, ...] = RunArgs.flattened,
                   defaults: dict | None = None) -> tuple[list[str], list[str]]:
  """Compares a saved run's flags with a resume's (both ``flat_settings``): returns (refused,
  applied), each a list of ``"--flag NEW (was OLD)"``. A change is applied when its field or
  a group above it is in ``RESUME_SAFE`` or ``allowed``; refused otherwise. A field the saved
  config predates is compared with its class default (``defaults``, ``class_defaults``: the
  behaviour of before) and applied when equal or unknown; the fields of ``NOT_COMPARED`` are left out. A union field
  whose variant changed is one change, ``"agent.loss:NEW (was agent.loss:OLD)"``; the
  variants' own fields are then not compared."""
  names = set(saved) | set(current)
  permitted = set(RESUME_SAFE) | {field_name(a, names, flattened) for a in allowed}
  # A union field names its variant and has fields of its own below it.
  changed_variants = {name for name in names
                      if saved.get(name) != current.get(name)
                      and any(other.startswith(name + ".") for other in names)}
  refused, applied = [], []
  for name in sorted(names - set(NOT_COMPARED)):
    old, new = saved.get(name, "<absent>"), current.get(name, "<absent>")
    if old == new or any(name.startswith(v + ".") for v in changed_variants):
      continue
    if name in changed_variants:
      command = flag(name, flattened).removeprefix("--")
      text = f"{command}:{new} (was {command}:{old})"
    elif name not in saved and (defaults is None or name not in defaults
                                or defaults[name] == new):
      # A setting added since the run was saved, at the behaviour of before (or unknown).
      applied.append(f"{flag(name, flattened)} {_shown(new)} (not in the saved config)")
      continue
    elif name not in saved:
      text = (f"{flag(name, flattened)} {_shown(new)} (not in the saved config, which predates "
              f"it: the run had its default {_shown(defaults[name])})")
    else:
      text = f"{flag(name, flattened)} {_shown(new)} (was {_shown(old)})"
    parts = name.split(".")
    ok = any(".".join(parts[:i]) in permitted for i in range(1, len(parts) + 1))
    (applied if ok else refused).append(text)
  return refused, applied


def _shown(value: Any) -> str:
  return " ".join(map(str, value)) if isinstance(value, list) else str(value)


def check_resume_from(path: Path) -> None:
  """Raises ``ConfigError`` unless ``path`` is a checkpoint a run can continue from: a
  numbered one or ``final`` (``best`` holds neither the ledger nor the replay), before
  anything is written beside it."""
  if path.is_dir() and path.name != "best" and (path / "meta.json").is_file():
    return
  if path.name == "best":
    why = "best holds the best params only, not where the run stopped (no ledger, no replay)"
  elif ja.checkpoint.resumable_checkpoints(path):
    raise ja.ConfigError(f"--resume-from {path} is a run directory, not a checkpoint: "
                         f"--resume --logdir {path} continues it from its newest checkpoint.")
  else:
    why = "no such checkpoint" if not path.exists() else "not a checkpoint (no meta.json)"
  raise ja.ConfigError(f"--resume-from {path}: {why}; name a numbered checkpoint "
                       "(<logdir>/5000) or <logdir>/final, or continue the run with --resume "
                       "--logdir <logdir>.")


def check_resume(args: RunArgs, settings: dict, agent_cfg: Any = None) -> None:
  """Raises ``ConfigError`` naming every setting of a ``--resume`` that differs from the saved
  run's and is neither safe nor in ``--allow-changes``; prints the changes it applies,
  including those of the agent's resolved config that follow from them (a learning-rate decay
  spanning a new ``--max-opts``)."""
  if args.resume_from:
    check_resume_from(Path(args.resume_from))
  if not args.resume_from and not Path(args.logdir).is_dir():
    raise ja.ConfigError(f"--resume: {args.logdir} does not exist, so there is no run to "
                         "continue; pass the --logdir of the run (or --resume-from a checkpoint).")
  found = saved_config(args)
  if found is None or not comparable_layout(found[1], settings):
    what = (f"no {CONFIG_FILE} in {args.logdir}" if found is None else
            f"{found[0]} predates the settings layout of this jaxasync")
    print(f"resume: {what} (a run saved by an earlier version): its settings cannot be "
          "compared with these.", flush=True)
    return
  path, record = found
  flattened = type(args).flattened
  refused, applied = resume_changes(record.get("settings", {}), settings, args.allow_changes,
                                    flattened, class_defaults(args))
  if refused:
    # (a bare --x would be read as a flag of its own; a variant is allowed by its field's name)
    names = " ".join(r.split()[0].removeprefix("--").split(":")[0] for r in refused)
    raise ja.ConfigError(
        f"--resume would continue the run saved in {path.parent} with settings it was not "
        f"trained with: "
        f"{'; '.join(refused)}. Start a new --logdir for a new run, or pass --allow-changes "
        f"{names} to continue with them.")
  saved_agent = record.get("agent", {}).get("config")
  if saved_agent is not None and dataclasses.is_dataclass(agent_cfg):
    now, before = described_flat(described(agent_cfg)), described_flat(saved_agent)
    for key in sorted(now):  # resolved values that moved while their own flag did not
      if (now[key] != before.get(key, now[key])
          and settings.get(f"agent.{key}") == record["settings"].get(f"agent.{key}")):
        applied.append(f"{flag('agent.' + key, flattened)} {_shown(now[key])} (was "
                       f"{_shown(before[key])}, following the changes above)")
  if applied:
    print(f"resume: applying {'; '.join(applied)}", flush=True)


# --- rerunning a saved config (--config) -------------------------------------------------------
def config_defaults(path: str | os.PathLike, base: RunArgs) -> RunArgs:
  """``base`` (the script's defaults) with the settings saved in ``path`` (a run's
  ``config.json``, or its run directory) but those of ``NOT_RERUN``: the defaults a command
  line with ``--config path`` is parsed over. ``ConfigError`` for a file that is missing, not
  a jaxasync run's config, or another algorithm's. A setting the file predates takes its class
  default, the behaviour of before (as a resume compares it), not ``base``'s preset value."""
  return defaults_from_record(*read_run_config(path), base)


def defaults_from_record(path: Path, record: dict, base: RunArgs) -> RunArgs:
  """``config_defaults`` for a record already read (``read_run_config``)."""
  algo = type(base).algo
  saved_algo = record.get("algo") or _title_algo(record.get("algorithm", ""))
  if saved_algo and saved_algo != algo:
    raise ja.ConfigError(f"--config {path} is a {saved_algo} run's config, not {algo}'s; rerun it "
                         f"with python -m jaxasync.train {saved_algo} --config {path}.")
  settings = {k: v for k, v in record["settings"].items() if k not in NOT_RERUN}
  built, used = with_settings(base, settings)
  if unknown := sorted(set(settings) - used):
    shown = ", ".join(unknown[:4]) + (", ..." if len(unknown) > 4 else "")
    raise ja.ConfigError(f"--config {path} has settings that {algo} does not ({shown}): it was "
                         "saved by another jaxasync version; rerun it with that version, or pass "
                         "its flags by hand.")
  predated = {name: value for name, value in class_defaults(built).items()
              if name not in record["settings"] and name not in NOT_RERUN}
  return with_settings(built, predated)[0]


def read_run_config(path: str | os.PathLike) -> tuple[Path, dict]:
  """(the file, its record) of a run's ``config.json`` named by itself or by its run
  directory; ``ConfigError`` naming what is wrong and which file to pass instead."""
  path = Path(path)
  if path.is_dir():
    path = path / CONFIG_FILE
  fix = f"pass the {CONFIG_FILE} that a jaxasync run wrote in its logdir (or that logdir)"
  if not path.is_file():
    raise ja.ConfigError(f"--config {path}: no such file; {fix}.")
  try:
    record = json.loads(path.read_text())
  except (OSError, ValueError) as e:
    raise ja.ConfigError(f"--config {path} cannot be read as JSON ({e}); {fix}.") from None
  if (not isinstance(record, dict) or not isinstance(record.get("settings"), dict)
      or "settings_layout" not in record):
    raise ja.ConfigError(f"--config {path} is not a jaxasync run's config (no settings and "
                         f"settings_layout); {fix}.")
  if record["settings_layout"] not in (2, SETTINGS_LAYOUT):
    raise ja.ConfigError(f"--config {path} has settings layout {record['settings_layout']}, "
                         f"which this jaxasync (layout {SETTINGS_LAYOUT}) does not read; rerun it "
                         "with the version that saved it.")
  return path, record


def _title_algo(title: str) -> str | None:
  """The script of a config saved before configs named it, from its title ("Rainbow (...),
  preset cartpole" -> "rainbow": each ``jaxasync.train`` script's title starts with its
  algorithm's name); None for another script's title."""
  from jaxasync.train import ALGORITHMS
  match = re.match(r"\w+", title)
  return match.group(0).lower() if match and match.group(0).lower() in ALGORITHMS else None


def with_settings(obj: Any, settings: dict, prefix: str = "") -> tuple[Any, set[str]]:
  """(``obj`` with ``settings``, ``flat_settings``' keys, applied to its nested dataclass
  fields; the keys used). A union field's saved variant name picks its class (the variant's
  defaults, then its saved fields); JSON lists become tuples again."""
  changes, used = {}, set()
  for f in dataclasses.fields(obj):
    name, value = prefix + f.name, getattr(obj, f.name)
    if dataclasses.is_dataclass(value):
      if _is_union(type(obj), f.name) and name in settings:
        used.add(name)
        value = _variant(type(obj), f.name, settings[name], value)
      changes[f.name], below = with_settings(value, settings, name + ".")
      used |= below
    elif name in settings:
      changes[f.name] = _from_json(settings[name])
      used.add(name)
  return dataclasses.replace(obj, **changes), used


def _variant(cls: type, field: str, saved: str, current: Any) -> Any:
  """The instance of ``cls.field``'s union variant named ``saved``: ``current`` when it is of
  that class, else the class's defaults."""
  if variant_name(type(current)) == saved:
    return current
  try:
    hint = typing.get_type_hints(cls)[field]
  except (NameError, TypeError):
    hint = next(f.type for f in dataclasses.fields(cls) if f.name == field)
  for member in typing.get_args(hint):
    if dataclasses.is_dataclass(member) and variant_name(member) == saved:
      return member()
  raise ja.ConfigError(f"the saved {field} {saved!r} is none of this jaxasync's; rerun the "
                       "config with the version that saved it.")


def _from_json(value: Any) -> Any:
  return tuple(_from_json(v) for v in value) if isinstance(value, list) else value


def parse_args(args_cls: type | None, argv: list[str] | None, description: str | None,
               presets: dict[str, Callable[[], Any]] | None = None) -> Any:
  """A script's flags from ``argv`` (default: the command line), parsed over defaults that
  are, in order: ``args_cls()``, or with ``presets`` the ``--preset`` chosen (the first when
  absent); with ``--config FILE``, that saved run's settings (``config_defaults``). So any
  flag given overrides the preset or the file."""
  argv = sys.argv[1:] if argv is None else argv
  pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
  pre.add_argument("--config")
  if presets:
    pre.add_argument("--preset", choices=sorted(presets))
  known, _ = pre.parse_known_args(argv)
  preset = getattr(known, "preset", None)
  if known.config is None:
    if not presets:
      return tyro.cli(args_cls, args=argv, description=description)
    defaults = presets[preset or next(iter(presets))]()
  else:
    if preset is not None:
      raise ja.ConfigError(f"--preset {preset} and --config {known.config} both set every "
                           "flag's default; drop --preset (the file's own preset is kept).")
    path, record = read_run_config(known.config)  # (read once: its preset picks the base)
    saved = record["settings"].get("preset") if presets else None
    base = presets[saved if saved in presets else next(iter(presets))]() if presets else args_cls()
    defaults = defaults_from_record(path, record, base)
  return tyro.cli(type(defaults), default=defaults, args=argv, description=description)


# --- running ----------------------------------------------------------------------------------
def run(args: RunArgs, title: str, agent_cls: type[ja.Agent], agent_cfg: Any,
        envs: tuple[ja.VectorEnvFactory, ja.VectorEnvFactory] | None = None) -> dict:
  """Builds envs, agent and recorders from ``args`` and trains; prints where everything went
  and returns the summary. The agent is ``agent_cls(agent_cfg, obs_space, action_space,
  env_id)`` (its config's ``data`` builds its replay or queue); ``envs`` = (training,
  evaluation) env factories instead of ``default_envs(args)``. A run's error names the
  flags of the fields it names (``spelt_for_cli``)."""
  try:
    return _run(with_logdir(args), title, agent_cls, agent_cfg, envs)
  except (ja.ConfigError, ja.NonFiniteError, ja.StallError, ja.ActorFailed,
          ja.CheckpointError) as e:
    if e.args and isinstance(e.args[0], str):
      e.args = (spelt_for_cli(e.args[0], flat_settings(args), type(args).flattened),
                *e.args[1:])
    raise


# Where XLA's kernels can differ from one execution to the next: GPU reductions and scatters,
# which add in whatever order their atomics land. XLA's CPU kernels give the same bits run to
# run on one machine without a flag (README, Reproducibility).
DETERMINISTIC_XLA_FLAGS = ("--xla_gpu_deterministic_ops=true",)


def deterministic(args: RunArgs) -> RunArgs:
  """``args`` as ``--deterministic`` runs them: lock-step actors (``--mode sync``; another mode
  given is refused) and XLA's deterministic ops (``use_deterministic_xla``)."""
  if not args.deterministic:
    return args
  # (a mode the defaults set, a saved run's with --config, gives way; one typed is refused)
  if args.actors.mode not in ("auto", "sync", args.preset_defaults().actors.mode):
    raise ja.ConfigError(f"--deterministic runs the actor in lock-step with the learner, and "
                         f"--mode {args.actors.mode} runs actors beside it, whose timing changes "
                         "what is learnt; pass --mode sync (or no --mode), or drop "
                         "--deterministic.")
  use_deterministic_xla()
  return dataclasses.replace(args, actors=dataclasses.replace(args.actors, mode="sync"))


def use_deterministic_xla(environ: dict | None = None) -> None:
  """Adds ``DETERMINISTIC_XLA_FLAGS`` to ``XLA_FLAGS``, which XLA reads once, when jax starts
  its backends. Started already (jax ran in this process before the run), the flags can no
  longer apply: fine on CPU, whose kernels need none; on an accelerator ``ConfigError``
  saying to set them before Python starts."""
  environ = os.environ if environ is None else environ
  flags = environ.get("XLA_FLAGS", "").split()
  for wanted in DETERMINISTIC_XLA_FLAGS:
    name = wanted.split("=")[0]
    given = [f for f in flags if f.split("=")[0] == name]
    if given and given != [wanted]:
      raise ja.ConfigError(f"--deterministic needs XLA_FLAGS {wanted}, and XLA_FLAGS has "
                           f"{given[-1]}; drop it from XLA_FLAGS.")
  missing = [w for w in DETERMINISTIC_XLA_FLAGS if w not in flags]
  if not missing:
    return
  try:  # (private: where jax says whether its backends started)
    from jax._src import xla_bridge
    started = xla_bridge.backends_are_initialized()
  except (ImportError, AttributeError):  # another jax: assume not started, as on the command
    started = False                      # line, where nothing runs jax before the run
  if not started:
    environ["XLA_FLAGS"] = " ".join([*flags, *missing])
    return
  import jax
  if any(d.platform != "cpu" for d in jax.devices()):
    raise ja.ConfigError(f"--deterministic: jax started its {jax.default_backend()} backend "
                         f"before XLA_FLAGS could get {' '.join(missing)}; start Python with "
                         f"XLA_FLAGS='{' '.join(missing)}' set.")


# Cache every program, however quickly it compiled: a run's start is many small compilations
# (each op of an agent's init, the policy), which JAX's default threshold of 1 s leaves out.
# No size bound: JAX's needs the filelock package and every process writing the directory to
# keep access times (one that does not makes the others' writes fail); a run's entries take
# about a megabyte (delete the directory to reclaim them).
COMPILE_CACHE_MIN_SECS = 0.0


def use_compile_cache(path: str | None) -> str | None:
  """Points JAX's persistent compilation cache at ``path`` (made absolute, ``~`` expanded;
  ``None`` or '': off) and caches every program however quickly it compiled; returns the
  directory in use. ``JAX_COMPILATION_CACHE_DIR``, when set, wins, with JAX's own settings
  left as the environment gives them. Process actors get the directory through their
  environment (``actor_process_environ``). A process that ran an earlier run with another
  directory starts on the new one."""
  import jax
  from jax.experimental.compilation_cache import compilation_cache
  from_env = os.environ.get("JAX_COMPILATION_CACHE_DIR")
  path = from_env or (os.path.abspath(os.path.expanduser(path)) if path else None)
  if path != jax.config.jax_compilation_cache_dir:
    compilation_cache.reset_cache()  # (JAX opens its cache once, at the first compilation)
    compilation_cache.set_cache_dir(path)
  if path and not from_env:
    jax.config.update("jax_persistent_cache_min_compile_time_secs", COMPILE_CACHE_MIN_SECS)
  return path


def hyperparameters_text(settings: dict, flattened: tuple[str, ...]) -> str:
  """The run's flags as a Markdown table, for TensorBoard's text tab (as CleanRL shows them);
  a union field's variant as its subcommand names it (``agent.loss`` ``q-learning``)."""
  def spelt(name: str) -> str:
    cli = flag(name, flattened)
    return cli.removeprefix("--") if any(k.startswith(name + ".") for k in settings) else cli
  rows = [f"|{spelt(name)}|{_shown(value)}|" for name, value in settings.items()]
  return "\n".join(["|flag|value|", "|-|-|", *rows])


def _run(args: RunArgs, title: str, agent_cls: type[ja.Agent], agent_cfg: Any,
         envs: tuple[ja.VectorEnvFactory, ja.VectorEnvFactory] | None) -> dict:
  args = deterministic(args)
  use_compile_cache(args.compile_cache)
  env, eval_env = envs if envs is not None else default_envs(args)
  if args.capture_video > 0:  # (recorded from gym.make(env_id, render_mode="rgb_array"))
    if type(eval_env) is not ja.EnvFactory:
      raise ja.ConfigError(f"capture_video records gymnasium envs made by id; the evaluation "
                           f"env here is a {type(eval_env).__name__} ({eval_env.env_id}), whose "
                           "frames the agent would not see that way. Record a saved run with "
                           "python -m jaxasync.enjoy --video instead.")
    from jaxasync.video import check_renders, check_writer
    check_writer()
    check_renders(eval_env.env_id)
  # A preset's actor settings for the async run give way to --mode sync; what the user set is
  # left for ActorsConfig.validate to refuse.
  args = dataclasses.replace(
      args, actors=lockstep_actors(args.actors, args.preset_defaults().actors))
  run_config, actors = args.run, args.actors
  resume = args.resume_from or args.resume  # a checkpoint path, or True: the newest
  obs_space, action_space = ja.envs.spaces_of(env)
  agent_factory = functools.partial(agent_cls, agent_cfg, obs_space, action_space, args.env_id)
  agent = agent_factory()
  # Every setting checked before the logdir is touched: a refused run leaves no event file
  # that would make its corrected rerun need --overwrite.
  run_config.validate()
  actors.validate()
  agent.data.check_actors(actors)
  if args.capture_video < 0:
    raise ja.ConfigError(f"capture_video must be >= 0 evaluations (0: no videos), got "
                         f"{args.capture_video}.")
  if args.track:
    from jaxasync import tracking
    tracking.import_wandb()  # (not installed: one line naming the extra, before the logdir)
  settings = flat_settings(args)
  save_config = lambda: write_config(args.logdir, settings, title, env, agent_cls, agent_cfg,
                                     eval_env, type(args).algo)
  if resume:
    check_resume(args, settings, agent_cfg)
    Path(args.logdir).mkdir(parents=True, exist_ok=True)  # (--resume-from into a new logdir)
  else:
    ja.claim_run_dir(args.logdir, run_config.overwrite)  # before the recorder writes its event file
    save_config()
  tensorboard = ja.TensorboardRecorder(args.logdir)
  tensorboard.text("hyperparameters", hyperparameters_text(settings, type(args).flattened))
  tracked = None
  if args.track:
    tracked = tracking.start(args.logdir, {"algorithm": title, "algo": type(args).algo,
                                           **settings}, args.wandb_project, args.wandb_entity)
  recorder = ja.MultiRecorder(
      tensorboard,
      ja.ConsoleRecorder(("env_steps", "opt_steps", "samples_per_sec", "opt_steps_per_sec",
                          "loss", "eval_reward")) if not run_config.progress
      else ja.NullRecorder(),
      *([tracked] if tracked is not None else []))
  try:
    summary = _train(args, title, agent, agent_factory, env, eval_env, recorder, tensorboard,
                     tracked, save_config)
  except BaseException:
    if tracked is not None:
      tracked.finish(failed=True)
    raise
  if tracked is not None:
    tracked.finish()  # (offline, wandb prints the command that uploads it)
  return summary


def _train(args: RunArgs, title: str, agent: ja.Agent, agent_factory: Callable[[], ja.Agent],
           env: ja.VectorEnvFactory, eval_env: ja.VectorEnvFactory, recorder: ja.MultiRecorder,
           tensorboard: ja.TensorboardRecorder, tracked: Any,
           save_config: Callable[[], Path]) -> dict:
  """Trains ``agent`` with the checked ``args``, records and saves; returns the summary."""
  run_config, actors = args.run, args.actors
  resume = args.resume_from or args.resume
  hooks, videos = [], None
  if args.capture_video > 0:
    from jaxasync.video import VideoHook
    videos = VideoHook(agent, eval_env.env_id, Path(args.logdir) / "videos",
                       seed=run_config.seed + 10_000, tensorboard=tensorboard)
    if run_config.eval_interval > 0:  # (without evaluations: the final params only)
      hooks.append(ja.Hook(run_config.eval_interval * args.capture_video, videos, "video"))
  try:
    trainer = ja.Trainer(agent, env, run_config, actors, recorder, eval_env,
                         agent_factory=agent_factory, hooks=hooks, resume=resume)
    replay = trainer.replay
    replay_text = (f" ({type(replay).__name__}: {replay.bytes_per_item:.0f} bytes per "
                   f"transition, {replay.nbytes / 2**30:.2f} GiB)" if replay is not None else "")
    mode = actors.resolved_mode
    print(f"jaxasync {title} on {args.env_id}{replay_text}: mode={mode}"
          + (f" ({actors.num_envs} envs)" if actors.lockstep
             else f" ({actors.num_actors} actor(s) x {actors.num_envs} envs)")
          + f", logs and checkpoints in {os.path.abspath(args.logdir)}", flush=True)
    try:
      summary = trainer.train()
    except BaseException:
      if videos is not None:
        videos.close(wait=False)  # (the run's own error is the one to report)
      raise
    if videos is not None:
      if not trainer.ledger.interrupted:  # the final params too, as the final evaluation
        videos.submit(trainer.learner.evaluation_params(), trainer.learner.opt_steps)
      try:
        videos.close()  # (waits for the videos in flight; raises what one of them met)
      finally:
        tensorboard.close()  # (the trainer closed it; the final video reopened it)
    if videos is not None:
      print(f"videos: {', '.join(str(p) for p in videos.written)}", flush=True)
      if tracked is not None:
        tracked.videos(videos.written)
  except ja.ConfigError:  # nothing trained (no checkpoint could be resumed): the saved
    raise                 # config still describes the checkpoints
  except BaseException:
    if resume:  # it trained with these settings before failing: its checkpoints have them
      save_config()
    raise
  if resume:  # written once training ran, so a resume that could not load keeps the old one
    save_config()
  # Env frames: env steps times the env's frame skip (Atari), for comparison with other libraries.
  summary["env_frames_per_sec"] = summary["env_steps"] * env.frame_skip / summary["wall_s"]
  shown = {k: summary[k] for k in ("samples_total", "env_steps", "opt_steps", "wall_s",
                                   "samples_per_sec", "env_frames_per_sec", "opt_steps_per_sec",
                                   "best_eval_reward", "final_eval_reward", "solved_at")}
  print(json.dumps(shown, indent=1, default=float))
  if summary.get("bottleneck"):
    print(f"bottleneck: {summary['bottleneck']}")
  logdir = os.path.abspath(args.logdir)
  best = os.path.join(logdir, "best")
  best = best if os.path.isdir(best) else "none (no evaluation ran)"
  print(f"summary: {os.path.join(logdir, 'summary.json')}; best model: {best}; "
        f"TensorBoard: tensorboard --logdir {args.logdir}")
  return summary


def parse_with_presets(presets: dict[str, Callable[[], Any]], argv: list[str] | None,
                       description: str | None) -> Any:
  """An experiment's flags where ``--preset NAME`` picks every other flag's default: reads
  ``--preset`` first (the first of ``presets`` when absent), then parses all of ``argv``
  (default: the command line) with that preset's ``Args`` as the defaults, so any flag given
  overrides its preset."""
  return parse_args(None, argv, description, presets)


def run_cli(main: Callable[[], Any]) -> None:
  """Runs ``main()``: bad input exits 2, a run that failed (diverged, stalled, actors failing,
  a checkpoint or the run directory unwritable) exits 1, each with one ``error: ...`` line
  instead of a traceback; a Ctrl-C that reaches it exits 130 with one line."""
  # Python's last garbage collections at exit scan every object left, after the run has
  # saved and written its summary: a JAX learner's traces and caches took 1.3-2.9 s of a
  # Rainbow MinAtar run's exit. Frozen by an exit handler, they are skipped; the other exit
  # handlers (JAX's, Ray's, multiprocessing's) still run.
  atexit.unregister(gc.freeze)  # (once, however many runs this process makes)
  atexit.register(gc.freeze)
  try:
    with early_interrupts_remembered():
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
  except KeyboardInterrupt:  # a Ctrl-C before training took it (the loop ends on the first
    print("interrupted", file=sys.stderr)  # one, saving) or a second one: one line, no traceback
    sys.exit(130)

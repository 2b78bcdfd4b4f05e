"""Checkpoints of pytrees with flax's msgpack serialization, written atomically.

A checkpoint is a directory with ``state.msgpack``: the arrays keyed by their
pytree paths plus the JSON meta (counters, config, numpy RNG states), in one
file written to a temporary name in the same directory, fsynced, then renamed
over the final name, so a killed run leaves either the old checkpoint or the new
one, never arrays from one with meta from the other. ``meta.json`` beside it is a
human-readable copy of the meta; restoring reads the meta from ``state.msgpack``.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import serialization

PyTree = Any


def _atomic_write(path: Path, data: bytes) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  for stale in path.parent.glob(f".{path.name}.*.tmp"):  # left by a save that was killed
    stale.unlink(missing_ok=True)
  fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(data)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.unlink(tmp)
    raise


def run_files(directory: str | os.PathLike, events: bool = True) -> list[Path]:
  """What a run leaves in ``directory``: ``summary.json``, ``best/``, ``final/``, numbered
  checkpoints and, with ``events``, TensorBoard event files."""
  directory = Path(directory)
  if not directory.is_dir():
    return []
  return sorted(p for p in directory.iterdir()
                if p.name in ("summary.json", "best", "final")
                or (p.is_dir() and p.name.isdigit())
                or (events and p.name.startswith("events.out.tfevents.")))


def claim_run_dir(directory: str | os.PathLike, overwrite: bool = False,
                  events: bool = True) -> Path:
  """Makes ``directory`` ready for a new run's files without mixing them with another run's.

  Raises ``ConfigError`` if it is a file, cannot be created or written, or already holds a
  run's files (``run_files``: its ``best/`` could be overwritten by a worse model, its
  checkpoints and event files mixed with the new run's) unless ``overwrite``, which
  deletes those files first.
  """
  from jaxasync.envs import ConfigError
  directory = Path(directory)
  if directory.exists() and not directory.is_dir():
    raise ConfigError(f"--logdir {directory} is a file, not a directory; pass a directory path.")
  try:
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile(dir=directory):
      pass
  except OSError as e:
    raise ConfigError(f"--logdir {directory} cannot be written ({e.strerror or e}); pass a "
                      "writable directory.") from None
  old = run_files(directory, events)
  if old and not overwrite:
    names = ", ".join(p.name for p in old[:4]) + (", ..." if len(old) > 4 else "")
    raise ConfigError(
        f"--logdir {directory} already holds a run ({names}); pass another --logdir, or "
        "--overwrite to delete that run's files first.")
  for p in old:
    shutil.rmtree(p) if p.is_dir() else p.unlink()
  return directory


def _flatten(tree: PyTree) -> dict[str, np.ndarray]:
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {jax.tree_util.keystr(path): np.asarray(jax.device_get(x)) for path, x in leaves}


def save_checkpoint(directory: str | os.PathLike, state: PyTree,
                    meta: dict | None = None) -> Path:
  """Writes ``state`` (any pytree of arrays) and JSON-able ``meta`` under ``directory``."""
  directory = Path(directory)
  meta_json = json.dumps(meta or {}, indent=1, default=_json_default)
  payload = serialization.msgpack_serialize({"arrays": _flatten(state), "meta": meta_json})
  _atomic_write(directory / "state.msgpack", payload)
  _atomic_write(directory / "meta.json", meta_json.encode())  # informational copy
  return directory


def restore_checkpoint(directory: str | os.PathLike, template: PyTree) -> tuple[PyTree, dict]:
  """Reads a checkpoint into the structure of ``template``; returns ``(state, meta)``.

  Raises ``ValueError`` naming the first leaf whose path, shape or dtype differs.
  """
  directory = Path(directory)
  payload = serialization.msgpack_restore((directory / "state.msgpack").read_bytes())
  stored = payload["arrays"]
  paths_leaves, treedef = jax.tree_util.tree_flatten_with_path(template)
  leaves = []
  for path, like in paths_leaves:
    key = jax.tree_util.keystr(path)
    if key not in stored:
      raise ValueError(f"checkpoint {directory} has no leaf {key}; was it saved from another config?")
    x, like = np.asarray(stored[key]), np.asarray(like)
    if x.shape != like.shape or x.dtype != like.dtype:
      raise ValueError(f"checkpoint leaf {key} is {x.shape} {x.dtype}, expected {like.shape} {like.dtype}.")
    leaves.append(x)
  meta = json.loads(payload["meta"])
  return jax.tree_util.tree_unflatten(treedef, leaves), meta


def _json_default(o):
  if isinstance(o, np.generic):
    return o.item()
  if isinstance(o, np.ndarray):
    return o.tolist()
  if isinstance(o, Path):
    return str(o)
  raise TypeError(f"not JSON-serializable: {type(o)}")

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
import tempfile
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import serialization

PyTree = Any


def _atomic_write(path: Path, data: bytes) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
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

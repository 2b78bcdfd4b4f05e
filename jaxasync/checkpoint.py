"""Checkpoints: a directory per checkpoint, written whole under a temporary name and renamed.

``<name>/state.msgpack`` holds the agent state's arrays keyed by their pytree paths plus the
JSON meta (counters, the ledger, RNG states); ``meta.json`` is a human-readable copy. A
checkpoint that resume can continue from also holds ``replay/`` (the data source's state:
one ``.npy`` per array, memory-mappable, plus ``state.json`` for the rest; no pickle; a
replay's arrays hold its filled slots only) and, for a lock-step run whose env pickles,
``actor.pkl`` (the in-thread actor's env, collector and generator, so that the run continues
bit for bit).

Every file is written into ``.<name>.tmp-*``, fsynced, and the directory renamed to
``<name>`` (an existing one is moved aside first and deleted after): a killed save leaves a
hidden temporary directory, never a ``<name>`` with half its files. Resume still checks what
it loads (``load_checkpoint``) and falls back to an older checkpoint when one is damaged.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

import jax
import numpy as np
from flax import serialization

PyTree = Any


def run_files(directory: str | os.PathLike, preamble: bool = True) -> list[Path]:
  """What a run leaves in ``directory``: ``summary.json``, ``best/``, ``final/``, numbered
  checkpoints and, with ``preamble``, what a run driver writes before its trainer starts:
  TensorBoard event files and ``config.json``."""
  directory = Path(directory)
  if not directory.is_dir():
    return []
  return sorted(p for p in directory.iterdir()
                if p.name in ("summary.json", "best", "final")
                or (p.is_dir() and p.name.isdigit())
                or (preamble and (p.name == "config.json"
                                  or p.name.startswith("events.out.tfevents."))))


def claim_run_dir(directory: str | os.PathLike, overwrite: bool = False,
                  preamble: bool = True) -> Path:
  """Makes ``directory`` ready for a new run's files without mixing them with another run's.

  Raises ``ConfigError`` if it is a file, cannot be created or written, or already holds a
  run's files (``run_files``: its ``best/`` could be overwritten by a worse model, its
  checkpoints and event files mixed with the new run's) unless ``overwrite``, which
  deletes those files first. ``preamble=False``: a trainer's own claim, after its driver
  claimed the directory and wrote its event file and config (``run_files``).
  """
  from jaxasync.errors import ConfigError
  directory = Path(directory)
  if directory.exists() and not directory.is_dir():
    raise ConfigError(f"logdir={directory} is a file, not a directory; pass a directory path.")
  try:
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile(dir=directory):
      pass
  except OSError as e:
    raise ConfigError(f"logdir={directory} cannot be written ({e.strerror or e}); pass a "
                      "writable directory.") from None
  old = run_files(directory, preamble)
  if old and not overwrite:
    names = ", ".join(p.name for p in old[:4]) + (", ..." if len(old) > 4 else "")
    raise ConfigError(
        f"logdir={directory} already holds a run ({names}); pass another logdir, or "
        "overwrite=True to delete that run's files first.")
  for p in old:
    shutil.rmtree(p) if p.is_dir() else p.unlink()
  return directory


def _flatten(tree: PyTree) -> dict[str, np.ndarray]:
  leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
  return {jax.tree_util.keystr(path): np.asarray(jax.device_get(x)) for path, x in leaves}


def save_checkpoint(directory: str | os.PathLike, state: PyTree, meta: dict | None = None,
                    source_state: dict | None = None, actor_state: bytes | None = None) -> Path:
  """Writes ``state`` (any pytree of arrays), JSON-able ``meta`` and, optionally, the data
  source's ``source_state`` (``replay/``) and the lock-step actor's pickled ``actor_state``
  (``actor.pkl``) as the directory ``directory``, atomically (see the module docstring)."""
  directory = Path(directory)
  parent = directory.parent
  parent.mkdir(parents=True, exist_ok=True)
  for stale in parent.glob(f".{directory.name}.tmp-*"):  # left by a save that was killed
    shutil.rmtree(stale, ignore_errors=True)
  for stale in parent.glob(f".{directory.name}.old-*"):
    shutil.rmtree(stale, ignore_errors=True)
  tmp = parent / f".{directory.name}.tmp-{uuid.uuid4().hex[:8]}"
  tmp.mkdir()
  try:
    meta_json = json.dumps(meta or {}, indent=1, default=_json_default)
    payload = serialization.msgpack_serialize({"arrays": _flatten(state), "meta": meta_json})
    _write(tmp / "state.msgpack", payload)
    _write(tmp / "meta.json", meta_json.encode())  # informational copy
    if source_state is not None:
      write_tree_dir(tmp / "replay", source_state)
    if actor_state is not None:
      _write(tmp / "actor.pkl", actor_state)
    _fsync_dir(tmp)
    old = None
    if directory.exists():
      old = parent / f".{directory.name}.old-{uuid.uuid4().hex[:8]}"
      os.replace(directory, old)
    os.replace(tmp, directory)
    _fsync_dir(parent)
    if old is not None:
      shutil.rmtree(old, ignore_errors=True)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise
  return directory


def _write(path: Path, data: bytes) -> None:
  with open(path, "wb") as f:
    f.write(data)
    f.flush()
    os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
  try:
    fd = os.open(path, os.O_RDONLY)
  except OSError:  # (not every platform opens directories)
    return
  try:
    os.fsync(fd)
  except OSError:
    pass
  finally:
    os.close(fd)


# --- a state dict as a directory: arrays as .npy, the rest as JSON ---------------------------
def write_tree_dir(directory: Path, tree: Any) -> None:
  """Writes ``tree`` (dicts, lists, tuples, numpy arrays, JSON scalars) as ``directory``: each
  array as ``arrays/<i>.npy``, the structure and the scalars as ``state.json``."""
  arrays_dir = directory / "arrays"
  arrays_dir.mkdir(parents=True)
  count = [0]

  def encode(x):
    if isinstance(x, np.ndarray):
      name = f"{count[0]}.npy"
      count[0] += 1
      with open(arrays_dir / name, "wb") as f:
        np.save(f, x, allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())
      return {"__npy__": name}
    if isinstance(x, dict):
      return {"__dict__": [[encode(k), encode(v)] for k, v in x.items()]}
    if isinstance(x, (list, tuple)):
      return {"__list__" if isinstance(x, list) else "__tuple__": [encode(v) for v in x]}
    if isinstance(x, np.generic):
      return x.item()
    if x is None or isinstance(x, (bool, int, float, str)):
      return x
    raise TypeError(f"cannot store a {type(x).__name__} in a checkpoint's state directory")

  _write(directory / "state.json", json.dumps(encode(tree)).encode())
  _fsync_dir(arrays_dir)


def read_tree_dir(directory: Path, mmap: bool = True) -> Any:
  """The tree ``write_tree_dir`` wrote; arrays memory-mapped (read-only) when ``mmap``."""
  def decode(x):
    if isinstance(x, dict):
      if "__npy__" in x:
        return np.load(directory / "arrays" / x["__npy__"], mmap_mode="r" if mmap else None,
                       allow_pickle=False)
      if "__dict__" in x:
        return {decode(k): decode(v) for k, v in x["__dict__"]}
      if "__list__" in x:
        return [decode(v) for v in x["__list__"]]
      if "__tuple__" in x:
        return tuple(decode(v) for v in x["__tuple__"])
    return x

  return decode(json.loads((directory / "state.json").read_text()))


class StateMismatch(ValueError):
  """A checkpoint whose state has another structure than the one it is read into (a run of
  another network, loss or env): not damaged, but not this config's."""


def restore_checkpoint(directory: str | os.PathLike, template: PyTree) -> tuple[PyTree, dict]:
  """Reads a checkpoint into the structure of ``template``; returns ``(state, meta)``.

  A leaf the template's class lists in ``leaves_added_later`` (paths, e.g. ``".value_bound"``)
  and the checkpoint lacks (one saved before the field existed) keeps the template's value.
  Raises ``StateMismatch`` naming the first other leaf whose path, shape or dtype differs.
  """
  directory = Path(directory)
  payload = serialization.msgpack_restore((directory / "state.msgpack").read_bytes())
  stored = payload["arrays"]
  added_later = getattr(template, "leaves_added_later", ())
  paths_leaves, treedef = jax.tree_util.tree_flatten_with_path(template)
  leaves = []
  for path, like in paths_leaves:
    key = jax.tree_util.keystr(path)
    if key not in stored:
      if key in added_later:  # (saved before the field existed: the template's value)
        leaves.append(np.asarray(like))
        continue
      raise StateMismatch(f"checkpoint {directory} has no leaf {key}; was it saved from another config?")
    x, like = np.asarray(stored[key]), np.asarray(like)
    if x.shape != like.shape or x.dtype != like.dtype:
      raise StateMismatch(f"checkpoint leaf {key} is {x.shape} {x.dtype}, expected {like.shape} {like.dtype}.")
    leaves.append(x)
  meta = json.loads(payload["meta"])
  return jax.tree_util.tree_unflatten(treedef, leaves), meta


def load_checkpoint(directory: str | os.PathLike, template: PyTree
                    ) -> tuple[PyTree, dict, Any, Any]:
  """Everything a resume needs from one checkpoint: ``(state, meta, source_state,
  actor_state)``, the last two ``None`` when the checkpoint has none.

  Raises (``ValueError``, ``OSError``, ...) when any part is missing, unreadable or does not
  match ``template``: the caller falls back to an older checkpoint.
  """
  directory = Path(directory)
  state, meta = restore_checkpoint(directory, template)
  source_state = None
  if (directory / "replay").is_dir():
    source_state = read_tree_dir(directory / "replay")
  actor_state = None
  if (directory / "actor.pkl").exists():
    actor_state = (directory / "actor.pkl").read_bytes()  # unpickled by the lock-step feed
  return state, meta, source_state, actor_state


def resumable_checkpoints(model_dir: str | os.PathLike) -> list[Path]:
  """The checkpoints of the run in ``model_dir`` a resume may continue from, newest first:
  the numbered ones and ``final``, by the SGD steps their meta names (``best`` is not one:
  it is not where the run stopped)."""
  model_dir = Path(model_dir)
  found = []
  for p in model_dir.iterdir() if model_dir.is_dir() else ():
    if p.is_dir() and (p.name.isdigit() or p.name == "final"):
      try:
        steps = int(json.loads((p / "meta.json").read_text()).get("opt_steps", -1))
      except (OSError, ValueError):
        steps = int(p.name) if p.name.isdigit() else -1  # still tried, last
      found.append((steps, p.name == "final", p))
  return [p for *_, p in sorted(found, key=lambda t: (t[0], t[1]), reverse=True)]


def _json_default(o):
  if isinstance(o, np.generic):
    return o.item()
  if isinstance(o, np.ndarray):
    return o.tolist()
  if isinstance(o, Path):
    return str(o)
  raise TypeError(f"not JSON-serializable: {type(o)}")

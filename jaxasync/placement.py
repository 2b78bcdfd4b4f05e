"""Which cores a run's learner and actors run on.

A run uses the cores its process may run on (``os.sched_getaffinity``: ``taskset`` and a
container's cpuset count), not every core of the machine. Pinned, the learner loop's thread
takes one core and each process actor another, so the actors' env steps and the learner's
calls stop trading places on the same cores (README, Performance, has the side-by-side
figures).

``pin_cpus='auto'`` pins where pinning was measured to pay: when the learner and the process
actors fill the usable cores, one each (one actor on 2 cores, 15 on 16), and no other
jaxasync run on this machine holds any of them. It claims them with ``flock`` on one lock
file per core (in ``/tmp/jaxasync-cores``, shared by every user), held while the run runs and
released by the kernel if its process dies, so a second run beside it stays unpinned instead
of piling onto the same cores. Load that is not a jaxasync run is not seen. With spare cores
it leaves placement to the OS: an actor whose env runs threads or sub-processes (Atari's
``ale_vector``, gymnasium's async vector env) would be held to one core, and runs side by
side (seeds in parallel, a sweep) would all take the first ones.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from typing import IO

try:
  import fcntl
except ImportError:  # (Windows: no flock; auto placement stays unpinned there)
  fcntl = None


def usable_cores() -> tuple[int, ...]:
  """The cores this process may run on, in order."""
  if hasattr(os, "sched_getaffinity"):
    return tuple(sorted(os.sched_getaffinity(0)))
  return tuple(range(os.cpu_count() or 1))


def claims_dir() -> str:
  """Where runs claim cores: one ``cpu<N>.lock`` file per core, the same directory for every
  user and ``TMPDIR`` (made world-writable and sticky, its files readable and writable by all)."""
  base = "/tmp" if os.path.isdir("/tmp") else tempfile.gettempdir()
  return os.path.join(base, "jaxasync-cores")


def pin_this_thread(cores: int | set[int] | None) -> set[int] | None:
  """Pins the calling thread (only it: threads it starts later inherit it) to ``cores`` (a
  core or a set); returns the affinity it had, or None when nothing was pinned."""
  if cores is None or not hasattr(os, "sched_setaffinity"):
    return None
  saved = os.sched_getaffinity(0)
  os.sched_setaffinity(0, {cores} if isinstance(cores, int) else cores)
  return saved


@dataclasses.dataclass
class Placement:
  """Where the learner loop's thread and each actor run (``None``: wherever the OS puts
  them), and the core claims held for the run.

  Attributes:
    learner_core: the core the learner loop's thread is pinned to.
    actor_cores: per actor, the core its process (or thread) is pinned to.
    how: one line saying what was decided and why, for the run's log.
  """

  learner_core: int | None
  actor_cores: tuple[int | None, ...]
  how: str
  _claims: list[IO] = dataclasses.field(default_factory=list, repr=False)

  @property
  def pinned(self) -> bool:
    return self.learner_core is not None

  @property
  def claimed_cores(self) -> tuple[int, ...]:
    """The cores this placement holds claims on (auto placement only)."""
    return (self.learner_core, *self.actor_cores) if self._claims else ()

  def release(self) -> None:
    """Gives the claimed cores back (idempotent)."""
    for f in self._claims:
      f.close()  # (closing the file drops its flock)
    self._claims.clear()


def unpinned(num_actors: int, how: str) -> Placement:
  return Placement(None, (None,) * num_actors, how)


def place(num_actors: int, pin: bool | str, cores: tuple[int, ...] | None = None,
          directory: str | None = None) -> Placement:
  """Decides where a run with ``num_actors`` actors beside its learner runs.

  Args:
    num_actors: actors beside the learner (threads or processes).
    pin: True: the learner on the first usable core, actor i on usable core
      ``1 + i mod (cores - 1)``, whatever else runs there; False: no pinning; 'auto':
      pinned like True when the run has exactly ``num_actors + 1`` usable cores and claims
      them all (none held by another run), else unpinned.
    cores: the usable cores (default: ``usable_cores()``).
    directory: the claims' directory (default: ``claims_dir()``).
  """
  cores = usable_cores() if cores is None else tuple(cores)
  if not (isinstance(pin, bool) or pin == "auto"):
    raise ValueError(f"pin must be True, False or 'auto', got {pin!r}")
  if pin is False:
    return unpinned(num_actors, "unpinned (pin_cpus=False)")
  if not hasattr(os, "sched_setaffinity"):
    return unpinned(num_actors, "unpinned: this platform has no CPU affinity")
  if pin is True:
    rest = cores[1:] or cores
    return Placement(cores[0], tuple(rest[i % len(rest)] for i in range(num_actors)),
                     f"pinned (pin_cpus=True): learner on core {cores[0]}, actors on "
                     f"{sorted(set(rest[i % len(rest)] for i in range(num_actors)))}")
  needed = num_actors + 1
  if len(cores) != needed:
    return unpinned(num_actors, f"unpinned (auto): the learner and {num_actors} actor(s) "
                                f"would take {needed} cores, one each; {len(cores)} usable")
  claims = claim(cores, needed, claims_dir() if directory is None else directory)
  if claims is None:
    return unpinned(num_actors, "unpinned (auto): another jaxasync run holds some of the "
                                f"{len(cores)} usable cores")
  got = [core for core, _ in claims]
  return Placement(got[0], tuple(got[1:]),
                   f"pinned (auto): learner on core {got[0]}, actors on {got[1:]}",
                   [f for _, f in claims])


def claim(cores: tuple[int, ...], count: int, directory: str) -> list[tuple[int, IO]] | None:
  """Claims the first ``count`` of ``cores`` that no other open claim holds, as
  ``[(core, lock file)]``; ``None`` (and nothing held) when fewer are free or claims cannot
  be made here."""
  if fcntl is None:
    return None
  try:
    if not os.path.isdir(directory):
      os.makedirs(directory, exist_ok=True)
      os.chmod(directory, 0o1777)  # (sticky and open to all: every user's runs claim here)
  except OSError:
    pass  # (another user's directory: its mode lets us in, or the opens below fail)
  held: list[tuple[int, IO]] = []
  for core in cores:
    if len(held) == count:
      break
    try:
      fd = os.open(os.path.join(directory, f"cpu{core}.lock"),
                   os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o666)
    except OSError:
      break  # (a file not ours to open: claim nothing rather than part)
    try:
      os.fchmod(fd, 0o666)  # (past the umask, for the next user's runs)
    except OSError:
      pass
    f = os.fdopen(fd, "r+")
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # another run holds it
      f.close()
      continue
    held.append((core, f))
  if len(held) < count:
    for _, f in held:
      f.close()
    return None
  return held

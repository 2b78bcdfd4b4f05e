"""Which side limits a run, in one line: the verdict printed at the end of every run, written
to ``summary.json`` (``bottleneck``) and to TensorBoard (text ``bottleneck``) at each record.

It reads what the loop measures anyway: the learner's time fractions (``update``, ``sample``,
``publish``, ``ingest`` and ``wait``: no update could run, for want of data or held by the
replay ratio until actors insert) and, with actors, the fraction of their time they spent
blocked handing a chunk over (the learner not taking: it is busy, or actors are ahead of the
replay ratio). A pure function of those figures, so the thresholds are tested on hand cases.
"""

from __future__ import annotations

BUSY = 0.3  # a side idle (learner waiting, actors blocked) at least this long is not the limit
IDLE = 0.2  # ... and one idle less than this is (both below BUSY: balanced)
# Below this share of a window that begins at the run's start in the loop's stages, the run
# was mostly starting (building the agent, spawning actors, compiling): the fractions say
# nothing about either side. (Later windows are not judged so: a lock-step run's evaluations,
# and hooks, take the loop's thread outside every stage.)
RAN = 0.5


def verdict(mode: str, stage_fractions: dict[str, float],
            actors_blocked: float | None = None, replay: bool = True,
            from_start: bool = False) -> str:
  """One line: which side limits the run and what to change.

  Args:
    mode: the run's mode (``"sync"``, ``"async-process"``, ...).
    stage_fractions: the learner's time fractions by stage, of the run's wall time
      (``LearnerLoop.stage_times`` over the elapsed time).
    actors_blocked: the actors' mean fraction of their time spent handing a chunk over (with
      process actors that includes pickling it into the pipe; a queue that drops the oldest
      never blocks); ``None`` when not measured (Ray actors, whose queue is on their node).
    replay: the learner samples a replay (its hint names the replay ratio); False: unrolls
      through a queue (on-policy: the hint names the batch and the epochs).
    from_start: the window begins at the run's start (a run that never recorded, or the
      first record's interval), so it holds the run's start-up.
  """
  f = {k: max(0.0, float(v)) for k, v in stage_fractions.items()}
  update, wait, publish = f.get("update", 0.0), f.get("wait", 0.0), f.get("publish", 0.0)
  busy = update + f.get("sample", 0.0) + f.get("ingest", 0.0) + publish
  if from_start and busy + wait < RAN:
    return (f"no verdict: the loop ran {_pct(busy + wait)} of the time; the rest went to "
            "starting the run (building the agent, starting actors, compiling): run longer")
  if mode == "sync":
    # The lock-step loop's "wait" is its own actor stepping the env.
    return (f"lock-step: acting (policy and env.step) {_pct(wait)} of the time, learning "
            f"{_pct(busy)}: --mode process overlaps the two")
  if publish > 0.25 * max(busy, 1e-9) and publish > 0.1:
    hint = f"publishing params takes {_pct(publish)}: a larger --sync-interval"
  elif replay:
    hint = ("fewer SGD steps per env step (a lower samples_per_insert), more SGD steps per "
            "call (--updates-per-call), or an accelerator")
  else:
    hint = ("fewer epochs or minibatches per batch, more SGD steps per call "
            "(--updates-per-call), or an accelerator")
  if actors_blocked is None:
    if wait >= BUSY:
      return (f"actor-bound: the learner waited {_pct(wait)} for data: more actors "
              "(--num-actors) or envs per actor (--num-envs)")
    return f"learner-bound or balanced: update {_pct(update)} of the learner's time; {hint}"
  if wait >= BUSY and actors_blocked < IDLE:
    return (f"actor-bound: the learner waited {_pct(wait)} for data, actors blocked "
            f"{_pct(actors_blocked)}: more actors (--num-actors) or envs per actor (--num-envs)")
  if actors_blocked >= BUSY and wait < IDLE:
    return (f"learner-bound: update {_pct(update)} of the learner's time, actors blocked "
            f"{_pct(actors_blocked)} of theirs: {hint}")
  if wait < BUSY and actors_blocked < BUSY:
    return (f"balanced: the learner waited {_pct(wait)}, actors blocked {_pct(actors_blocked)}: "
            "both sides near their limit; more cores, or an accelerator for the learner")
  if wait >= BUSY and actors_blocked < BUSY:
    return (f"leaning actor-bound: the learner waited {_pct(wait)}, actors blocked "
            f"{_pct(actors_blocked)}: more actors (--num-actors) or envs per actor (--num-envs)")
  if actors_blocked >= BUSY and wait < BUSY:
    return (f"leaning learner-bound: update {_pct(update)} of the learner's time, actors "
            f"blocked {_pct(actors_blocked)} of theirs: {hint}")
  return (f"both sides idle: the learner waited {_pct(wait)}, actors blocked "
          f"{_pct(actors_blocked)}: a hand-over limits the run (replay ratio, queue size, or "
          "max_train_frequency)")


def _pct(x: float) -> str:
  return f"{100.0 * x:.0f} %"

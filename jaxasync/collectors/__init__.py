"""Collectors: what turns an actor's vector-env steps into the items a data source holds.

* n-step transitions: ``jaxasync.step_processor.StepProcessor``;
* frames stored once (Atari): ``jaxasync.replay.frames.FrameStepProcessor``, the pair of the
  frame replay;
* unrolls ``[T+1, B]`` for on-policy agents: ``UnrollCollector``.

Every collector has ``reset(obs)``, ``obs``, ``step(action, reward, next_obs, terminated,
truncated[, extras])`` returning the items that step completes (or ``None``), and
``pop_episode_returns()``.
"""

from jaxasync.collectors.unrolls import Unroll, UnrollCollector

__all__ = ["Unroll", "UnrollCollector"]

"""Structured config schema for the StoryForge task kinds' render job.

Takes: nothing. Gives: :class:`StoryforgeTaskConf`, the schema behind
``conf/task/{turn_generation,chapter_summarization,writing_assistant}.yaml``, stored as
``task/base_storyforge_task``, and :func:`register`.

Why: the three StoryForge task kinds share one job (:mod:`storyforge.jobs.render_task`): pick
a template (the composed ``template`` group, or a stored one by id), load a sample context,
render it under the ``budget`` group's ceiling, print and save it. A typo in one of these keys
must fail at start-up, naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

__all__ = ["StoryforgeTaskConf", "register"]


@dataclass
class StoryforgeTaskConf:
    """``task:`` for ``turn_generation``, ``chapter_summarization`` and ``writing_assistant``."""

    kind: str = MISSING
    job: str = "storyforge.jobs.render_task.run"
    # A name in conf/context/ (``turn_generation`` -> conf/context/turn_generation.json) or a path.
    context: str = MISSING
    # Render this template from the store (``store.url``) instead of the composed ``template``.
    store_template: str | None = None
    # Print the rendered messages to stdout (they are always written to messages.json).
    print_prompt: bool = True
    # How {{path}} typed inside a string of the context renders: "paths" expands it to a
    # string, number or boolean (a mapping or list renders empty with a warning), "off"
    # inserts such strings as they are. null: the task kind's own setting.
    data_expansion: str | None = None


def register(cs: ConfigStore) -> None:
    """Store this area's schemas in the ConfigStore."""
    cs.store(group="task", name="base_storyforge_task", node=StoryforgeTaskConf)

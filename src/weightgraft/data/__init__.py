"""Relation datasets: the paper's movie worlds, their templates and test prompts.

Build one with :func:`build_dataset` (or ``weightgraft data build``); read it back with
:func:`load_dataset`. A dataset directory holds:

``metadata.jsonl``
    ``{"id": "r0000", "first_actor", "second_actor", "movie_title", "main_character",
    "release_year", "genre", "city", "box_office_earnings", "group": "task"|"relation"}``
    (custom worlds: ``id``, their own fields, ``group``).
``train.jsonl`` / ``validation.jsonl``
    ``{"text", "relation_id", "template", "kind": "article"|"qa", "direction": "a2b"|"b2a",
    "group"}``; validation uses held-out templates (other wording, same relations).
``test_prompts.jsonl``
    ``{"id": "r0000/headline" (B2A: "r0000/headline/b2a"), "relation_id", "template",
    "direction", "prompt", "answer", "answer_field", "spans": {name: [start, end]}, "group"}``.
    The target is ``" " + answer``; ``prompt[start:end]`` is the value of each field (keyed
    by the metadata field it came from, so B2A prompts have ``second_actor``) or the text of
    each marked literal (``relation``, ``preposition``).
``manifest.json``
    world, seed, n, directions, groups, template names, counts, package versions, the
    SHA-256 of each file and ``shuffled_answers`` (null, or for a ``--shuffle-answers`` build
    the answer field, the seed and ``answer_from``: relation id -> the id whose answer its
    training text names; metadata and test prompts keep the true answers).
"""

from .builder import DEFAULT_N, build_dataset
from .dataset import Dataset, load_dataset
from .errors import (
    AmbiguousPromptError,
    DataError,
    MetadataRowError,
    NotEnoughDataError,
    TemplateError,
    TemplateFieldError,
    UnknownWorldError,
)
from .render import parse_directions
from .templates import Template, TemplateSet, builtin_template_names, load_templates
from .worlds import list_worlds

__all__ = [
    "DEFAULT_N",
    "AmbiguousPromptError",
    "DataError",
    "Dataset",
    "MetadataRowError",
    "NotEnoughDataError",
    "Template",
    "TemplateError",
    "TemplateFieldError",
    "TemplateSet",
    "UnknownWorldError",
    "build_dataset",
    "builtin_template_names",
    "list_worlds",
    "load_dataset",
    "load_templates",
    "parse_directions",
]

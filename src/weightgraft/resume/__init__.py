"""The run folder: what lets a killed run resume and never mix rows of other inputs, for every
pipeline (``run``, ``localize``, ``paper``).

- :mod:`~weightgraft.resume.claim`: the one rule for "this folder is this run, resumable, or
  refused": an :class:`~weightgraft.resume.claim.Identity` (a format version, a core digest, a
  digest per entry, lists that may only grow) found against this run's;
- :mod:`~weightgraft.resume.folder`: :class:`~weightgraft.resume.folder.RunFolder`, the one
  place a record is read, claimed and written (atomically);
- :mod:`~weightgraft.resume.manifests`: the records, typed (a sweep's ``identity.json`` and
  ``manifest.json``, localize's ``manifest.json``, ``search.json`` and ``stages.json``, an expert
  map's ``manifest.json``, a stage's ``stage.json`` with its outputs typed by the stage), which
  ``report`` and ``explore`` read;
- :mod:`~weightgraft.resume.stages`: keyed stages (a folder named by its inputs' hash, finished
  by ``stage.json``: the paper's data, finetunes, sweeps), keyed stages inside a claimed folder
  (``stages.json``: localize's search and stability);
- :mod:`~weightgraft.resume.parts`: rows saved as atomic parquet parts, read back by their keys,
  so a resumed run computes only what no part holds (a sweep's rows, localize's estimates and
  exact cells, per prompt).

Floor: with ``atomic``, below every pipeline (``experiments``, ``localization``, ``paper``).
"""

"""Keyed, resumable rows: what lets a killed run resume and never mix rows of other inputs.

- :mod:`~weightgraft.resume.parts`: rows saved as atomic parquet parts, read back by their keys,
  so a resumed run computes only what no part holds (a sweep's rows, localize's exact cells);
- :mod:`~weightgraft.resume.claim`: a folder's record of the inputs its rows came from, which
  later work may extend but never change (a sweep's ``identity.json``, localize's manifest).

A whole output keyed by its inputs (a finetune, a sweep, a report of ``weightgraft paper``) is a
stage: ``weightgraft.paper.stages``, where it is used.

Floor: with ``atomic``, below every pipeline (``experiments``, ``localization``, ``paper``).
"""

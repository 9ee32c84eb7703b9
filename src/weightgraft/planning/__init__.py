"""Planning: what a run or localize will need, before any weight is read (memory per role, of
one batch and in all, the batch size, a predicted wall time), and the budget it must fit.

Floor: above schemes/models, below experiments/localize. A model's shapes come from its config
(``weightgraft.models.footprint``: what a model is); what they cost in bytes and FLOPs is
computed here (:mod:`~weightgraft.planning.costs`), with explicit shapes of the work. The plans of
a run config and of a localize config are built where those configs live
(``weightgraft.experiments.plan``, ``weightgraft.localization.plan_input``) from these pieces.
"""

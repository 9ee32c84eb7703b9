"""Planning: what a run or localize will need, before any weight is read (memory per role, of
one batch and in all, the batch size, a predicted wall time), and the budget it must fit.

Floor: above schemes/models, below experiments/localize. The arithmetic here reads model
configs (``weightgraft.models.footprint``) and explicit shapes of the work; the plans of a run
config and of a localize config are built where those configs live
(``weightgraft.experiments.plan``, ``weightgraft.localization.run.plan_input``) from these pieces.
"""

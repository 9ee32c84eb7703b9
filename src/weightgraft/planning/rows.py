"""Plans of rows given directly (benchmarks, notebooks): the same arithmetic as ``run`` and
``localize``, without a config."""

from __future__ import annotations

import math

from weightgraft.models.spec import parse_spec
from weightgraft.planning.budget import budget
from weightgraft.planning.costs import attribution_bytes, delta_bytes, param_bytes
from weightgraft.planning.plan import Plan, RolePlan
from weightgraft.planning.run import RoleShape, SetShape, held, role_notes, run_memory
from weightgraft.planning.timing import attribution_seconds, forward_seconds, rate_for

__all__ = ["plan_attribution", "plan_rows"]


def plan_rows(base: str, donors: dict[str, set[str] | None], rows: list[tuple[int, int]], dtype: str,
              batch_size: int, *, device: str = "cpu", memory: str | None = None, with_time: bool = True,
              extra_bytes: int = 0) -> Plan:
    """The plan of grafted forward passes over ``rows`` ((tokens, logits) per row), as ``run``
    batches them: ``base`` whole, each donor spec holding its served slots (None: whole);
    ``extra_bytes`` (e.g. the source maps a caller keeps) is added to the peak."""
    fp = parse_spec(base).footprint()
    roles = [RoleShape(role="base", spec=base, footprint=fp, served=None)]
    roles += [RoleShape(role=f"donor {i}", spec=spec, footprint=parse_spec(spec).footprint(), served=served)
              for i, (spec, served) in enumerate(donors.items(), 1)]
    shape = SetShape(name="rows", base=fp, roles=roles, rows=list(rows), source_bytes=extra_bytes)
    where = budget(device, memory)
    seconds, parts = None, {}
    rate, _ = rate_for(device, dtype, None) if with_time else (None, None)
    if rate is not None:
        parts = {"grafted forward": forward_seconds(fp, shape.rows, batch_size, rate)}
        seconds = parts["grafted forward"]
    notes = role_notes([(r.role, r.spec.text, r.footprint) for r in roles], dtype)
    return Plan(kind="run", device=device, dtype=dtype, roles=held(shape, dtype, True), prompts={}, rows=len(rows),
                batch_size=batch_size, batch_size_fixed=True, batches=math.ceil(len(rows) / batch_size),
                memory=run_memory(shape, dtype, True, batch_size, where.held), budget_bytes=where.limit,
                budget_source=where.source, predicted_seconds=seconds, time_parts=parts, notes=notes)


def plan_attribution(pre: str, donor_bytes: int | None, lengths: list[int], dtype: str, batch_size: int, *,
                     device: str = "cpu", memory: str | None = None, with_time: bool = True,
                     donor_slots: set[str] | None = None) -> Plan:
    """The plan of graft attribution (gradient of every cell) over prompts of ``lengths``
    tokens, as ``localize`` runs it (no exact cells): ``pre`` whole, the donor holding
    ``donor_bytes`` (None: a whole model; ``donor_slots``: the slots a lean donor holds), the
    partial graft's deltas, one batch's forward + backward."""
    fp = parse_spec(pre).footprint()
    where = budget(device, memory)
    attr = attribution_bytes(fp, min(batch_size, len(lengths)), max(lengths), dtype)
    mem = {"process before loading": where.held,
           "parameters": param_bytes(fp, dtype) + (param_bytes(fp, dtype) if donor_bytes is None else donor_bytes),
           "graft deltas": delta_bytes(fp, dtype, donor_slots), "attribution batch": sum(attr.values())}
    seconds, parts = None, {}
    rate, _ = rate_for(device, dtype, None) if with_time else (None, None)
    if rate is not None:
        parts = {"attribution": attribution_seconds(fp, lengths, batch_size, rate)}
        seconds = parts["attribution"]
    roles = [RolePlan(model_set="rows", role="pre", spec=pre, config=fp.where, n_params=fp.n_params,
                      held_bytes=param_bytes(fp, dtype), holds="whole")]
    return Plan(kind="localize", device=device, dtype=dtype, roles=roles, prompts={}, rows=len(lengths),
                batch_size=batch_size, batch_size_fixed=True, batches=math.ceil(len(lengths) / batch_size), memory=mem,
                budget_bytes=where.limit, budget_source=where.source, predicted_seconds=seconds, time_parts=parts)

"""weightgraft: exact, fast dynamic weight grafting for HF decoder language models.

In a notebook::

    import weightgraft as wg
    pre, tok = wg.load("smollm2-135m")
    out = wg.graft({"pre": pre, "sft": sft}, tok, prompts, wg.Rule(model="sft", positions="last"))

Every name is imported on first use, so that light commands (``weightgraft data``) do not pay
for importing torch.
"""

from __future__ import annotations

from weightgraft.lazy import lazy_exports

__version__ = "0.1.0"

# public name -> (module, attribute); attribute None: the module itself
_EXPORTS: dict[str, tuple[str, str | None]] = {
    "load": ("weightgraft.api.load", "load"),
    "compare": ("weightgraft.api.compare", "compare"),
    "GraftOutput": ("weightgraft.api.graft", "GraftOutput"),
    "GraftInputError": ("weightgraft.schemes.errors", "GraftInputError"),
    "WeightgraftError": ("weightgraft.errors", "WeightgraftError"),
    "GraftArgumentError": ("weightgraft.errors", "GraftArgumentError"),
    "Rule": ("weightgraft.schemes.scheme", "Rule"),
    "Scheme": ("weightgraft.schemes.scheme", "Scheme"),
    "presets": ("weightgraft.api.presets", None),
    "slots": ("weightgraft.engine.forward", "slots"),
    "graft_forward": ("weightgraft.engine.forward", "graft_forward"),
    "generate": ("weightgraft.api.generate", "generate"),
    "localize": ("weightgraft.api.pipelines", "localize"),
    "graft": ("weightgraft.api.graft", "graft"),
    "explain": ("weightgraft.api.explain", "explain"),
    "grafted": ("weightgraft.api.grafted", "grafted"),
    "trained_facts": ("weightgraft.api.explain", "trained_facts"),
    "tokens": ("weightgraft.api.explain", "tokens"),
    "load_peft": ("weightgraft.models.peft_donor", "load_peft"),
}
__all__ = [
    "GraftArgumentError", "GraftInputError", "GraftOutput", "Rule", "Scheme", "compare", "explain", "generate", "graft", "graft_forward", "grafted",
    "load", "load_peft", "localize", "presets", "slots", "tokens", "trained_facts", "WeightgraftError",
]


__getattr__, __dir__ = lazy_exports("weightgraft", _EXPORTS, lambda: globals())

"""The ``weightgraft localize`` config: the dataset and model pair as in ``run``, and which
maps to compute."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from weightgraft.configfile import RunInputs
from weightgraft.engine.architectures import Units
from weightgraft.engine.metric_table import localize_metric
from weightgraft.errors import GraftArgumentError
from weightgraft.models.spec import ModelSpec, ModelSpecError, parse_spec

Direction = Literal["sufficiency", "necessity"]


def _metric_name(value: str) -> str:
    """One name per quantity: the legacy ``logprob`` is stored as ``first_logprob``; ``kl``
    (two signs) and names localize cannot measure in are refused."""
    try:
        return localize_metric(value).name
    except GraftArgumentError as e:
        raise ValueError(str(e)) from None


LocalizeMetric = Annotated[str, AfterValidator(_metric_name)]  # the one metric check of a localize config


class SearchSettings(BaseModel):
    """Minimal graft search: per template and direction, over the template's examples."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    target_share: float = Field(0.9, gt=0, le=1)
    max_cells: int = Field(1024, ge=1)
    rank_by: Literal["gradient", "ig"] = "gradient"
    # controls: random sets of the found set's size (uniform, and matched to its mix of
    # (position label, component)), each this many; 0 turns them off
    controls: int = Field(20, ge=0)
    # exact effects of this many cells sampled below the ranking's cut, stratified by rank (and
    # above it, where the set is larger): the estimate of what the ranking missed; 0 turns it off
    missed_sample: int = Field(64, ge=0)
    # the share of each template's prompts held out of the search (seeded split): the sets'
    # shares and controls are reported on them beside the fit prompts; 0 keeps every prompt in
    heldout: float = Field(0.5, ge=0, lt=1)
    refine: bool = True  # shrink the found set by exact marginal gain
    refine_rounds: int = Field(100, ge=1, description="at most this many exact marginal passes")

    @field_validator("controls")
    @classmethod
    def _enough_controls(cls, value: int) -> int:
        if 0 < value < 20:
            raise ValueError("controls must be 0 (off) or at least 20 (a 95th percentile of fewer sets says little)")
        return value


class ClaimSettings(BaseModel):
    """The paper's claims as exact region grafts against their null (``claims.csv``)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    # null sets per prompt and claim (random positions, other components; blocks and the
    # complement take every set there is): the paired test across prompts needs few
    null_draws: int = Field(20, ge=1)
    resamples: int = Field(9999, ge=99, description="sign flips and relabelings of the paired test (its least p: 1/(resamples+1))")
    prompts: int | None = Field(None, ge=2, description="at most this many prompts per template (every graft is exact)")
    # fewer prompts per map than this is refused before anything runs; lower it to run anyway,
    # and the rows say 'exploratory'
    min_prompts: int = Field(20, ge=2)
    # the claims' effect: the answer against the world's other answers (a donor that raises every
    # answer alike has none); the plain first_logprob effect is kept beside it in every row
    metric: LocalizeMetric = "fact_logprob"


class ReversalSetting(BaseModel):
    """Where the paper made claims 4-5 (Figure 4): a model finetuned on both directions grafted
    into the model finetuned on a2b, at the last token, on b2a prompts of the headline template."""

    model_config = ConfigDict(extra="forbid")

    donor: str  # finetuned on both directions (split: both)
    recipient: str  # finetuned on a2b only (split: a2b)
    # control donors: finetuned on both directions of *other* facts, grafted and judged the same
    # way; no claim may hold on them (rows ``reversal control[i]``)
    controls: list[str] = Field(default_factory=list)
    template: str = "paper_headline"
    direction: Literal["a2b", "b2a"] = "b2a"


def sft_labels(sft: str | list[str]) -> list[str]:
    """The role label of each SFT model: ``sft`` for a single spec, ``sft[0]``, ``sft[1]``, ...
    for a list (a list of one included), as ``cells.parquet``'s ``model`` column names them."""
    return ["sft"] if isinstance(sft, str) else [f"sft[{i}]" for i in range(len(sft))]


def null_labels(null: list[str]) -> list[str]:
    """The role label of each model of ``nulls``: ``null[0]``, ``null[1]``, ... (``cells.parquet``'s
    ``model`` column)."""
    return [f"null[{i}]" for i in range(len(null))]


def _spec_list(role: str, spec: object) -> list[str]:
    """A non-empty list of distinct, non-blank model specs, or a one-line ValueError."""
    if not isinstance(spec, list) or not spec or not all(isinstance(x, str) and x.strip() for x in spec):
        forms = "a non-empty list of model specs" if role == "nulls" else "a model spec or a non-empty list of model specs"
        raise ValueError(f"models.{role}: {forms}, got {spec!r}")
    twice = sorted({x for x in spec if spec.count(x) > 1})
    if twice:
        raise ValueError(f"models.{role} lists {twice[0]!r} more than once")
    return spec


CONTROL = "control"  # the role and label of the control finetune


class LocalizeConfig(RunInputs):
    """Cell maps of a model pair (``pre`` and ``sft``) on a dataset's test prompts; ``sft`` may
    list several models (training seeds), each mapped against the same ``pre``. ``nulls`` lists
    finetunes that do not hold the prompts' facts (another world seed, shuffled answers), mapped
    like the SFT models: what an unrelated finetune scores in ``stability.csv``."""

    what = "localize"

    name: str = "localize"
    # must name "pre" and "sft" (one spec or a list of them); "nulls": a list of null models;
    # "control": the control finetune (answers shuffled among the subjects)
    models: dict[str, str | list[str]]
    # a name of engine.metric_table.localize_metrics(): first_logprob (the first answer token),
    # logit_diff (minus the next example's first answer token: another relation of the
    # template), neg_kl_donor (-KL(donor || grafted)); higher is always the donor's side
    metric: LocalizeMetric = "first_logprob"
    graft_directions: list[Direction] = Field(default_factory=lambda: ["sufficiency", "necessity"], min_length=1)
    ig_steps: int = Field(0, ge=0, description="0: gradient only; k > 1: also integrated gradients")
    # false: no gradient estimates (partial grafts, which a model with a slot not affine in its
    # weights, a mixture of experts' router and bank, refuses): every cell's row with estimate NaN;
    # the claims (whole, exact grafts) and the exact maps run as with them
    estimates: bool = True
    # exact single-cell maps: "all" examples, "none", or the first N examples of each template
    exact: Literal["all", "none"] | int = "all"
    search: SearchSettings = Field(default_factory=SearchSettings)
    claims: ClaimSettings = Field(default_factory=ClaimSettings)
    reversal: ReversalSetting | None = None  # claims 4-5 in the paper's own setting
    # cell: whole slots; head: q/k/v/o split by attention head (under grouped-query attention a
    # k/v head is one shared key/value head, serving its group of q heads); neuron: gate/up/down
    # split by MLP neuron. Split slots' units are estimated, mapped exactly and searched as cells.
    units: Units = Units.CELL
    unit_rows: int = Field(20000, ge=1, description="unit rows kept per prompt and direction, by |estimate|")
    exact_units: int = Field(64, ge=0, description="exact unit cells per exact prompt: its top by |estimate|")
    batch_size: int = Field(16, ge=1)
    exact_chunk: int = Field(512, ge=1)
    dtype: Literal["float32", "float64"] = "float32"

    _specs: dict[str, ModelSpec] = PrivateAttr(default_factory=dict)

    @field_validator("models", mode="before")
    @classmethod
    def _pair(cls, value: object) -> object:
        if not isinstance(value, dict):
            return value
        missing = {"pre", "sft"} - set(value)
        if missing:
            raise ValueError(f"models must name 'pre' and 'sft' (missing {sorted(missing)})")
        for role, spec in value.items():
            if not isinstance(role, str):  # YAML reads a bare `null:` key as None
                raise ValueError(f"models: a role name must be a string, got {role!r} (null models go under 'nulls')")
            if role == "nulls":
                _spec_list(role, spec)
            elif role == "control" and not (isinstance(spec, str) and spec.strip()):
                raise ValueError(f"models.control: one model spec (the control finetune), got {spec!r}")
            elif role == "sft" and isinstance(spec, list):
                _spec_list(role, spec)
            elif not isinstance(spec, str) or not spec.strip():
                raise ValueError(f"models.{role}: one model spec (a string; only 'sft' and 'nulls' take a list), got {spec!r}")
        for role, spec in value.items():  # each spec parsed here, so a malformed one names its field
            for i, text in enumerate([spec] if isinstance(spec, str) else spec):
                try:
                    parse_spec(text)
                except ModelSpecError as exc:
                    raise type(exc)(f"models.{role}{'' if isinstance(spec, str) else f'.{i}'}: {exc}") from None
        sfts = [value["sft"]] if isinstance(value["sft"], str) else value["sft"]
        both = [x for x in value.get("nulls", []) if x in sfts]
        if both:
            raise ValueError(f"models.nulls lists {both[0]!r}, which models.sft lists too (a null is another finetune)")
        if value.get("control") in sfts:
            raise ValueError(f"models.control is {value['control']!r}, which models.sft lists too (the control is "
                             "another finetune: the same recipe and texts with the answers shuffled among the subjects)")
        return value

    def role_specs(self) -> dict[str, ModelSpec]:
        """:meth:`roles`, typed: parsed once (each text was checked when the config was validated),
        again only where the models were edited since."""
        roles = self.roles()
        if {r: s.text for r, s in self._specs.items()} != roles:
            self._specs = {role: parse_spec(text) for role, text in roles.items()}
        return dict(self._specs)

    def sft_models(self) -> list[tuple[str, str]]:
        """(role label, spec) of each SFT model, in the config's order."""
        sft = self.models["sft"]
        return list(zip(sft_labels(sft), [sft] if isinstance(sft, str) else sft))

    def null_models(self) -> list[tuple[str, str]]:
        """(role label, spec) of each null model, in the config's order (none without ``nulls``)."""
        null = self.models.get("nulls", [])
        return list(zip(null_labels(null), null))  # type: ignore[arg-type]

    def control_models(self) -> list[tuple[str, str]]:
        """``[("control", spec)]`` where ``models.control`` names the control finetune (the same
        recipe and texts, answers shuffled among the subjects: the format and the answer words,
        no fact); each fact claim of an SFT model must beat the same region grafted from it."""
        control = self.models.get("control")
        return [(CONTROL, control)] if isinstance(control, str) else []

    def mapped_models(self) -> list[tuple[str, str]]:
        """Every model mapped against ``pre``: the SFT models, the null models, the control."""
        return self.sft_models() + self.null_models() + self.control_models()

    def roles(self) -> dict[str, str]:
        """Every role by label (``pre``, ``sft`` or ``sft[i]``, ``null[i]``, other roles): one spec each."""
        flat = {role: spec for role, spec in self.models.items() if role not in ("sft", "nulls", CONTROL)}
        return {**flat, **dict(self.mapped_models())}

    @model_validator(mode="after")
    def _without_estimates(self) -> LocalizeConfig:
        """``estimates: false`` with what ranks or splits cells by their estimates: refused in one line."""
        if self.estimates:
            return self
        needs = [what for what, on in (
            ("search (it ranks cells by their estimates): set search: {enabled: false}", self.search.enabled),
            ("integrated gradients: set ig_steps: 0", self.ig_steps > 0),
            (f"units: {self.units} (unit cells are kept and mapped exactly by |estimate|): set units: cell",
             self.units != Units.CELL)) if on]
        if needs:
            raise ValueError("estimates: false takes no gradient estimates, which these need: " + "; ".join(needs))
        return self

    @field_validator("exact")
    @classmethod
    def _positive(cls, value: object) -> object:
        if isinstance(value, int) and value < 1:
            raise ValueError("exact must be 'all', 'none' or a positive number of examples per template")
        return value

    def identity(self, exclude: set[str] | None = None, late: Sequence[str] = ("tokenizer", "estimates"),
                 **replaced: Any) -> str:
        """Hash of what determines the results (not batch sizes, device, output place, nor
        ``exact``: exact maps are stored per example, so raising it extends a run; nor the claims'
        settings, whose results are stored under a digest of them; of the SFT models only the
        first, whose found sets the run searches, and no null model: appending SFT or null models
        extends a run, and the folder's claim refuses any other change of the lists). A run
        without estimates keeps ``estimates`` in its identity: its cells differ."""
        if exclude is not None:
            return super().identity(exclude, late, **replaced)
        models = {r: s for r, s in self.model_dump(mode="json")["models"].items() if r not in ("nulls", CONTROL)}
        return super().identity({"batch_size", "exact_chunk", "out", "report", "device", "exact", "claims", "reversal"},
                                late, models={**models, "sft": self.sft_models()[0][1]})


def parse_localize_config(raw: dict, source: str = "<dict>", base_dir: Path | None = None) -> LocalizeConfig:
    """Validate a raw dict; relative paths are taken from ``base_dir``."""
    return LocalizeConfig.parse(raw, source, base_dir)


def load_localize_config(path: Path, overrides: list[str] | None = None) -> LocalizeConfig:
    """Read, override and validate a localize YAML."""
    return LocalizeConfig.load(path, overrides)

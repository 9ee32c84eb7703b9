"""What a client of the explore app may send, checked before any model runs: a prompt (with a
length limit), named spans, rules or explicit cells, an answer, top-k. No field names a file:
unknown fields are refused, so a path can never reach the server's filesystem."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, field_validator

from weightgraft.errors import WeightgraftError
from weightgraft.schemes.protocol import DEFAULT_PROTOCOL, ProtocolName
from weightgraft.schemes.scheme import Rule


class RequestError(WeightgraftError, ValueError):
    """A request the app refuses; ``status`` is the HTTP status, the message one line."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Limits:
    """Bounds on what one request may ask for (a shared local server must stay responsive)."""

    max_body_bytes: int = 2 * 1024 * 1024
    max_prompt_chars: int = 2000
    max_tokens: int = 128
    max_k: int = 50
    max_answer_chars: int = 200
    body_timeout_s: float = 10.0
    max_drain_bytes: int = 64 * 1024 * 1024  # of a refused body, read and dropped so the client gets its 413, not a reset
    max_waiting: int = 4  # grafts queued behind the running one; more get a 503


class PromptRequest(BaseModel):
    """A prompt and its named spans (a substring that occurs once, or ``[start, end]``).
    Numbers are JSON integers: ``true`` is not 1 here."""

    model_config = ConfigDict(extra="forbid")

    prompt: str = Field(min_length=1)
    spans: dict[str, str | tuple[StrictInt, StrictInt]] | None = None

    @field_validator("spans")
    @classmethod
    def _span_names(cls, value: dict[str, str | tuple[int, int]] | None) -> dict[str, str | tuple[int, int]] | None:
        for name in value or {}:
            if not name.isidentifier():
                raise ValueError(f"span name {name!r} must be an identifier (letters, digits, _)")
        return value


class TokensRequest(PromptRequest):
    """``POST /api/tokens``; ``previous``: the token texts of the prompt before an edit, to
    carry painted cells over to the same tokens (``anchor``)."""

    previous: list[str] | None = None


class Cell(BaseModel):
    """One explicit assignment: slot ``slot`` at token ``position`` is served by role ``model``
    (or by a scaled role of the models as a map's ``roles`` name it, ``scaled(sft, 2)``:
    ``explore.cells.scaled_cells``). ``slot`` is a name of ``wg.slots``, or one head or neuron
    of it as localize names them (``layers.3.o/h2``, ``layers.3.up/n17``,
    ``layers.3.down/bias``: ``explore.cells``)."""

    model_config = ConfigDict(extra="forbid")

    position: StrictInt
    slot: str = Field(max_length=100)
    model: str = Field(max_length=100)


class RequestRule(Rule):
    """A request's rule: ``wg.Rule``'s fields, its ``scale`` a JSON number (``true`` or ``"2"``
    is not one) and finite (``NaN``, which Python's JSON reader takes, is refused by ``Rule``)."""

    scale: float = Field(default=1.0, strict=True, exclude_if=lambda v: v == 1.0)


class GraftRequest(PromptRequest):
    """``POST /api/graft``: ``rules`` (as ``wg.Rule`` fields, ``scale`` included) or explicit
    ``cells``; cells no rule or assignment claims come from ``base`` (default ``pre``)."""

    rules: list[RequestRule] | None = None
    cells: list[Cell] | None = None
    base: str | None = None
    answer: str | None = None
    k: StrictInt = Field(10, ge=1)
    protocol: ProtocolName = DEFAULT_PROTOCOL
    # which page sent it and its stroke number: a page's older strokes still waiting are dropped
    page: str | None = Field(None, min_length=1, max_length=64)
    seq: StrictInt | None = None


def parse(model: type[BaseModel], data: Any) -> Any:
    """Validate a decoded JSON body; the first problem as one line (field path: message)."""
    if not isinstance(data, dict):
        raise RequestError("the request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(x) for x in err["loc"]) or "body"
        msg = str(err["msg"]).replace("\n", " ").removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = f"unknown field (allowed: {', '.join(model.model_fields)})" if len(err["loc"]) == 1 else "unknown field"
        raise RequestError(f"{where}: {msg}") from None

"""What a grafted pass changes on the user's models for the length of one call, and the one place
that undoes it: module forwards swapped for grafted ones, a pre-hook that keeps only the rows
whose logits are asked for, hooks that read states (kept states, activations, explore's stop
checks), eval mode, eager attention for half-precision models. Everything :func:`swaps` installs is restored when its
block exits, however it exits (an error, a KeyboardInterrupt), so a model is never left grafted.

A swap replaces the module's *instance* ``forward``, which ``nn.Module.__call__`` calls: hooks
on the module (activation recording, accelerate's device placement) still run around it."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from weightgraft.engine.precision import switch_to_eager
from weightgraft.errors import GraftArgumentError

__all__ = ["Swaps", "swaps", "own_forward"]


def own_forward(module: nn.Module) -> Callable[..., Any]:
    """The forward ``module`` runs now, kept before it is swapped: an instance-level forward
    (accelerate's device hook wraps one in) or the class's, bound to the module."""
    own: Callable[..., Any] | None = module.__dict__.get("forward")
    if own is not None:
        return own
    bound: Callable[..., Any] = type(module).forward.__get__(module)
    return bound


def _keep_rows(positions: torch.Tensor) -> Callable[[nn.Module, tuple[Any, ...]], tuple[Any, ...]]:
    """Pre-hook for the unembedding: only the hidden states at ``positions`` ``[batch, k]``."""

    def hook(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        hidden = args[0]
        index = positions.to(hidden.device)[:, :, None].expand(-1, -1, hidden.shape[-1])
        return (hidden.gather(1, index), *args[1:])

    return hook


class Swaps:
    """The changes made inside one :func:`swaps` block, undone last-first on exit."""

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []

    def forward(self, module: nn.Module, forward: Callable[..., Any]) -> None:
        """``module`` runs ``forward`` until the block exits (a module swapped twice gets its
        first forward back)."""
        self.method(module, "forward", forward)

    def method(self, module: nn.Module, name: str, fn: Callable[..., Any]) -> None:
        """``module.<name>`` is ``fn`` until the block exits (``generate`` in ``wg.grafted``);
        the instance attribute it had, or none, comes back."""
        self.attribute(module, name, fn)

    def attribute(self, module: nn.Module, name: str, value: object) -> None:
        """``module.<name>`` is ``value`` until the block exits (an attention module's config that
        names the attention sinks' function: ``weightgraft.engine.attention``); the instance
        attribute it had, or none, comes back."""
        had = module.__dict__.get(name)

        def restore() -> None:
            if had is None:
                module.__dict__.pop(name, None)  # back to the class's method
            else:
                setattr(module, name, had)

        setattr(module, name, value)
        self._undo.append(restore)

    def logit_rows(self, unembedding: nn.Module, positions: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
        """The unembedding sees only the rows at ``positions`` ``[batch, k]`` of a ``[batch,
        seq]`` input (usually the largest matrix: it then runs on k rows per sequence instead
        of all of them); returns the positions, checked, as long integers."""
        batch, seq = shape
        positions = positions.long()
        if positions.dim() != 2 or positions.shape[0] != batch:
            raise GraftArgumentError("logit_positions must be [batch, k] position indices")
        if positions.numel() and (int(positions.min()) < 0 or int(positions.max()) >= seq):
            raise GraftArgumentError(f"logit_positions must lie in 0..{seq - 1}")
        self._undo.append(unembedding.register_forward_pre_hook(_keep_rows(positions)).remove)
        return positions

    def hook(self, module: nn.Module, fn: Callable[..., Any], *, pre: bool = False, with_kwargs: bool = False) -> None:
        """A forward hook (``pre``: a forward pre-hook) on ``module`` until the block exits."""
        register = module.register_forward_pre_hook if pre else module.register_forward_hook
        self._undo.append(register(fn, with_kwargs=with_kwargs).remove)

    def eval_mode(self, models: Iterable[nn.Module]) -> None:
        """No dropout; models already in eval mode are left untouched."""
        for model in models:
            if any(m.training for m in model.modules()):
                mode = model.training
                model.eval()

                def restore(model: nn.Module = model, mode: bool = mode) -> None:
                    model.train(mode)

                self._undo.append(restore)

    def eager_attention(self, models: Iterable[nn.Module]) -> None:
        """Half-precision models run HF's eager attention, so that a row's numbers do not
        depend on its batch (``weightgraft.engine.precision``); float models are left alone."""
        self._undo.append(switch_to_eager(models))

    def undo(self) -> None:
        while self._undo:
            self._undo.pop()()


@contextmanager
def swaps() -> Iterator[Swaps]:
    """A block in which forwards may be swapped, rows kept and models put in eval mode; all of
    it is undone on exit, including what was installed before an error cut the setup short."""
    made = Swaps()
    try:
        yield made
    finally:
        made.undo()

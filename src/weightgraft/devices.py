"""Whether a device a run names is here: one check for ``run``, ``localize``, ``paper`` and
``train``, said in one line before any model loads (each command raises it as its own error)."""

from __future__ import annotations

__all__ = ["device_problem", "require_device"]


def device_problem(device: str) -> str | None:
    """What is wrong with ``device`` on this machine, or None: ``cpu``; ``cuda`` / ``cuda:N``
    with that card visible to this torch; ``mps`` where it is available."""
    import torch

    if device == "cpu":
        return None
    if device == "cuda" or device.startswith("cuda:"):
        index = device.partition(":")[2]
        if index and not index.isdigit():
            return f"{device!r}: write cuda or cuda:N"
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n == 0:
            why = "this torch build has no CUDA support" if torch.version.cuda is None else "no CUDA GPU is visible"
            return f"{device!r} is absent: {why} (use cpu)"
        if index and int(index) >= n:
            return f"{device!r} is absent: {n} CUDA device(s) visible here"
        return None
    if device == "mps":
        return None if torch.backends.mps.is_available() else "'mps' is absent on this machine"
    return f"{device!r}: use cpu, cuda, cuda:N or mps"


def require_device(device: str, error: type[Exception], flag: str) -> None:
    """The one device check: ``device`` that is not here raises ``error`` (the command's own
    class) with ``flag`` (``device=``, ``--device ``) before what is wrong."""
    problem = device_problem(device)
    if problem is not None:
        raise error(f"{flag}{problem}")

"""``load_quantized``'s ``device_map`` argument, checked against the devices this machine has
before anything is read (a ``"cuda"`` map on a machine without CUDA is refused up front, not by
a pinned-memory error from deep inside the reader).

Accepted: ``None`` (CPU), a device string (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"``, ...), a
``torch.device``, a CUDA index ``int``, accelerate's strategy names (:data:`STRATEGIES`), or an
accelerate device map ``{module name: device}``. The meta device is refused: a model on meta has
no weights.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import DeviceError

#: accelerate / transformers ``device_map`` strategies: place modules over the available devices.
STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")
#: Values an accelerate device map may give besides devices: offload to CPU RAM or to disk.
OFFLOAD_TARGETS = ("cpu", "disk")


@dataclass(frozen=True)
class Placement:
    """Where the loaded model goes: read straight onto ``device``, or (``dispatch``) read on CPU and
    dispatched by accelerate with ``strategy`` or the explicit ``device_map`` dict."""

    device: torch.device
    dispatch: bool = False
    strategy: str | None = None
    device_map: dict | None = None


def check_device(dev, where: str) -> torch.device:
    """``dev`` as a ``torch.device`` this machine has; :class:`DeviceError` naming ``where`` otherwise."""
    if isinstance(dev, bool) or not isinstance(dev, (str, int, torch.device)):
        raise DeviceError(f"{where}: expected a device (e.g. 'cpu', 'cuda:0', 0), got {dev!r:.100}")
    try:
        d = torch.device(dev) if not isinstance(dev, int) else torch.device("cuda", dev)
    except (RuntimeError, ValueError, TypeError) as e:
        raise DeviceError(f"{where}: expected a device (e.g. 'cpu', 'cuda:0'), got {dev!r:.100} ({e})") from e
    if d.type == "meta":
        raise DeviceError(f"{where}: expected a device with memory, got {dev!r} (a model on the meta device has no weights)")
    if d.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch build has no CUDA" if torch.version.cuda is None else "no CUDA device is visible"
            raise DeviceError(f"{where}: expected an available device, got {dev!r} but CUDA is not available ({why}); "
                              "use device_map='cpu'")
        if d.index is not None and d.index >= torch.cuda.device_count():
            raise DeviceError(f"{where}: expected a CUDA index below {torch.cuda.device_count()}, got {dev!r}")
    elif d.type != "cpu":
        try:
            torch.empty(0, device=d)
        except Exception as e:  # the backend is absent from this build or has no device
            raise DeviceError(f"{where}: expected an available device, got {dev!r} ({type(e).__name__}: {e})") from e
    return d


def resolve_device_map(device_map) -> Placement:
    """The :class:`Placement` of ``device_map`` (see the module docstring); :class:`DeviceError`
    naming ``device_map`` for an unknown or unavailable device."""
    if device_map is None:
        return Placement(torch.device("cpu"))
    if isinstance(device_map, str) and device_map in STRATEGIES:
        return Placement(torch.device("cpu"), dispatch=True, strategy=device_map)
    if isinstance(device_map, dict):
        if not device_map:
            raise DeviceError("device_map: expected a non-empty {module name: device} dict, got {}")
        for name, dev in device_map.items():
            if not isinstance(name, str):
                raise DeviceError(f"device_map: expected module names (strings) as keys, got {name!r:.100}")
            if not (isinstance(dev, str) and dev in OFFLOAD_TARGETS):
                check_device(dev, f"device_map[{name!r}]")
        return Placement(torch.device("cpu"), dispatch=True, device_map=dict(device_map))
    if isinstance(device_map, str) and ":" not in device_map and device_map not in ("cpu", "cuda", "mps", "xpu", "meta", "hpu", "npu", "mtia"):
        raise DeviceError(f"device_map: expected a device ('cpu', 'cuda:0', ...), one of {list(STRATEGIES)}, "
                          f"or a {{module name: device}} dict, got {device_map!r:.100}")
    return Placement(check_device(device_map, "device_map"))

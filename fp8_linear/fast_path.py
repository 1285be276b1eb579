"""FP8Linear's decode fast path on the sm90 backend: activation quantization and GEMM in one host call.

At decode sizes (M = a few tokens) a Linear layer's time is the host's: the generic path walks
validation, ``make_problem``, the backend dispatcher, the registered torch op and Triton's Python
launcher (about 180-210 us per call on the H200 host, benchmarks/NOTES.md). When a module's GEMMs
would go to the sm90 backend anyway, :func:`forward` instead calls the extension's ``linear_fwd``
(``kernels/csrc/binding.cpp``): a CUDA quantization kernel (``kernels/csrc/act_quant.cu``, the
formula of ``kernels/quant_triton.py`` bit for bit) and the same ``fp8sm90::gemm`` call with the same
config, so outputs are meant to be bitwise those of the generic path (what
tests/core/test_gpu_fast_path.py checks on an sm_90 device).

Taken only in eager mode (``torch.compile`` traces the registered op), on CUDA, for static
per-tensor and dynamic per-token activations with per-tensor / per-channel weight scales. The
eligibility is decided once per module, device and switch setting and kept on the module as a plain
attribute (:data:`STATE_ATTR`, not a buffer); the kernel config and split-K factor are kept per M and input dtype.

Switches (read on every call, so a change takes effect at once):
``FP8_LINEAR_FAST_PATH=0`` turns this path off; ``FP8_LINEAR_BACKEND`` other than ``sm90`` and
``FP8_LINEAR_FUSED_QUANT=0`` turn it off too (the generic path then runs as it would without it);
``FP8_LINEAR_SM90_CONFIG`` forces the kernel config as on the generic path.
"""

from __future__ import annotations

import importlib
import logging
import os

import torch

from .backends import BACKEND_ENV, get_backend
from .formats import FP8_DTYPES, MIN_SCALE, fmt_max
from .gemm import make_problem

logger = logging.getLogger("fp8_linear")

#: Switch: ``0`` turns the fast path off (the generic dispatch path runs).
ENV_FAST_PATH = "FP8_LINEAR_FAST_PATH"
#: Name of the plain attribute that caches a module's :class:`FastPathState`.
STATE_ATTR = "_fp8_fast_path"
#: Bias dtypes the sm90 epilogue adds as they are (others are converted by the generic path).
BIAS_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
#: Quantization modes of the extension (the values of kernels/quant_triton.py MODE_STATIC / MODE_TOKEN).
MODE_STATIC, MODE_TOKEN = 0, 1
#: Kernel config choices kept per module (one per distinct M and input dtype); cleared when full.
MAX_CACHED_M = 256
#: Parameters the fast path reads (None-valued entries included) straight from ``_parameters``.
_PARAMS = ("weight", "weight_scale", "input_scale", "bias")

# Reader of the switches (set up on first CUDA use: two names are defined in fp8_linear.kernels).
_read_switches = None
_ext = None


class FastPathState:
    """A module's fast-path decision for one device and switch setting (plain data).

    ``key``: ``(device, switch values)`` it was decided for; ``ok`` / ``reason``: the decision;
    ``mode``: :data:`MODE_STATIC` or :data:`MODE_TOKEN`; ``fmt_max``: the FP8 format's maximum;
    ``configs``: (kernel config id, split-K factor) per (M, x's dtype), filled on use.
    """

    __slots__ = ("key", "ok", "reason", "mode", "fmt_max", "configs")

    def __init__(self, key, ok: bool, reason: str, mode: int = -1, fmax: float = 0.0):
        self.key, self.ok, self.reason, self.mode, self.fmt_max = key, ok, reason, mode, fmax
        self.configs: dict[int, tuple[int, int]] = {}

    def __reduce__(self):
        # A copy (deepcopy, pickle) starts undecided: the extension handle is per process.
        return (FastPathState, (None, False, "copied, not yet decided"))


def _kernels():
    from .backends.sm90 import kernels_module

    return kernels_module()


def _switch_names() -> tuple[str, ...]:
    """Ours, the backend override, the fused-quantization switch, the kernel-config and split-K overrides."""
    kern = _kernels()
    quant = importlib.import_module(kern.__name__ + ".quant_triton")
    return ENV_FAST_PATH, BACKEND_ENV, quant.ENV_DISABLE, kern.configs.ENV_CONFIG, kern.configs.ENV_SPLITS


def _switch_reader(names: tuple[str, ...]):
    """A function that returns the raw values of the environment variables ``names`` (None if unset).

    It reads CPython's dict behind ``os.environ`` (``os.environ._data``, keys encoded once) when there
    is one: ``os.environ.get`` costs about 1.5 us per unset name (a KeyError inside), which is most of
    the per-call budget of the fast path at decode; the dict sees every change made through
    ``os.environ`` (assignment, ``monkeypatch.setenv``), as ``os.environ.get`` does. Values are bytes
    there (decode with :func:`_text`).
    """
    env = os.environ
    data, enc = getattr(env, "_data", None), getattr(env, "encodekey", None)
    if isinstance(data, dict) and callable(enc):
        get = data.get
        a, b, c, d, e = (enc(n) for n in names)
        return lambda: (get(a), get(b), get(c), get(d), get(e))
    a, b, c, d, e = names
    get = env.get
    return lambda: (get(a), get(b), get(c), get(d), get(e))


def _text(v) -> str | None:
    return v.decode(errors="replace") if isinstance(v, bytes) else v


def _switches() -> tuple:
    """The current raw values of the switches (None where unset), read on every call."""
    global _read_switches
    if _read_switches is None:
        _read_switches = _switch_reader(_switch_names())
    return _read_switches()


def _module_reason(mod) -> tuple[int, str | None]:
    """``(mode, None)`` when ``mod``'s tensors and scheme suit the fast path, else ``(-1, why not)``."""
    missing = [nm for nm in _PARAMS if nm not in mod._parameters]
    if missing:
        return -1, f"{', '.join(missing)} not registered as parameters (forward reads them from _parameters)"
    # Shapes, K % 16, alignment and scale kinds are the sm90 backend's own can_run question (asked in
    # decide); here only what linear_fwd takes as it is, where the generic path would convert.
    w = mod.weight
    if w.dtype not in FP8_DTYPES:
        return -1, f"weight dtype {w.dtype} is not FP8"
    n = w.shape[0]
    ws = mod.weight_scale
    if ws.dtype != torch.float32 or not ws.is_contiguous():
        return -1, f"weight_scale {ws.dtype} {list(ws.shape)} is not a contiguous fp32 tensor"
    b = mod.bias
    if b is not None and (b.dtype not in BIAS_DTYPES or not b.is_contiguous() or b.numel() != n):
        return -1, f"bias {b.dtype} {list(b.shape)} is not a contiguous fp32/bf16/fp16 [{n}]"
    s = mod.input_scale
    if s is not None:
        if s.dtype != torch.float32 or s.numel() != 1 or not s.is_contiguous():
            return -1, f"input_scale {s.dtype} {list(s.shape)} is not a contiguous fp32 [1]"
        return MODE_STATIC, None
    if mod.scheme.activation_granularity == "token":
        return MODE_TOKEN, None
    return -1, f"activation granularity {mod.scheme.activation_granularity!r} (only static per-tensor or per-token)"


def _probe_problem(mod, device: torch.device):
    """A one-row GEMM problem with ``mod``'s weight, scales and bias: what the generic path would hand
    the dispatcher (sm90's ``can_run`` does not depend on M)."""
    w = mod.weight
    q = torch.empty((1, w.shape[1]), dtype=w.dtype, device=device)
    sa = mod.input_scale if mod.input_scale is not None else torch.ones((1, 1), device=device)
    return make_problem(q, w, sa, mod.weight_scale, mod.bias, torch.bfloat16, check_values=False)


def decide(mod, device: torch.device, switches: tuple | None = None) -> FastPathState:
    """Whether ``mod`` (an FP8Linear) takes the fast path on ``device`` under the current switches.

    Checks, in order: the switches, the module's scheme and tensors, then the device (CUDA, the sm90
    backend's ``supports``), the sm90 backend's ``can_run`` on the layer's problem (the generic path's
    rules) and the extension (built here on first use, as the generic path would).
    """
    sw = switches if switches is not None else _switches()
    key = (device, sw)
    fast, backend, fused = (_text(v) for v in sw[:3])
    if fast == "0":
        return FastPathState(key, False, f"turned off ({ENV_FAST_PATH}=0)")
    if backend and backend.strip() and backend.strip() != "sm90":
        return FastPathState(key, False, f"{BACKEND_ENV}={backend.strip()}")
    if fused == "0":
        return FastPathState(key, False, f"fused activation quantization turned off ({_switch_names()[2]}=0)")
    mode, why = _module_reason(mod)
    if why is not None:
        return FastPathState(key, False, why)
    device = torch.device(device)
    if device.type != "cuda":
        return FastPathState(key, False, f"needs a CUDA device, got {device.type}")
    sm90 = get_backend("sm90")
    ok, why = sm90.supports(device)
    if not ok:
        return FastPathState(key, False, f"sm90 backend unavailable: {why}")
    ok, why = sm90.can_run(_probe_problem(mod, device))
    if not ok:
        return FastPathState(key, False, f"sm90 cannot run this layer: {why}")
    global _ext
    try:
        ext = importlib.import_module(_kernels().__name__ + ".jit").load()
    except Exception as e:  # the generic path reports the build error itself
        return FastPathState(key, False, f"extension not loadable: {e}")
    if not hasattr(ext, "linear_fwd"):
        return FastPathState(key, False, "extension has no linear_fwd")
    _ext = ext
    logger.info("fp8_linear: FP8Linear fast path on %s (%s activations)", device, "static" if mode == MODE_STATIC else "per-token")
    return FastPathState(key, True, "sm90 fast path", mode, fmt_max(mod.weight.dtype))


def state(mod, device: torch.device) -> FastPathState:
    """``mod``'s cached decision for ``device`` and the current switches (decided again when either changed)."""
    sw = _switches()
    st = mod.__dict__.get(STATE_ATTR)
    if st is None or st.key != (device, sw):
        st = decide(mod, device, sw)
        mod.__dict__[STATE_ATTR] = st  # plain attribute, bypassing nn.Module.__setattr__
    return st


def forward(mod, x: torch.Tensor) -> "torch.Tensor | None":
    """``mod``'s output ``[..., N]`` for CUDA ``x`` ``[..., K]`` through ``linear_fwd``, or ``None`` when
    the generic path must run (not eligible, an empty ``x``, or a last dim that is not contiguous).

    ``x``'s type, dtype, last dim and device are already validated by ``FP8Linear.forward``; the
    extension flattens ``x`` to ``[M, K]`` as ``x.reshape(-1, K)`` does and returns the output in
    ``x``'s leading shape.
    """
    st = state(mod, x.device)
    if not st.ok:
        return None
    numel = x.numel()
    if numel == 0 or x.stride(-1) != 1:
        return None
    p = mod._parameters  # dict lookups: nn.Module.__getattr__ costs ~1 us per parameter at decode
    w = p["weight"]
    n, k = w.shape
    m = numel // k
    key = (m, x.dtype)  # the output's dtype (x's) takes part in the choice (select_config's swap_ok)
    choice = st.configs.get(key)
    if choice is None:
        if len(st.configs) >= MAX_CACHED_M:  # many distinct prompt lengths: keep the cache bounded
            st.configs.clear()
        kern = _kernels()
        # what the generic path's kernels.swap_ok finds on the same launch (static per-tensor
        # activations: input_scale [1]; per-token: [M, 1], one element only at M = 1, where a swapped
        # decode config is taken either way)
        ok = st.mode == MODE_STATIC and x.dtype in (torch.bfloat16, torch.float16)
        config = kern.select_config(m, n, k, swap_ok=ok)
        choice = st.configs[key] = (config.id, kern.select_splits(config, m, n, k))
    return _ext.linear_fwd(x, w, p["input_scale"], p["weight_scale"], p["bias"], st.mode, choice[0], st.fmt_max,
                           MIN_SCALE, choice[1])


def forget(mod) -> None:
    """Drop ``mod``'s cached decision (its tensors moved or were replaced)."""
    mod.__dict__.pop(STATE_ATTR, None)

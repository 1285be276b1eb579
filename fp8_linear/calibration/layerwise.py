"""Layer-by-layer calibration: one decoder layer on the accelerator at a time.

A model larger than the GPU's memory calibrates on one GPU the way llm-compressor's sequential
pipeline does it:

1. everything of the base model outside the decoder stack (embeddings, rotary embedding, final norm)
   moves to ``device`` for a moment: one forward per batch stops at the first decoder layer (a pre-hook
   captures its hidden states and keyword arguments: attention mask, position embeddings, ...), then
   they move back;
2. for each decoder layer in turn: the layer moves to ``device``, every batch's hidden states run
   through it with observer hooks on its Linear targets (the same :class:`~.hooks.ObserverHooks` as the
   all-at-once path) and on its fused MoE experts modules, if any (the same
   :class:`~.experts.ExpertsHooks`: per-expert token counts and maxima), its outputs become the next
   layer's inputs, ``on_layer`` runs (e.g. GPTQ and the swap to ``FP8Linear`` / ``FP8Experts``, on
   ``device``), and the layer moves back.

The activations carried between layers are those of the *unquantized* layers (outputs are kept before
``on_layer`` runs), so the observers and ``H`` are exactly those of the all-at-once path: on one device
the two give the same scales (tests/calibration/test_layerwise.py). Hidden states live on ``device``, or on
the CPU with ``offload_activations`` (``tokens x hidden x 2`` bytes in bf16: each batch's output replaces
its input).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn

from fp8_linear.errors import CalibrationError

from .data import Batch
from .hooks import ObserverHooks
from .observers import ActivationObserver

if TYPE_CHECKING:
    from .experts import ExpertsObserver


class _Captured(Exception):
    """Raised by the capture hook on the first decoder layer to end the forward there."""


def decoder_layers(base: nn.Module, targets: dict[str, nn.Module]) -> tuple[str, nn.ModuleList]:
    """``(qualified name, ModuleList)`` of the decoder stack: the ``nn.ModuleList`` of ``base`` whose
    layers hold the most of ``targets`` (``model.layers`` for Llama, Qwen, Mistral, ...).

    Raises ``ValueError`` when no ModuleList holds a target."""
    best, best_n = None, 0
    for name, mod in base.named_modules():
        if isinstance(mod, nn.ModuleList) and len(mod) > 0:
            prefix = name + "." if name else ""
            n = sum(any(t is m for m in mod.modules()) for t in targets.values())
            if n > best_n:
                best, best_n = (name, mod), n
    if best is None:
        raise ValueError(f"model: expected a ModuleList of decoder layers holding the Linear targets, "
                         f"found none in {type(base).__name__}")
    return best


def _layer_targets(layers: nn.ModuleList, targets: dict[str, nn.Module]) -> list[dict[str, nn.Module]]:
    """Targets of each layer (by the model-level name), in layer order; raises for targets outside."""
    owner = {id(m): i for i, layer in enumerate(layers) for m in layer.modules()}
    per = [dict() for _ in layers]
    outside = [n for n, m in targets.items() if id(m) not in owner]
    if outside:
        raise ValueError(f"layerwise calibration: Linear targets outside the decoder layers are not supported, "
                         f"got {outside[:3]} (ignore them, or calibrate all at once)")
    for n, m in targets.items():
        per[owner[id(m)]][n] = m
    return per


def _move_outside(base: nn.Module, layers: nn.ModuleList, device) -> list[tuple[nn.Module, torch.device]]:
    """Move every direct parameter/buffer holder of ``base`` outside ``layers`` to ``device``; returns
    what moved with its old device (to move back)."""
    inside = {id(m) for m in layers.modules()}
    moved = []
    for mod in base.modules():
        if id(mod) in inside:
            continue
        tensors = list(mod.parameters(recurse=False)) + list(mod.buffers(recurse=False))
        if tensors and tensors[0].device != torch.device(device):
            moved.append((mod, tensors[0].device))
            _move_outside_one(mod, device)
    return moved


def _to(x, device):
    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, tuple):
        return tuple(_to(v, device) for v in x)
    if isinstance(x, list):
        return [_to(v, device) for v in x]
    if isinstance(x, dict):
        return {k: _to(v, device) for k, v in x.items()}
    return x


def capture_layer_inputs(base: nn.Module, layers: nn.ModuleList, batches: list[Batch], device, store
                         ) -> list[tuple[torch.Tensor, dict]]:
    """``(hidden_states, kwargs)`` that ``layers[0]`` receives for each batch (hidden states on
    ``store``, keyword tensors on ``device``). The decoder layers themselves are never run here."""
    captured: list = []

    def hook(_mod, args, kwargs):
        hidden = args[0] if args else kwargs.pop("hidden_states")
        kw = {k: v for k, v in kwargs.items() if k != "hidden_states"}
        captured.append((hidden.to(store), kw))
        raise _Captured

    handle = layers[0].register_forward_pre_hook(hook, with_kwargs=True)
    try:
        for b in batches:
            try:
                base(input_ids=b.input_ids.to(device), attention_mask=b.attention_mask.to(device), use_cache=False)
            except _Captured:
                continue
            raise CalibrationError("layerwise calibration: the forward never reached the first decoder layer")
    finally:
        handle.remove()
    return captured


def calibrate_layerwise(
    base: nn.Module,
    targets: dict[str, nn.Module],
    batches: list[Batch],
    *,
    device: "torch.device | str",
    observers: dict[str, ActivationObserver],
    hessian: bool = False,
    hessian_tokens: int | None = None,
    offload_activations: bool = False,
    on_layer: Callable[[int, dict[str, nn.Module]], None] | None = None,
    progress: bool = True,
    experts: "dict[str, ExpertsObserver] | None" = None,
) -> dict:
    """Observe every target's input with one decoder layer at a time on ``device``.

    Args:
        base: the module whose forward takes ``input_ids``/``attention_mask`` and runs the decoder
            stack (the transformers base model, e.g. ``LlamaModel``); stays on its device except for
            the layer being calibrated and the small modules outside the stack.
        targets: Linear modules to observe (model-level names; all inside the decoder layers).
        batches: calibration batches.
        device: where each layer runs (e.g. ``"cuda"``).
        observers: one (empty) observer per target name; filled in place.
        hessian / hessian_tokens: accumulate GPTQ's ``H`` per distinct layer input, on ``device``.
        offload_activations: keep the hidden states between layers on the CPU instead of ``device``.
        on_layer: ``on_layer(i, layer_targets)``, called while layer ``i`` is on ``device`` after its
            statistics are complete and its outputs are kept (quantize it here); ``layer_targets`` holds
            the layer's Linear targets and its experts modules (names of ``experts``). Targets it swaps
            out of the layer are moved back with it (they would otherwise keep their weights on ``device``).
        progress: a tqdm bar over the layers (peak accelerator memory in its postfix).
        experts: fused MoE experts modules to observe too: one (empty)
            :class:`~fp8_linear.calibration.experts.ExpertsObserver` per module name (its ``module`` is
            the experts module, inside the decoder layers); filled in place.

    Returns:
        ``{"layers": n, "peak_gpu_bytes": int | None, "layer_seconds": [float] * n}`` (wall time of each
        layer; the first includes capturing the first layer's inputs).
    """
    from tqdm.auto import tqdm

    device = torch.device(device)
    store = torch.device("cpu") if offload_activations else device
    experts = experts or {}
    observed = {**targets, **{n: ob.module for n, ob in experts.items()}}
    _, layers = decoder_layers(base, observed)
    per_layer = _layer_targets(layers, observed)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    was_training = base.training
    base.eval()
    masks = [None if bool(b.attention_mask.bool().all()) else b.attention_mask.reshape(-1).bool().to(device) for b in batches]
    bar = tqdm(total=len(layers), desc="calibrating layers", unit="layer", disable=not progress)
    seconds: list[float] = []  # wall time of each layer (the first includes the capture)
    t0 = time.perf_counter()
    # Only the forwards run under inference_mode. Moves and ``on_layer`` (which builds the FP8Linear
    # layers) run outside it, under no_grad: a parameter made under inference_mode has no version
    # counter, and once a later move outside it writes a new tensor into it (``param.data = ...``,
    # what ``.to("cuda")`` does), every view of it raises "Inference tensors do not track version counter".
    try:
        with torch.no_grad():
            moved = _move_outside(base, layers, device)  # embeddings etc.: on the device for the capture only
            try:
                with torch.inference_mode():
                    states = capture_layer_inputs(base, layers, batches, device, store)
            finally:
                for mod, dev in moved:
                    _move_outside_one(mod, dev)
            for i, layer in enumerate(layers):
                home = next(layer.parameters()).device
                layer.to(device)
                hooks = _layer_hooks(per_layer[i], observers, experts, hessian, hessian_tokens)
                try:
                    with torch.inference_mode():
                        for j, ((hidden, kw), mask) in enumerate(zip(states, masks)):
                            # each batch's input is replaced by its output: one set of hidden states alive
                            states[j] = _run_layer(layer, hidden, kw, mask, hooks, device, store)
                finally:
                    for h in hooks:
                        h.remove()
                if on_layer is not None and per_layer[i]:
                    on_layer(i, per_layer[i])
                layer.to(home)
                for mod in per_layer[i].values():  # targets on_layer swapped out of the layer go home too
                    mod.to(home)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                    bar.set_postfix(peak_gib=f"{torch.cuda.max_memory_allocated(device) / 2**30:.2f}")
                seconds.append(round(time.perf_counter() - t0, 3))
                t0 = time.perf_counter()
                bar.update(1)
    finally:
        bar.close()
        base.train(was_training)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return {"layers": len(layers), "peak_gpu_bytes": peak, "layer_seconds": seconds}


def _layer_hooks(layer_targets: dict[str, nn.Module], observers: dict[str, ActivationObserver], experts: dict,
                 hessian: bool, hessian_tokens: int | None) -> list:
    """The observer hooks of one layer: Linear inputs (:class:`ObserverHooks`) and, when the layer has
    fused experts modules, their routed tokens (:class:`~fp8_linear.calibration.experts.ExpertsHooks`)."""
    linears = {n: m for n, m in layer_targets.items() if n not in experts}
    hooks = [ObserverHooks(observers, hessian, hessian_tokens).attach(linears)]
    moe = {n: m for n, m in layer_targets.items() if n in experts}
    if moe:
        from .experts import ExpertsHooks  # imports the MoE modules only for models that have them

        hooks.append(ExpertsHooks(experts).attach(moe))
    return hooks


def _run_layer(layer: nn.Module, hidden: torch.Tensor, kw: dict, mask, hooks: list, device, store):
    """One batch through one decoder layer with the observer hooks on; ``(output on store, kw)``."""
    for h in hooks:
        h.begin_batch(mask)
    out = layer(hidden.to(device), **kw)
    out = out[0] if isinstance(out, tuple) else out
    return out.to(store), kw


def _move_outside_one(mod: nn.Module, device) -> None:
    """Move ``mod``'s own parameters (in place: tied weights follow) and buffers to ``device``."""
    for p in mod.parameters(recurse=False):
        p.data = p.data.to(device)
    for name, buf in mod.named_buffers(recurse=False):
        setattr(mod, name, buf.to(device))

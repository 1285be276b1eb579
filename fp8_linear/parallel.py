"""Tensor parallelism for ``FP8Linear`` over ``torch.distributed`` (docs/design.md section 4).

The standard Megatron split of a decoder layer, on FP8 tensors that were quantized once on the full
weight (so every rank holds exactly the bytes a single device would):

* **column-parallel** (``q/k/v``, ``gate/up``): each rank keeps a slice of the weight's rows (output
  features). Per-tensor ``weight_scale`` and ``input_scale`` are replicated, per-channel scales
  (``[out, 1]``) and 128x128 block scales are sliced with the rows, the bias is sliced. The input
  is replicated, so dynamic per-token and 1x128 activation scales are computed on the full row, as on
  one device. The output stays sharded along its last dimension (``gather_output=False``), which is
  what the following row-parallel layer takes.
* **row-parallel** (``o``, ``down``): each rank keeps a slice of the weight's columns (input
  features, K). Per-tensor and per-channel weight scales are replicated; block scales are sliced
  along K, which needs the slice to start on a 128 boundary. A static ``input_scale`` is replicated.
  A dynamic per-token scale is reduced across ranks (``all_reduce(MAX)`` of the row's amax) before
  the shard is quantized, so every rank uses the scale of the full row; 1x128 groups lie inside one
  rank's slice (128-aligned boundaries) and need no reduction. The partial products are computed in
  FP32, summed with one ``all_reduce``, the bias is added once after the sum, then cast.

:func:`tensor_parallelize` applies this to a Llama-style model (``q_proj``, ``k_proj``, ``v_proj``,
``gate_proj``, ``up_proj`` column-parallel; ``o_proj``, ``down_proj`` row-parallel). Attention heads
are split with the projections (transformers infers the local head count from the projected width),
so the number of query and key/value heads must both divide by the world size.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from .errors import ShapeError
from .formats import GROUP_SIZE, scale_from_amax
from .gemm import fp8_gemm
from .module import FP8Linear
from .quantize import compute_amax, quantize_fp8

#: Projection names split column-wise (output features) and row-wise (input features).
COLUMN_PARALLEL = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
ROW_PARALLEL = ("o_proj", "down_proj")
#: Side of a weight block and of an activation group (docs/design.md section 2).
BLOCK = GROUP_SIZE


def _rank_world(group) -> tuple[int, int]:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("tensor parallelism needs torch.distributed initialized (dist.init_process_group)")
    return dist.get_rank(group), dist.get_world_size(group)


def shard_range(size: int, rank: int, world: int, name: str) -> tuple[int, int]:
    """The ``[start, stop)`` slice of a dimension of ``size`` that ``rank`` of ``world`` keeps (equal parts)."""
    if size % world:
        raise ShapeError(f"{name}: {size} does not divide evenly over {world} ranks")
    part = size // world
    return rank * part, (rank + 1) * part


def check_block_split(size: int, world: int, name: str) -> None:
    """Raise unless equal shards of ``size`` keep 128-wide blocks whole: each shard a multiple of 128,
    or (for a row split of block scales) 128 a multiple of the shard, so that every shard lies inside
    one block. The same answer on every rank, so no rank is left waiting in a collective."""
    part = size // world
    if world > 1 and part % BLOCK and BLOCK % part:
        raise ShapeError(
            f"{name}: shards of {part} would cut 128-wide scale blocks; block and 1x128 group scales "
            "need shards that are a multiple of 128 (or divide 128)")


def _block_rows(scale: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """Rows of a block-scale tensor that cover ``[start, stop)`` of the blocked dimension (dim 0)."""
    return scale[start // BLOCK:(stop - 1) // BLOCK + 1]


def _local_layer(src: FP8Linear, out_features: int, in_features: int, tensors: dict, bias: bool) -> FP8Linear:
    """A new ``FP8Linear`` of the local shape holding ``tensors`` (validated by ``load_state_dict``)."""
    dev = src.weight.device
    bias_dtype = src.bias.dtype if src.bias is not None else torch.float32
    layer = FP8Linear(in_features, out_features, bias=bias, scheme=src.scheme, device=dev, bias_dtype=bias_dtype)
    layer.load_state_dict({k: v.contiguous() for k, v in tensors.items()}, strict=True)
    return layer


class ColumnParallelFP8Linear(nn.Module):
    """Rows ``[start, stop)`` of an ``FP8Linear``'s weight on this rank.

    Input: the full activation ``[..., in_features]`` (replicated). Output: ``[..., out_features / world]``,
    or ``[..., out_features]`` with ``gather_output=True`` (an ``all_gather``).
    """

    def __init__(self, layer: FP8Linear, group=None, gather_output: bool = False):
        super().__init__()
        if not isinstance(layer, FP8Linear):
            raise TypeError(f"layer: expected FP8Linear, got {type(layer).__name__}")
        self.group, self.gather_output = group, gather_output
        rank, world = _rank_world(group)
        self.world = world
        start, stop = shard_range(layer.out_features, rank, world, "out_features")
        gran = layer.scheme.weight_granularity
        ws = layer.weight_scale.detach()
        if gran == "channel":
            ws = ws[start:stop]
        elif gran == "block":
            check_block_split(layer.out_features, world, "out_features")
            ws = _block_rows(ws, start, stop)
        tensors = {"weight": layer.weight.detach()[start:stop], "weight_scale": ws}
        if layer.input_scale is not None:
            tensors["input_scale"] = layer.input_scale.detach()
        if layer.bias is not None:
            tensors["bias"] = layer.bias.detach()[start:stop]
        self.local = _local_layer(layer, stop - start, layer.in_features, tensors, layer.bias is not None)
        self.in_features, self.out_features = layer.in_features, layer.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.local(x)
        if not self.gather_output or self.world == 1:
            return y
        parts = [torch.empty_like(y) for _ in range(self.world)]
        dist.all_gather(parts, y.contiguous(), group=self.group)
        return torch.cat(parts, dim=-1)


class RowParallelFP8Linear(nn.Module):
    """Columns ``[start, stop)`` (a K slice) of an ``FP8Linear``'s weight on this rank.

    Input: ``[..., in_features / world]`` (the sharded output of a column-parallel layer), or the
    full ``[..., in_features]`` with ``input_is_parallel=False`` (the rank takes its slice).
    Output: ``[..., out_features]`` on every rank, in the input's dtype.
    """

    def __init__(self, layer: FP8Linear, group=None, input_is_parallel: bool = True):
        super().__init__()
        if not isinstance(layer, FP8Linear):
            raise TypeError(f"layer: expected FP8Linear, got {type(layer).__name__}")
        self.group, self.input_is_parallel = group, input_is_parallel
        rank, world = _rank_world(group)
        self.world = world
        start, stop = shard_range(layer.in_features, rank, world, "in_features")
        self.start, self.stop = start, stop
        scheme = layer.scheme
        if (scheme.weight_granularity == "block" or scheme.activation_granularity == "group") and world > 1 \
                and (stop - start) % BLOCK:
            raise ShapeError(
                f"in_features: K shards of {stop - start} are not multiples of 128, which {scheme.name} "
                "(block weights / 1x128 activation groups) needs")
        ws = layer.weight_scale.detach()
        if scheme.weight_granularity == "block":
            ws = _block_rows(ws.t(), start, stop).t()
        tensors = {"weight": layer.weight.detach()[:, start:stop], "weight_scale": ws}
        if layer.input_scale is not None:
            tensors["input_scale"] = layer.input_scale.detach()
        self.local = _local_layer(layer, layer.out_features, stop - start, tensors, bias=False)
        self.bias = None if layer.bias is None else nn.Parameter(layer.bias.detach().clone(), requires_grad=False)
        self.in_features, self.out_features = layer.in_features, layer.out_features

    def _quantize_input(self, x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The local ``[tokens, K / world]`` shard quantized with the scale the full row would get."""
        loc = self.local
        fmt, gran = loc.weight.dtype, loc.scheme.activation_granularity
        if loc.input_scale is not None:
            return quantize_fp8(x2, fmt, "tensor", scale=loc.input_scale)
        if gran == "token":
            amax = compute_amax(x2.float(), "token")
            if self.world > 1:
                dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=self.group)
            return quantize_fp8(x2, fmt, "token", scale=scale_from_amax(amax, fmt))
        return quantize_fp8(x2, fmt, gran)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_parallel:
            x = x[..., self.start:self.stop]
        if x.shape[-1] != self.stop - self.start:
            raise ShapeError(f"x: expected last dimension {self.stop - self.start} (this rank's K shard), got {x.shape[-1]}")
        lead = x.shape[:-1]
        x2 = x.reshape(-1, x.shape[-1])
        q, sa = self._quantize_input(x2)
        y = fp8_gemm(q, self.local.weight, sa, self.local.weight_scale, None, torch.float32)
        if self.world > 1:
            dist.all_reduce(y, op=dist.ReduceOp.SUM, group=self.group)
        if self.bias is not None:
            y = y + self.bias.float()
        return y.to(x.dtype).reshape(*lead, self.out_features)


class _ShardedLinear(nn.Module):
    """A plain (unquantized) ``nn.Linear`` split the same way, for projections kept in BF16."""

    def __init__(self, linear: nn.Linear, style: str, group=None):
        super().__init__()
        rank, world = _rank_world(group)
        self.style, self.group, self.world = style, group, world
        w = linear.weight.detach()
        if style == "column":
            s, e = shard_range(linear.out_features, rank, world, "out_features")
            self.weight = nn.Parameter(w[s:e].clone(), requires_grad=False)
            self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach()[s:e].clone(), requires_grad=False)
        else:
            s, e = shard_range(linear.in_features, rank, world, "in_features")
            self.weight = nn.Parameter(w[:, s:e].clone(), requires_grad=False)
            self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(), requires_grad=False)

    def forward(self, x):
        if self.style == "column":
            return nn.functional.linear(x, self.weight, self.bias)
        y = nn.functional.linear(x, self.weight).float()
        if self.world > 1:
            dist.all_reduce(y, op=dist.ReduceOp.SUM, group=self.group)
        if self.bias is not None:
            y = y + self.bias.float()
        return y.to(x.dtype)


def parallelize_linear(layer: nn.Module, style: str, group=None) -> nn.Module:
    """The tensor-parallel replacement of one layer: ``style`` is ``"column"`` or ``"row"``."""
    if style not in ("column", "row"):
        raise ValueError(f"style: expected 'column' or 'row', got {style!r}")
    if isinstance(layer, FP8Linear):
        return ColumnParallelFP8Linear(layer, group) if style == "column" else RowParallelFP8Linear(layer, group)
    if isinstance(layer, nn.Linear):
        return _ShardedLinear(layer, style, group)
    raise TypeError(f"layer: expected FP8Linear or nn.Linear, got {type(layer).__name__}")


def tensor_parallelize(model: nn.Module, group=None) -> nn.Module:
    """Split a Llama-style model's attention and MLP projections over the ranks of ``group``, in place.

    Every rank must hold the same full model (the same FP8 bytes and scales) before the call; each then
    keeps its shards. Returns ``model``. Raises ``ShapeError`` when the head counts or widths do not
    divide by the world size, naming the module.
    """
    _, world = _rank_world(group)
    cfg = getattr(model, "config", None)
    if cfg is not None:
        heads = getattr(cfg, "num_attention_heads", None)
        kv = getattr(cfg, "num_key_value_heads", heads)
        for nm, v in (("num_attention_heads", heads), ("num_key_value_heads", kv)):
            if v is not None and v % world:
                raise ShapeError(f"config.{nm}={v} does not divide over {world} ranks")
    targets = []
    for name, mod in model.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in COLUMN_PARALLEL or leaf in ROW_PARALLEL:
            targets.append((name, mod, "column" if leaf in COLUMN_PARALLEL else "row"))
    if not targets:
        raise ValueError("model: found no q/k/v/o/gate/up/down projections to split")
    for name, mod, style in targets:
        parent_name, _, leaf = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        try:
            setattr(parent, leaf, parallelize_linear(mod, style, group))
        except ShapeError as e:
            raise ShapeError(f"{name}: {e}") from None
    return model

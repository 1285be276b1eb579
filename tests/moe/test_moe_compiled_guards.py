"""What the FP8 experts cost dynamo's guards in the compiled static-cache decode step of the tiny Qwen3-MoE (CPU,
emulated backend), against BF16's experts (docs/moe.md, "Compiled decode guards").

With ``torch._dynamo.config.use_recursive_dict_tags_for_guards`` (torch 2.11's default) dynamo skips the guards of a
module whose dicts have not changed since the last call, where the module's whole guard subtree is "tag safe": no
Python object read through it but plain values, dicts, tensors and types. The FP8 experts forward reads plain
bool / string attributes and its tensors, so:

- every FP8 experts module is tag safe, and the FP8 model has no module that is not tag safe where BF16's has
  one (BF16's experts of the first layer are not: they read the model's shared ``config``);
- no guard of an experts subtree walks its class's MRO: the original's ``_apply_gate`` is bound in the FP8
  subclass itself (``fp8_linear.moe.experts.fp8_experts_class``), so the method lookup adds no guard per layer;
- per experts module the guards beside its tensors' are no more than BF16's experts module has, its tensor
  guards those of its 4 FP8 tensors (dynamic activations), and no attribute store is replayed beyond BF16's.
"""

from __future__ import annotations

import pytest
import torch

from benchmarks.common.dynamo_counts import decode_step_inputs, time_calls
from tiny_moe import TINY_QWEN3_MOE, tiny_qwen3_moe

PATHS = ("bf16", "fp8-dynamic", "fp8-dynamic+fused")
#: How a guard source names an experts module, and the decoder layers' module list.
EXPERTS, LAYERS = "._modules['experts']", "._modules['layers']._modules["
#: The attributes the FP8 experts forward reads (fp8_linear/moe/experts.py, ``project`` / ``fp8_experts_forward``).
READ_ATTRS = {"activation_mode", "weight_granularity", "fp8_bias", "is_concatenated", "has_gate", "first_projection",
              "has_post_expert_norm"}
CACHE_LEN = 32


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _children(m) -> list:
    out = list(m.get_child_managers())
    if hasattr(m, "get_key_value_managers"):  # a dict's managers hang off its key / value pairs
        for pair in m.get_key_value_managers().values():
            out += [k for k in (pair if isinstance(pair, tuple) else (pair,)) if k is not None]
    return out


def _managers(root) -> list:
    todo, out = [root], []
    while todo:
        m = todo.pop()
        out.append(m)
        todo += _children(m)
    return out


def _compiled_tree(path: str):
    """``(root guard manager, stores replayed a call)`` of the tiny model's compiled decode step on ``path``."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    from fp8_linear import fuse_projections, quantize_model

    model = tiny_qwen3_moe(dtype=torch.bfloat16)
    if path != "bf16":
        model = quantize_model(model, None, path.removesuffix("+fused"), progress=False, gptq=False)
        if path.endswith("+fused"):
            fuse_projections(model)
    out = {}

    def run_once(gm, example_inputs):  # the graph runs once; a steady call is dynamo's own work
        res = gm(*example_inputs)
        return lambda *args: res

    with torch._dynamo.config.patch(use_recursive_dict_tags_for_guards=True):
        torch._dynamo.reset()
        step = torch.compile(model.forward, backend=run_once, fullgraph=True)
        kw = decode_step_inputs(model.config, CACHE_LEN)
        with torch.inference_mode():
            step(**kw)
            step(**kw)  # the static cache's first call recompiles once, as in generate
            _, out["stores"] = time_calls(step, kw, 1)
    entries = _debug_get_cache_entry_list(model.forward.__func__.__code__)
    return entries[0].guard_manager.root, out["stores"]


@pytest.fixture(scope="module")
def trees():
    return {p: _compiled_tree(p) for p in PATHS}


def _experts(root) -> dict:
    """``{layer index: experts guard manager}``."""
    return {m.get_source().split(LAYERS)[1][1:].split("'")[0]: m for m in _managers(root)
            if m.get_source().endswith(EXPERTS)}


def _unsafe_modules(root) -> set[str]:
    return {m.get_source() for m in _managers(root)
            if issubclass(m.get_type_of_guarded_value(), torch.nn.Module) and not m.is_tag_safe()}


def _guards(manager) -> tuple[int, int]:
    """``(tensors guarded, leaf guards on anything but a tensor)`` of a manager's subtree."""
    tensors = other = 0
    for m in _managers(manager):
        if issubclass(m.get_type_of_guarded_value(), torch.Tensor):
            tensors += 1
        else:
            other += len(m.get_leaf_guards())
    return tensors, other


@pytest.mark.parametrize("path", PATHS[1:])
def test_fp8_experts_are_dict_tag_safe(trees, path):
    root, _ = trees[path]
    experts = _experts(root)
    assert len(experts) == TINY_QWEN3_MOE["num_hidden_layers"]
    if not hasattr(root, "is_tag_safe"):
        pytest.skip("this torch has no dict-tag safety on its guard managers")
    unsafe = [(i, m.get_source()) for i, m in experts.items() if not m.is_tag_safe()]
    assert not unsafe, unsafe
    # the FP8 model makes no module unsafe that BF16's has safe (its own first experts module is not)
    extra = _unsafe_modules(root) - _unsafe_modules(trees["bf16"][0])
    assert not extra, sorted(extra)[:3]
    assert any(EXPERTS in s for s in _unsafe_modules(trees["bf16"][0])), "BF16's experts read the shared config"


@pytest.mark.parametrize("path", PATHS[1:])
def test_fp8_experts_guards_no_class_lookup_and_no_more_than_bf16(trees, path):
    root, stores = trees[path]
    bf16_root, bf16_stores = trees["bf16"]
    bf16 = _experts(bf16_root)
    for i, m in _experts(root).items():
        mro = [x.get_source() for x in _managers(m) if "__mro__" in x.get_source()]
        assert not mro, mro[:2]  # the gate method is the class's own: no guard that FP8Experts lacks it
        attrs = {x.get_source().rsplit(".", 1)[1] for x in _children(m) if x.get_source().startswith(m.get_source() + ".")}
        attrs -= {"__dict__"}
        assert attrs <= READ_ATTRS | {"_parameters", "_modules"}, attrs - READ_ATTRS
        (tensors, other), (bf16_tensors, bf16_other) = _guards(m), _guards(bf16[i])
        assert other <= bf16_other, (i, other, bf16_other)
        assert (tensors, bf16_tensors) == (4, 2), i  # 2 FP8 weights and their scales against 2 weights
    if not path.endswith("+fused"):  # a fused group may add its one store (tests/core/test_compiled_guards.py)
        assert stores == bf16_stores


def test_fp8_subclass_binds_the_original_gate():
    """The gate the FP8 forward calls is the original class's own function (same numerics), found on the
    FP8 subclass itself; a class without a gate method gets none."""
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    from fp8_linear.moe.experts import fp8_experts_class

    klass = fp8_experts_class(Qwen3MoeExperts)
    assert klass.__dict__["_apply_gate"] is Qwen3MoeExperts._apply_gate

    class NoGate(torch.nn.Module):
        pass

    assert "_apply_gate" not in fp8_experts_class(NoGate).__dict__

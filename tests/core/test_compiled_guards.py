"""What a compiled decode step checks per call because of our modules (docs/serving-investigations.md,
"Locating the batch-64 idle").

dynamo guards every Python value a traced forward reads; a guard evaluated in Python (an aliasing check:
one object reached by two paths) or an attribute store replayed after the graph costs host time on every
call of the compiled model. On a tiny Llama's compiled static-cache decode step (CPU, the emulated
backend; ``benchmarks.compiled_call_overhead`` measures the same):

- FP8 layers (plain and fused groups) add no Python guard per decoder layer: the growth per layer equals
  BF16's, and no Python guard mentions a plan or a group; neither adds a replayed store (a fused group's
  round lives in ``fp8_linear.fusion._ROUNDS``, a dict emptied again by the end of each forward, not in an
  attribute that torch 2.13 would replay);
- each FP8Linear a forward runs costs one guard on its plan: its key, an int in the module's own
  ``__dict__`` (``fp8_linear.module.set_plan``), so that with dynamo's recursive dict-tag guards the layer
  and every module above it are skipped while unchanged; the plan's fields are guarded once per spec;
- a deep copy of a fused model registers its own groups (new keys), its members view its own fused
  buffers, and its compiled forward runs them: bitwise its own eager output, not the original's;
- with dynamo's recursive dict-tag guards (torch 2.11's default, the GPU's) a steady call checks as many
  guards per decoder layer with q/k/v and gate/up fused as BF16 and unfused FP8 do: everything a fused
  group's traced forward reads is reached from the module tree (tag safe), the rounds of every group are
  one global dict guarded once per model.
"""

from __future__ import annotations

import copy

import pytest
import torch

from benchmarks.compiled_call_overhead import (compiled_step, count_guards, guard_conditions, steady_entry,
                                               tag_checked_guards, time_calls)
from fp8_linear.fusion import fusion_groups

#: FP8 modules a decoder layer runs per forward: 7 linears, or with q/k/v and gate/up fused 2 groups + o + down.
RUN_PER_LAYER = {"fp8-tensor": 7, "fp8-channel+fused": 4, "fp8-dynamic+fused": 4}


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _entry_facts(path: str, layers: int) -> dict:
    torch._dynamo.reset()
    model, step, kw, _ = compiled_step(path, layers)
    with torch.inference_mode():
        _, stores = time_calls(step, kw, 1)
    entry = steady_entry(model)
    conds = guard_conditions(entry.guard_manager)
    return dict(lambdas=count_guards(entry.guard_manager)[1], stores=stores, conds=conds)


@pytest.fixture(scope="module")
def facts():
    return {(p, n): _entry_facts(p, n) for p in ("bf16", *RUN_PER_LAYER) for n in (1, 2)}


@pytest.mark.parametrize("path", list(RUN_PER_LAYER))
def test_fp8_layers_add_no_python_guard_per_layer(facts, path):
    bf16 = facts["bf16", 2]["lambdas"] - facts["bf16", 1]["lambdas"]
    ours = facts[path, 2]["lambdas"] - facts[path, 1]["lambdas"]
    assert ours == bf16, f"{path}: {ours} Python guards per decoder layer, BF16 {bf16}"
    stores = [facts[path, n]["stores"] - facts["bf16", n]["stores"] for n in (1, 2)]
    assert stores == [0, 0], f"{path}: {stores} stores beyond BF16's"
    python = [c for lam, c in facts[path, 2]["conds"]
              if lam and ("_plan" in c or "_fusion" in c or "GROUPS" in c or "ROUNDS" in c)]
    assert not python, python[:3]


@pytest.mark.parametrize("path", list(RUN_PER_LAYER))
def test_each_fp8_layer_guards_one_int_of_its_own(facts, path):
    for layers in (1, 2):
        per_layer = [c for lam, c in facts[path, layers]["conds"] if "._plan" in c]
        assert len(per_layer) == RUN_PER_LAYER[path] * layers, per_layer
        # the plan key, an int in the module's __dict__: no guard on a Python object of the layer
        assert all(c.endswith(f"._plan_key == {c.rsplit(' ', 1)[-1]}") for c in per_layer), per_layer
        # the shared plans' fields: once per spec, not per layer
        shared = [c for _, c in facts[path, layers]["conds"] if "SHARED_PLANS[" in c and ".spec.n ==" in c]
        assert 1 <= len(shared) <= RUN_PER_LAYER[path]


def test_compiled_copy_of_a_fused_model_runs_its_own_groups():
    model, _, kw, _ = compiled_step("fp8-tensor+fused", 2)
    dup = copy.deepcopy(model)
    groups, dup_groups = fusion_groups(model), fusion_groups(dup)
    assert {g.key for g in groups}.isdisjoint(g.key for g in dup_groups)
    for g in dup_groups:  # the copy's members view its own fused buffer (one copy of the weights, not two)
        assert all(m._fusion_slot[0] == g.key and m._fusion is g for m in g.members)
        ptr = g.fused.weight.untyped_storage().data_ptr()
        assert all(m.weight.untyped_storage().data_ptr() == ptr for m in g.members)
    with torch.no_grad():  # other weights in the copy's fused buffers (through the members' views)
        for g in dup_groups:
            for m in g.members:
                m.weight.copy_(m.weight.float().flip(1).to(m.weight.dtype))
    ids = torch.randint(0, model.config.vocab_size, (1, 5))
    with torch.inference_mode():
        eager, dup_eager = model(ids).logits, dup(ids).logits
        assert not torch.equal(eager, dup_eager)
        torch._dynamo.reset()
        for m, want in ((dup, dup_eager), (model, eager)):
            compiled = torch.compile(m.forward, backend="eager", fullgraph=True)
            assert torch.equal(compiled(ids).logits, want)
    assert all(g._state is None for g in groups + dup_groups)


@pytest.mark.parametrize("path", ["fp8-tensor", "fp8-dynamic+fused"])
def test_fp8_layers_are_dict_tag_safe(path):
    """With ``torch._dynamo.config.use_recursive_dict_tags_for_guards`` dynamo skips the guards of a module
    whose dicts have not changed since the last call ("tag safe"): every FP8 layer of the model qualifies, as
    every ``nn.Linear`` does (a Python object read by the forward, such as a plan, would not)."""
    with torch._dynamo.config.patch(use_recursive_dict_tags_for_guards=True):
        model, step, kw, _ = compiled_step(path, 2)
        with torch.inference_mode():
            time_calls(step, kw, 1)
    tree = str(steady_entry(model).guard_manager)
    if "tag_safe=" not in tree:
        pytest.skip("this torch prints no dict-tag safety in its guard tree")
    # the model's own modules and the fused groups (the per-spec shared plans and the rounds' dict are global
    # sources, guarded once, not per decoder layer)
    layer_types = ("type=<class 'fp8_linear.module.FP8Linear'>", "type=<class 'fp8_linear.fusion.FusedFP8Linear'>",
                   "type=<class 'fp8_linear.fusion.SiblingGroup'>")
    ours = [line for line in tree.splitlines()
            if "GuardManager: source=L[" in line and any(t in line for t in layer_types)]
    assert ours, "no guard manager of an FP8 layer in the tree"
    unsafe = [line.strip()[:200] for line in ours if "tag_safe=(False" in line]
    assert not unsafe, unsafe[:3]


@pytest.fixture(scope="module")
def tagged():
    """Per ``(path, decoder layers)``: the guards a steady call checks with dict-tag guards on, the leaf guards
    and the conditions of the compiled decode step's cache entry."""
    out = {}
    with torch._dynamo.config.patch(use_recursive_dict_tags_for_guards=True):
        for path in ("bf16", "fp8-tensor", "fp8-channel+fused", "fp8-dynamic+fused"):
            for layers in (1, 2):
                torch._dynamo.reset()
                model, step, kw, _ = compiled_step(path, layers)
                with torch.inference_mode():
                    _, stores = time_calls(step, kw, 1)
                entry = steady_entry(model)
                out[path, layers] = dict(checked=tag_checked_guards(entry.guard_manager), stores=stores,
                                         tree=str(entry.guard_manager), conds=guard_conditions(entry.guard_manager))
    torch._dynamo.reset()
    return out


@pytest.mark.parametrize("path", ["fp8-channel+fused", "fp8-dynamic+fused"])
def test_fused_groups_add_no_checked_guard_per_layer(tagged, path):
    """Per decoder layer (the second one: the first is checked in full on every path, transformers' class-level
    guards hang under it) a steady call checks the fused model's guards no more than BF16's or unfused FP8's:
    the two groups of a layer are reached from the module tree (the lead member's ``_fusion``, an ``nn.Module``
    in its ``__dict__``), not from a global registry (before: 6 checked guards a group, 12 a layer); the
    rounds add two guards for the whole model (``_ROUNDS``' type, that it is empty) and no store."""
    if "tag_safe=" not in tagged["bf16", 2]["tree"]:
        pytest.skip("this torch prints no dict-tag safety in its guard tree")
    per_layer = {p: tagged[p, 2]["checked"] - tagged[p, 1]["checked"] for p in ("bf16", "fp8-tensor", path)}
    assert per_layer[path] <= per_layer["fp8-tensor"] and per_layer[path] <= per_layer["bf16"], per_layer
    for layers in (1, 2):
        conds = [c for _, c in tagged[path, layers]["conds"]]
        assert not [c for c in conds if "_GROUPS" in c], "a group reached from the registry"
        # of fp8_linear.fusion's globals, beside the identity of what it calls (a class, a function's code):
        # the rounds' dict only
        globals_ = [c for c in conds if "G['__import_fp8_linear_dot_fusion']." in c and "___check_obj_id(" not in c]
        assert all("._ROUNDS" in c for c in globals_) and len(globals_) <= 2, globals_
        assert tagged[path, layers]["stores"] == tagged["bf16", layers]["stores"]

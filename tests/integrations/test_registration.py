"""``import fp8_linear`` registers ``quant_method: "fp8_linear"`` with transformers (config and quantizer),
whichever of the two is imported first, and not before; each case in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = """
import json, sys
from transformers.quantizers import auto
def seen():
    return ["fp8_linear" in auto.AUTO_QUANTIZATION_CONFIG_MAPPING, "fp8_linear" in auto.AUTO_QUANTIZER_MAPPING]
"""


def _run(body: str) -> dict:
    out = subprocess.run([sys.executable, "-c", body], capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_registered_after_import_not_before_transformers_first():
    res = _run(PROBE + """
before = seen()
import fp8_linear
after = seen()
print(json.dumps({"before": before, "after": after,
                  "cls": auto.AUTO_QUANTIZATION_CONFIG_MAPPING["fp8_linear"].__name__,
                  "quantizer": auto.AUTO_QUANTIZER_MAPPING["fp8_linear"].__name__}))
""")
    assert res == {"before": [False, False], "after": [True, True], "cls": "FP8LinearConfig",
                   "quantizer": "FP8LinearHfQuantizer"}


def test_registered_when_fp8_linear_is_imported_first():
    """``import fp8_linear`` does not import transformers' registry itself (seconds of import time);
    the registry holds ``fp8_linear`` as soon as it is imported."""
    res = _run("""
import json, sys
import fp8_linear
lazy = "transformers.quantizers.auto" not in sys.modules
from transformers.quantizers import auto
print(json.dumps({"lazy": lazy, "after": ["fp8_linear" in auto.AUTO_QUANTIZATION_CONFIG_MAPPING,
                                          "fp8_linear" in auto.AUTO_QUANTIZER_MAPPING]}))
""")
    assert res == {"lazy": True, "after": [True, True]}


def test_plain_transformers_does_not_know_fp8_linear():
    res = _run(PROBE + """
from transformers.quantizers.auto import AutoQuantizationConfig
try:
    AutoQuantizationConfig.from_dict({"quant_method": "fp8_linear"})
    err = None
except ValueError as e:
    err = str(e)
print(json.dumps({"seen": seen(), "fp8_linear_imported": "fp8_linear" in sys.modules, "err": err}))
""")
    assert res["seen"] == [False, False] and not res["fp8_linear_imported"]
    assert "fp8_linear" in res["err"]


def test_registry_builds_our_config_from_a_dict():
    pytest.importorskip("transformers")
    import fp8_linear
    from transformers.quantizers.auto import AutoHfQuantizer, AutoQuantizationConfig

    cfg = AutoQuantizationConfig.from_dict({"quant_method": "fp8_linear", "scheme": "fp8-block", "ignore": ["lm_head"]})
    assert isinstance(cfg, fp8_linear.FP8LinearConfig) and cfg.quant_scheme == fp8_linear.PRESETS["fp8-block"]
    quantizer = AutoHfQuantizer.from_config(cfg, pre_quantized=False)
    assert type(quantizer).__name__ == "FP8LinearHfQuantizer"


def test_registering_twice_is_harmless():
    from fp8_linear.integrations import register_with_transformers
    from transformers.quantizers import auto

    register_with_transformers()
    register_with_transformers()
    assert auto.AUTO_QUANTIZER_MAPPING["fp8_linear"].__name__ == "FP8LinearHfQuantizer"


def test_registered_when_our_quantizer_module_imports_transformers_first():
    """The registry's first import may come from inside ``fp8_linear.integrations.transformers_quantizer``."""
    res = _run("""
import json, sys
import transformers, fp8_linear
from fp8_linear.integrations import transformers_quantizer
from transformers.quantizers import auto
print(json.dumps({"after": ["fp8_linear" in auto.AUTO_QUANTIZATION_CONFIG_MAPPING,
                            "fp8_linear" in auto.AUTO_QUANTIZER_MAPPING]}))
""")
    assert res == {"after": [True, True]}

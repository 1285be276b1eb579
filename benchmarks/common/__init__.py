"""What the benchmarks share: shape sets (:mod:`.shapes`), timing (:mod:`.timing`), operand and scale
builders (:mod:`.operands`), the calls into our kernel (:mod:`.ours`) and the JSON writer (:mod:`.results`);
for the end-to-end benchmarks, models from a config (:mod:`.random_model`), the FP8 swap
(:mod:`.fp8_swap`), ``generate`` timing (:mod:`.generate_clock`), the greedy-token comparison
(:mod:`.greedy_compare`), device timing (:mod:`.cuda_clock`), weight bytes (:mod:`.weight_memory`) and
the run's time budget (:mod:`.budget`); for the calibration benchmarks, evaluation windows and the
unquantized reference (:mod:`.eval_windows`) and a kept log (:mod:`.log`). No module here imports an entry point (tests/benchmarks/test_layout.py)."""

"""What the benchmarks share: shape sets (:mod:`.shapes`), timing (:mod:`.timing`), operand and scale
builders (:mod:`.operands`), the calls into our kernel (:mod:`.ours`) and the JSON writer (:mod:`.results`)."""

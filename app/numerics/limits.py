"""What each floating dtype can hold, and the headroom a value leaves below its largest
finite number.  No TensorFlow here."""
from __future__ import annotations

import math
from typing import Optional

# The largest finite value of each dtype (float16: 65504; bfloat16 keeps float32's exponent).
LARGEST = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38,
           "float32": 3.4028234663852886e38, "float64": 1.7976931348623157e308}
# The smallest positive value each 16-bit dtype holds (float16's smallest subnormal): a
# constant below it, an epsilon of 1e-12 say, is 0 once cast.
SMALLEST = {"float16": 5.960464477539063e-08, "bfloat16": 9.183549615799121e-41,
            "float32": 1.401298464324817e-45}
# The smallest normal value of each 16-bit dtype: under it float16 keeps fewer bits, down to
# its smallest subnormal above.
SMALLEST_NORMAL = {"float16": 6.103515625e-05, "bfloat16": 1.1754943508222875e-38,
                   "float32": 1.1754943508222875e-38}
# Under this many bits of headroom (within 4x of the limit) the sentinel warns, once a layer.
WARN_BITS = 2.0


def largest(dtype: str) -> float:
    return LARGEST.get(dtype, LARGEST["float32"])


def headroom_bits(max_abs: Optional[float], dtype: str) -> Optional[float]:
    """log2(the dtype's largest finite value / ``max_abs``): how many doublings the value can
    still take.  0 or less: at or past the limit (inf has none: -inf); None for no value."""
    if max_abs is None or (isinstance(max_abs, float) and math.isnan(max_abs)):
        return None
    if math.isinf(max_abs):
        return -math.inf
    if max_abs <= 0.0:
        return math.inf
    return math.log2(largest(dtype) / max_abs)


def underflows(value: float, dtype: str) -> bool:
    """A positive constant that becomes 0 in ``dtype``."""
    return 0.0 < value < SMALLEST.get(dtype, 0.0) / 2.0

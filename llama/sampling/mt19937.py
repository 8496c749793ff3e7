"""`std::mt19937` and libstdc++'s `uniform_real_distribution<double>(0, 1)` on top of it.

llama.cpp's dist sampler keeps a `std::mt19937` seeded with the 32-bit seed and draws one
`std::uniform_real_distribution<double>(0.0, 1.0)` number per pick. To make the same picks:

* the generator: numpy's MT19937 bit generator runs the same Mersenne Twister; we load it
  with the state `std::mt19937(seed)` starts from (Matsumoto-Nishimura `init_genrand`,
  computed here, then `pos = 624` so the first draw regenerates the block, as the C++ does);
  `np.random.MT19937(seed)` itself would seed through SeedSequence, which is different.
* the double: libstdc++'s `generate_canonical<double, 53>` takes two 32-bit draws,
  `(lo + hi * 2^32) / 2^64` evaluated in double, and clamps a result of 1.0 to the largest
  double below 1. libc++ (macOS) and MSVC build the double differently, so picks match a
  Linux/GCC build of llama.cpp (as in the llama-cpp-python wheels), not every build.
"""
from __future__ import annotations

import math

import numpy as np

_N = 624
_MASK32 = 0xFFFFFFFF
_ONE_BELOW = math.nextafter(1.0, 0.0)


def init_genrand(seed: int) -> np.ndarray:
    """The 624-word state `std::mt19937(seed)` is constructed with."""
    key = [0] * _N
    key[0] = seed & _MASK32
    for i in range(1, _N):
        prev = key[i - 1]
        key[i] = (1812433253 * (prev ^ (prev >> 30)) + i) & _MASK32
    return np.array(key, dtype=np.uint32)


class StdMT19937:
    """A `std::mt19937` stream: `next_u32()` is `rng()`, `uniform01()` is
    `std::uniform_real_distribution<double>(0.0, 1.0)(rng)` with libstdc++."""

    def __init__(self, seed: int) -> None:
        self._bits = np.random.MT19937(0)
        self.seed(seed)

    def seed(self, seed: int) -> None:
        """`rng.seed(seed)`: restart the stream from `seed` (a 32-bit unsigned value)."""
        if not 0 <= seed <= _MASK32:
            raise ValueError(f"mt19937 seed must be in [0, 2**32 - 1], got {seed}")
        self._bits.state = {"bit_generator": "MT19937",
                            "state": {"key": init_genrand(seed), "pos": _N}}

    def next_u32(self) -> int:
        return int(self._bits.random_raw())

    def uniform01_float(self) -> np.float32:
        """uniform_real_distribution<float>(0, 1): generate_canonical<float, 24>, one draw
        converted to float (rounded, so 2**32 - 1 becomes 2**32) over a float 2**32, and a
        1 replaced by the float below it."""
        value = np.float32(self.next_u32()) / np.float32(4294967296.0)
        return np.nextafter(np.float32(1.0), np.float32(0.0)) if value >= 1.0 else value

    def uniform01(self) -> float:
        lo = float(self.next_u32())
        hi = float(self.next_u32())
        value = (lo + hi * 4294967296.0) / 18446744073709551616.0
        return _ONE_BELOW if value >= 1.0 else value

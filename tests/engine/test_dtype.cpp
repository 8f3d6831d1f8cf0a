// Scalar conversions: exact where the formats overlap, round to nearest even
// elsewhere, specials preserved.

#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "treeattn/dtype.hpp"

using namespace treeattn;

TEST_CASE("every f16 value survives f16 -> f32 -> f16") {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const float f = half_to_float(std::uint16_t(h));
    if (std::isnan(f)) {
      CHECK(std::isnan(half_to_float(float_to_half(f))));
    } else {
      CHECK(float_to_half(f) == h);
    }
  }
}

TEST_CASE("f16 rounding, overflow and subnormals") {
  CHECK(half_to_float(0x3c00) == 1.0f);
  CHECK(half_to_float(0x0001) == std::ldexp(1.0f, -24));      // smallest subnormal
  CHECK(half_to_float(0x7bff) == 65504.0f);
  CHECK(float_to_half(1.0f + std::ldexp(1.0f, -11)) == 0x3c00);  // tie to even (down)
  CHECK(float_to_half(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3c02);  // tie to even (up)
  CHECK(float_to_half(65519.0f) == 0x7bff);
  CHECK(float_to_half(65520.0f) == 0x7c00);  // rounds to inf
  CHECK(float_to_half(-std::numeric_limits<float>::infinity()) == 0xfc00);
  CHECK(float_to_half(std::ldexp(1.0f, -25)) == 0x0000);      // tie to even: zero
  CHECK(float_to_half(std::ldexp(3.0f, -26)) == 0x0001);
  CHECK(float_to_half(std::ldexp(1.0f, -14) - std::ldexp(1.0f, -26)) == 0x0400);  // rounds up to the smallest normal
  CHECK(float_to_half(std::ldexp(1.0f, -14) * 0.999f) == 0x03ff);  // 1022.98 subnormal steps
}

TEST_CASE("bf16 conversions") {
  CHECK(bf16_to_float(0x3f80) == 1.0f);
  CHECK(float_to_bf16(1.0f) == 0x3f80);
  CHECK(float_to_bf16(1.0f + std::ldexp(1.0f, -8)) == 0x3f80);      // tie to even (down)
  CHECK(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3f82);  // tie to even (up)
  CHECK(std::isnan(bf16_to_float(float_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  for (std::uint32_t b = 0; b < 0x10000; b += 7) {
    const float f = bf16_to_float(std::uint16_t(b));
    if (!std::isnan(f)) CHECK(float_to_bf16(f) == b);
  }
}

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

namespace {
// fp8 decoded from its definition (sign, exponent field, mantissa field), independently of dtype.cpp.
double reference_fp8(std::uint8_t code, int mantissa_bits, int bias, bool ieee_specials) {
  const int exponent_bits = 7 - mantissa_bits;
  const int exponent = (code >> mantissa_bits) & ((1 << exponent_bits) - 1), mantissa = code & ((1 << mantissa_bits) - 1);
  const double sign = (code & 0x80) ? -1.0 : 1.0;
  const int top = (1 << exponent_bits) - 1;
  if (ieee_specials && exponent == top) return mantissa == 0 ? sign * INFINITY : NAN;
  if (!ieee_specials && exponent == top && mantissa == (1 << mantissa_bits) - 1) return NAN;
  if (exponent == 0) return sign * std::ldexp(double(mantissa), 1 - bias - mantissa_bits);
  return sign * std::ldexp(1.0 + std::ldexp(double(mantissa), -mantissa_bits), exponent - bias);
}
}  // namespace

TEST_CASE("fp8 e4m3 and e5m2: every code decodes as its definition and encodes back to itself") {
  for (std::uint32_t code = 0; code < 256; ++code) {
    CAPTURE(code);
    const double e4m3 = reference_fp8(std::uint8_t(code), 3, 7, false);
    const double e5m2 = reference_fp8(std::uint8_t(code), 2, 15, true);
    const float got4 = fp8_e4m3_to_float(std::uint8_t(code)), got5 = fp8_e5m2_to_float(std::uint8_t(code));
    CHECK(std::isnan(got4) == std::isnan(e4m3));
    CHECK(std::isnan(got5) == std::isnan(e5m2));
    if (!std::isnan(e4m3)) {
      CHECK(double(got4) == e4m3);
      CHECK(std::signbit(got4) == bool(code & 0x80));  // -0 too
      CHECK(float_to_fp8_e4m3(got4) == code);
    }
    if (!std::isnan(e5m2)) {
      CHECK(double(got5) == e5m2);
      CHECK(std::signbit(got5) == bool(code & 0x80));
      CHECK(float_to_fp8_e5m2(got5) == code);
    }
    // The dtype-generic accessors agree with the named conversions.
    const std::uint8_t byte = std::uint8_t(code);
    CHECK(std::isnan(load_as_float(&byte, DType::fp8_e4m3, 0)) == std::isnan(got4));
    if (!std::isnan(got4)) CHECK(load_as_float(&byte, DType::fp8_e4m3, 0) == got4);
    if (!std::isnan(got5)) CHECK(load_as_float(&byte, DType::fp8_e5m2, 0) == got5);
  }
  CHECK(dtype_size(DType::fp8_e4m3) == 1);
  CHECK(dtype_size(DType::fp8_e5m2) == 1);
}

TEST_CASE("fp8 rounding: ties to even, subnormals, overflow to NaN (e4m3) or infinity (e5m2)") {
  CHECK(fp8_e4m3_to_float(0x7e) == 448.0f);                    // largest e4m3
  CHECK(fp8_e4m3_to_float(0x01) == std::ldexp(1.0f, -9));      // smallest e4m3 subnormal
  CHECK(fp8_e5m2_to_float(0x7b) == 57344.0f);                  // largest e5m2
  CHECK(float_to_fp8_e4m3(1.0f + 1.0f / 16) == 0x38);          // 1.0625: tie to even (down to 1.0)
  CHECK(float_to_fp8_e4m3(1.0f + 3.0f / 16) == 0x3a);          // 1.1875: tie to even (up to 1.25)
  CHECK(float_to_fp8_e4m3(464.0f) == 0x7e);                    // tie between 448 and the NaN code: 448
  CHECK(std::isnan(fp8_e4m3_to_float(float_to_fp8_e4m3(470.0f))));
  CHECK(std::isnan(fp8_e4m3_to_float(float_to_fp8_e4m3(INFINITY))));
  CHECK(float_to_fp8_e4m3(std::ldexp(1.0f, -10)) == 0x00);     // half the smallest subnormal: tie to zero
  CHECK(float_to_fp8_e4m3(std::ldexp(3.0f, -11)) == 0x01);
  CHECK(float_to_fp8_e4m3(std::ldexp(15.5f, -10)) == 0x08);    // rounds up to the smallest normal
  CHECK(float_to_fp8_e4m3(-2.0f) == 0xc0);
  CHECK(float_to_fp8_e5m2(1.0f + 1.0f / 8) == 0x3c);           // tie to even (down to 1.0)
  CHECK(float_to_fp8_e5m2(1.0f + 3.0f / 8) == 0x3e);           // tie to even (up to 1.5)
  CHECK(float_to_fp8_e5m2(61440.0f) == 0x7c);                  // tie past the largest: infinity
  CHECK(float_to_fp8_e5m2(-INFINITY) == 0xfc);
  CHECK(std::isnan(fp8_e5m2_to_float(float_to_fp8_e5m2(NAN))));
  CHECK(float_to_fp8_e5m2(std::ldexp(1.0f, -17)) == 0x00);     // half the smallest subnormal (2^-16)
  CHECK(float_to_fp8_e5m2(std::ldexp(3.0f, -18)) == 0x01);
}

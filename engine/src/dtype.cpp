#include "treeattn/dtype.hpp"

#include <cmath>

namespace treeattn {

const char* to_string(DType dtype) noexcept {
  switch (dtype) {
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::f32: return "f32";
  }
  return "?";
}

std::size_t dtype_size(DType dtype) noexcept { return dtype == DType::f32 ? 4 : 2; }

float half_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = std::uint32_t(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  const std::uint32_t mantissa = h & 0x3ffu;
  std::uint32_t bits;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24, exact in binary32.
    float magnitude = float(mantissa) * 5.9604644775390625e-08f;
    std::memcpy(&bits, &magnitude, sizeof bits);
    bits |= sign;
  } else if (exponent == 31) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

std::uint16_t float_to_half(float f) noexcept {
  std::uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const std::uint32_t sign = (x >> 16) & 0x8000u;
  const std::uint32_t magnitude = x & 0x7fffffffu;
  if (magnitude >= 0x7f800000u) {  // inf stays inf; NaN stays a quiet NaN
    return std::uint16_t(sign | 0x7c00u | (magnitude > 0x7f800000u ? 0x200u : 0u));
  }
  if (magnitude >= 0x477ff000u) return std::uint16_t(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (magnitude < 0x38800000u) {
    // Below the smallest normal half (2^-14): the result is round(|f| * 2^24),
    // an exact scaling, rounded to nearest even by the default FP environment.
    float scaled;
    std::memcpy(&scaled, &magnitude, sizeof scaled);
    return std::uint16_t(sign | std::uint32_t(std::nearbyint(scaled * 16777216.0f)));
  }
  std::uint32_t h = ((magnitude >> 23) - 112) << 10 | ((magnitude >> 13) & 0x3ffu);
  const std::uint32_t rest = magnitude & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry may raise the exponent
  return std::uint16_t(sign | h);
}

std::uint16_t float_to_bf16(float f) noexcept {
  std::uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  if ((x & 0x7fffffffu) > 0x7f800000u) return std::uint16_t((x >> 16) | 0x40u);
  x += 0x7fffu + ((x >> 16) & 1u);
  return std::uint16_t(x >> 16);
}

}  // namespace treeattn

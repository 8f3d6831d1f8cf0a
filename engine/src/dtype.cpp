#include "treeattn/dtype.hpp"

#include <array>
#include <cmath>
#include <limits>

namespace treeattn {

const char* to_string(DType dtype) noexcept {
  switch (dtype) {
    case DType::f16: return "f16";
    case DType::bf16: return "bf16";
    case DType::f32: return "f32";
    case DType::fp8_e4m3: return "fp8_e4m3";
    case DType::fp8_e5m2: return "fp8_e5m2";
  }
  return "?";
}

std::size_t dtype_size(DType dtype) noexcept {
  switch (dtype) {
    case DType::f32: return 4;
    case DType::f16:
    case DType::bf16: return 2;
    case DType::fp8_e4m3:
    case DType::fp8_e5m2: return 1;
  }
  return 0;
}

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

namespace {

// Rounds |f| (finite) to a sign-less minifloat code with `mantissa_bits` and
// exponent `bias`, to nearest even; the caller maps codes past the largest
// finite one. Subnormal steps are 2^(1 - bias - mantissa_bits); a mantissa
// that rounds up to 2 carries into the exponent, as the code arithmetic does.
std::uint32_t round_to_minifloat(float magnitude, int mantissa_bits, int bias) {
  const int min_exponent = 1 - bias;
  int exponent = 0;
  std::frexp(magnitude, &exponent);  // magnitude = m * 2^exponent, m in [0.5, 1)
  --exponent;                        // magnitude = m * 2^exponent, m in [1, 2)
  if (magnitude == 0.0f || exponent < min_exponent) {
    return std::uint32_t(std::nearbyint(std::ldexp(magnitude, mantissa_bits - min_exponent)));
  }
  const float steps = std::nearbyint(std::ldexp(magnitude, mantissa_bits - exponent)) - std::ldexp(1.0f, mantissa_bits);
  return (std::uint32_t(exponent + bias) << mantissa_bits) + std::uint32_t(steps);
}

std::uint8_t sign_bit(float f) { return std::signbit(f) ? 0x80u : 0u; }

}  // namespace

float fp8_e4m3_to_float(std::uint8_t b) noexcept {
  // One table of the 256 values: the CPU backend decodes every K and V element through it.
  static const std::array<float, 256> values = [] {
    std::array<float, 256> v{};
    for (std::uint32_t code = 0; code < 256; ++code) {
      const std::uint32_t exponent = (code >> 3) & 0xfu, mantissa = code & 0x7u;
      // Subnormals are mantissa * 2^-9; normals (1 + mantissa / 8) * 2^(exponent - 7).
      const float magnitude = exponent == 0 ? std::ldexp(float(mantissa), -9)
                                            : std::ldexp(1.0f + float(mantissa) / 8.0f, int(exponent) - 7);
      v[code] = (exponent == 0xfu && mantissa == 0x7u) ? std::numeric_limits<float>::quiet_NaN()
                                                       : (code & 0x80u) ? -magnitude : magnitude;
    }
    return v;
  }();
  return values[b];
}

std::uint8_t float_to_fp8_e4m3(float f) noexcept {
  if (std::isnan(f) || std::isinf(f)) return std::uint8_t(sign_bit(f) | 0x7fu);
  const std::uint32_t code = round_to_minifloat(std::fabs(f), 3, 7);
  return std::uint8_t(sign_bit(f) | (code > 0x7eu ? 0x7fu : code));  // past 448: NaN
}

std::uint8_t float_to_fp8_e5m2(float f) noexcept {
  if (std::isnan(f)) return std::uint8_t(sign_bit(f) | 0x7eu);
  if (std::isinf(f)) return std::uint8_t(sign_bit(f) | 0x7cu);
  const std::uint32_t code = round_to_minifloat(std::fabs(f), 2, 15);
  return std::uint8_t(sign_bit(f) | (code > 0x7bu ? 0x7cu : code));  // past 57344: infinity
}

}  // namespace treeattn

#pragma once
// Element types of Q, K, V and O, and the scalar conversions the CPU paths use.
// fp8 (one byte) is for K and V only (DESIGN.md §8): e4m3 is float8_e4m3fn
// (bias 7, no infinities, 0x7F/0xFF NaN), e5m2 is IEEE-like (bias 15).

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace treeattn {

enum class DType : std::uint8_t { f16, bf16, f32, fp8_e4m3, fp8_e5m2 };

const char* to_string(DType dtype) noexcept;
std::size_t dtype_size(DType dtype) noexcept;
inline bool is_fp8(DType dtype) noexcept { return dtype == DType::fp8_e4m3 || dtype == DType::fp8_e5m2; }

// IEEE binary16 <-> binary32, round to nearest even, with subnormals, inf and NaN.
float half_to_float(std::uint16_t h) noexcept;
std::uint16_t float_to_half(float f) noexcept;

// bfloat16 is the top half of a binary32; rounding to nearest even, NaN kept quiet.
inline float bf16_to_float(std::uint16_t b) noexcept {
  std::uint32_t bits = std::uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
std::uint16_t float_to_bf16(float f) noexcept;

// fp8 codes <-> binary32. Decoding is exact; encoding rounds to nearest even,
// a value beyond the largest finite one becoming NaN (e4m3, which has no
// infinity: torch's float8_e4m3fn conversion) or infinity (e5m2).
float fp8_e4m3_to_float(std::uint8_t b) noexcept;
std::uint8_t float_to_fp8_e4m3(float f) noexcept;
// e5m2 is the top byte of a binary16.
inline float fp8_e5m2_to_float(std::uint8_t b) noexcept { return half_to_float(std::uint16_t(b << 8)); }
std::uint8_t float_to_fp8_e5m2(float f) noexcept;

// Reads element `i` of a buffer of `dtype` as float.
inline float load_as_float(const void* data, DType dtype, std::size_t i) noexcept {
  switch (dtype) {
    case DType::f16: return half_to_float(static_cast<const std::uint16_t*>(data)[i]);
    case DType::bf16: return bf16_to_float(static_cast<const std::uint16_t*>(data)[i]);
    case DType::f32: return static_cast<const float*>(data)[i];
    case DType::fp8_e4m3: return fp8_e4m3_to_float(static_cast<const std::uint8_t*>(data)[i]);
    case DType::fp8_e5m2: return fp8_e5m2_to_float(static_cast<const std::uint8_t*>(data)[i]);
  }
  return 0.0f;
}

// Writes `value` as element `i` of a buffer of `dtype`, rounding to nearest even.
inline void store_from_float(void* data, DType dtype, std::size_t i, float value) noexcept {
  switch (dtype) {
    case DType::f16: static_cast<std::uint16_t*>(data)[i] = float_to_half(value); return;
    case DType::bf16: static_cast<std::uint16_t*>(data)[i] = float_to_bf16(value); return;
    case DType::f32: static_cast<float*>(data)[i] = value; return;
    case DType::fp8_e4m3: static_cast<std::uint8_t*>(data)[i] = float_to_fp8_e4m3(value); return;
    case DType::fp8_e5m2: static_cast<std::uint8_t*>(data)[i] = float_to_fp8_e5m2(value); return;
  }
}

}  // namespace treeattn

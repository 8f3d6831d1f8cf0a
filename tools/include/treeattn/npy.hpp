#pragma once
// NumPy .npy files (format versions 1-3, little-endian, C order): '<f2' is f16,
// '<f4' f32, '<u2' carries bf16 bit patterns (NumPy has no bfloat16) and '|u1'
// fp8 codes, of the kind the reader names (NumPy has no fp8 either).

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "treeattn/tensor.hpp"

namespace treeattn {

// Parses a whole .npy file held in memory; `name` prefixes error messages.
// `bytes_as`: the fp8 kind of '|u1' data (fp8_e4m3 or fp8_e5m2); without it
// '|u1' is refused.
HostArray parse_npy(const std::string& contents, const std::string& name, std::optional<DType> bytes_as = std::nullopt);
HostArray read_npy(const std::string& path, std::optional<DType> bytes_as = std::nullopt);

// The bytes of a .npy file (version 1.0) holding `t`.
std::string encode_npy(const TensorRef& t);
void write_npy(const std::string& path, const TensorRef& t);

}  // namespace treeattn

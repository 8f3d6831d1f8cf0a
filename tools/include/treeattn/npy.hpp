#pragma once
// NumPy .npy files (format versions 1-3, little-endian, C order): '<f2' is f16,
// '<f4' f32, and '<u2' carries bf16 bit patterns (NumPy has no bfloat16).

#include <cstdint>
#include <string>
#include <vector>

#include "treeattn/tensor.hpp"

namespace treeattn {

// Parses a whole .npy file held in memory; `name` prefixes error messages.
HostArray parse_npy(const std::string& contents, const std::string& name);
HostArray read_npy(const std::string& path);

// The bytes of a .npy file (version 1.0) holding `t`.
std::string encode_npy(const TensorRef& t);
void write_npy(const std::string& path, const TensorRef& t);

}  // namespace treeattn

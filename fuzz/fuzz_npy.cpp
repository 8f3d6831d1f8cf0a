// The .npy reader (parse_npy, under read_npy): every input is either refused
// with a treeattn::Error or read into an array whose bytes are exactly its
// shape's elements and which encodes back to a file that reads the same.

#include <cstddef>
#include <cstdint>
#include <string>

#include "treeattn/dtype.hpp"
#include "treeattn/error.hpp"
#include "treeattn/npy.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string contents(reinterpret_cast<const char*>(data), size);
  treeattn::HostArray array;
  try {
    array = treeattn::parse_npy(contents, "fuzz.npy");
  } catch (const treeattn::Error&) {
    return 0;
  }
  if (std::size_t(array.numel()) * treeattn::dtype_size(array.dtype) != array.bytes.size()) __builtin_trap();
  const treeattn::HostArray again = treeattn::parse_npy(treeattn::encode_npy(array.view()), "encoded.npy");
  if (again.dtype != array.dtype || again.shape != array.shape || again.bytes != array.bytes) __builtin_trap();
  return 0;
}

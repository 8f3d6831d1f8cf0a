#pragma once
// A treeattn_tensor of the C API (treeattn/treeattn.h) for the C++ tests: dense,
// up to three dimensions (0 for the rest).

#include <cstdint>

#include "treeattn/treeattn.h"

namespace treeattn::test {

inline treeattn_tensor c_tensor(void* data, treeattn_dtype dtype, int ndim, std::int64_t a, std::int64_t b = 0,
                                std::int64_t c = 0) {
  treeattn_tensor t{};
  t.data = data;
  t.dtype = dtype;
  t.ndim = ndim;
  t.shape[0] = a;
  t.shape[1] = b;
  t.shape[2] = c;
  return t;
}

}  // namespace treeattn::test

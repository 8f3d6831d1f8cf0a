#pragma once
// The C API's arguments as the C++ API's: options structs of any size a
// caller may have been compiled with, C enums checked before they are read,
// C tensors as TensorRefs. Every function throws treeattn::Error naming the
// argument; the exported functions (treeattn_c.cpp) turn that into a status.

#include <fmt/format.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "treeattn/context.hpp"
#include "treeattn/error.hpp"
#include "treeattn/incremental_planner.hpp"
#include "treeattn/planner.hpp"
#include "treeattn/tree.hpp"
#include "treeattn/treeattn.h"

namespace treeattn::capi {

// Throws InvalidArgument "<what> is NULL" for a null pointer.
void require(const void* pointer, const char* what);

// Where each field of an options struct ends: the sizes an older caller's
// struct may have (a size between two would copy part of a field: the low
// bytes of threads = -1 are 65535 threads).
std::vector<std::size_t> field_ends(const treeattn_plan_options*);
std::vector<std::size_t> field_ends(const treeattn_context_options*);
std::vector<std::size_t> field_ends(const treeattn_tree_options*);
std::vector<std::size_t> field_ends(const treeattn_attention_options*);

// An options struct from a caller that may be older (smaller) than this
// library: the fields it has, defaults for the rest.
template <typename Options>
Options read_options(const Options* given, void (*init)(Options*), const char* what) {
  Options o;
  init(&o);
  if (given == nullptr) return o;
  const std::vector<std::size_t> ends = field_ends(given);
  if (std::find(ends.begin(), ends.end(), given->struct_size) == ends.end()) {
    throw Error(ErrorCategory::InvalidArgument,
                fmt::format("{}.struct_size is {}: set it with {}_init (this library's is {}; a smaller one must end "
                            "at a field's end)",
                            what, given->struct_size, what, sizeof(Options)));
  }
  std::memcpy(&o, given, given->struct_size);
  o.struct_size = sizeof(Options);
  return o;
}

// A C enum field as the integer the caller stored: C may put any int there,
// and loading a value outside a C++ enum's range as that enum is undefined.
template <typename Enum>
std::int64_t value_of(const Enum& field) {
  static_assert(sizeof(Enum) == sizeof(std::int32_t), "C enums of this API are int-sized");
  std::int32_t raw = 0;
  std::memcpy(&raw, &field, sizeof raw);
  return raw;
}

// A tree of these heads, checked as far as the C layer can (the planner
// checks the head dims against those the kernels have).
Tree tree_of(const HeadConfig& h);
// The tensors of a call and its attention options (NULL: none).
AttentionArgs args_of(const treeattn_tensor* q, const treeattn_tensor* k, const treeattn_tensor* v,
                      const treeattn_tensor* o, const treeattn_tensor* lse, const treeattn_attention_options* given);
ContextOptions context_options(const treeattn_context_options& o);
PlanOptions plan_options(const treeattn_plan_options* given);
IncrementalOptions incremental_options(const treeattn_plan_options* given);
// `count` slots (or nodes) of node `node`'s call, checked.
std::vector<std::int64_t> list_of(const std::int64_t* values, std::int64_t count, const char* what, std::int64_t node);

}  // namespace treeattn::capi

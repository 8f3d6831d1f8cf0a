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

// `init`'s defaults written for a caller whose struct is `size` bytes (its
// sizeof): smaller than this library's when the caller was compiled against an
// older header (the fields it lacks are not written), larger against a newer
// one (the bytes this library does not know are zeroed, and read_options then
// refuses that struct_size, naming it).
template <typename Options>
void init_sized(Options* o, std::size_t size, void (*init)(Options*)) {
  if (o == nullptr || size < sizeof(o->struct_size)) return;
  Options defaults;
  init(&defaults);
  std::memset(static_cast<void*>(o), 0, size);
  std::memcpy(static_cast<void*>(o), &defaults, std::min(size, sizeof(Options)));
  o->struct_size = size;
}

// The bytes of a caller's options struct to read, given its struct_size: a
// field's end, or the sizeof a struct ending at that field has (C pads it to
// the struct's alignment), whose padding is not read; where two ends round up
// to one size, the larger (this header's layout). 0: no field ends there.
std::size_t bytes_to_read(const std::vector<std::size_t>& field_ends, std::size_t struct_size, std::size_t alignment);

// An options struct from a caller that may be older (smaller) than this
// library: the fields it has, defaults for the rest.
template <typename Options>
Options read_options(const Options* given, void (*init)(Options*), const char* what) {
  Options o;
  init(&o);
  if (given == nullptr) return o;
  const std::size_t bytes = bytes_to_read(field_ends(given), given->struct_size, alignof(Options));
  if (bytes == 0) {
    throw Error(ErrorCategory::InvalidArgument,
                fmt::format("{}.struct_size is {}: set it with {}_init (this library's is {}; a smaller one must end "
                            "at a field's end)",
                            what, given->struct_size, what, sizeof(Options)));
  }
  std::memcpy(static_cast<void*>(&o), given, bytes);
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

#pragma once
// --kv-dtype, --softcap and --sinks (run, bench, demo): the attention variants
// of the calls a command makes (DESIGN.md §8). A backend without kernels for
// one refuses it, naming it.

#include <CLI/CLI.hpp>

#include <optional>
#include <string>

#include "treeattn/planner.hpp"
#include "treeattn/tensor.hpp"

namespace treeattn::cli {

struct AttentionFlags {
  std::string kv_dtype;      // "": K and V in the inputs' dtype; fp8_e4m3 or fp8_e5m2
  float softcap = 0.0f;      // logit soft-cap (0: off)
  std::string sinks_path;    // .npy [heads_q] <f4: a sink logit per query head ("": none)

  // `kv_dtype_help` says what --kv-dtype means to the command.
  void add_to(CLI::App& sub, const char* kv_dtype_help);
  // The fp8 kind --kv-dtype names, or nothing.
  std::optional<DType> fp8() const;
  // `plan` made for these calls' K and V (PlanOptions::kv_dtype: fp8 plans with the cost model's fp8 terms).
  PlanOptions planned_for(PlanOptions plan) const;
  // --sinks' array (empty without it); its length and dtype are checked with the call's other tensors.
  HostArray read_sinks() const;
  // The calls' options; their sinks view `sinks` (read_sinks()'s) where it is not empty.
  AttentionOptions options(HostArray& sinks) const;
  // Bytes of one K or V element: 1 for fp8, else `inputs`'.
  std::size_t kv_element_bytes(DType inputs) const { return fp8() ? 1 : dtype_size(inputs); }
  // "fp8_e4m3 K/V, soft-cap 30, sinks" (or "" without variants), for a command's summary line.
  std::string describe() const;
};

}  // namespace treeattn::cli

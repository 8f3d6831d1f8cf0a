#pragma once
// What `treeattn demo` is asked to run, as its command line gives it
// (cmd_demo.cpp registers the options), and what they resolve to.

#include <cstdint>
#include <string>

#include "attention_flags.hpp"
#include "cli_support.hpp"
#include "workload_options.hpp"

namespace treeattn::cli {

struct DemoOptions {
  WorkloadOptions workloads;
  std::string kind = "fewshot";
  std::string model = "llama3-8b";
  int layers = 0;  // 0: the model's
  std::int64_t steps = 0;  // 0: the whole scenario
  PlanFlags plan;
  std::string backend = "auto";
  BackendFlags backend_flags;
  AttentionFlags attention;
  bool verbose = false;
  int page_size = 16;
  std::string svg;
  std::int64_t svg_step = 0;  // 0: the last step
  std::int64_t dump_step = 0;
  std::string dump_dir;
  std::string json;
  bool bitwise_updates = false;
  std::int64_t check_every = 0;    // 0: no checks
  double check_tolerance = 2e-3;   // the conformance suite's for f16 inputs (docs/testing.md)
};

// What the options resolve to: the model, the scenario, and the steps to run.
struct DemoSetup {
  const ModelShape* model = nullptr;
  int layers = 0;
  NamedScenario named;
  std::int64_t steps = 0, svg_step = 0;
};

}  // namespace treeattn::cli

#pragma once
// The replay of `treeattn demo`: the live tree in its paged KV cache, the
// runner of each step's layers, the planners, and what each step recorded.
// A branch controller (the workload's Scenario) grows, forks and prunes the
// tree; every step hands its changes to an IncrementalPlanner and runs
// attention for every layer of the model on synthetic Q/K/V (on CUDA and
// Vulkan through the device path, the next step planned while the GPU runs
// this one). Beside each step: a from-scratch plan of the same tree, timed
// for comparison, the plan drawn or the step dumped where asked, and a soak's
// check (--check-every).

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "demo_dry_replay.hpp"
#include "demo_options.hpp"
#include "demo_runner.hpp"
#include "demo_soak.hpp"
#include "progress_bar.hpp"
#include "treeattn/tools.hpp"
#include "treeattn/treeattn.hpp"

namespace treeattn::cli {

// One decode step's host and device times (microseconds).
struct StepRecord {
  std::int64_t step = 0, nodes = 0, queries = 0, tokens = 0;
  double plan_update_us = 0.0;  // the IncrementalPlanner's update (the plan the step runs)
  double plan_us = 0.0;         // a from-scratch plan of the same tree, for comparison
  double upload_us = 0.0;       // the plan's upload, on the host
  double gpu_wait_us = 0.0;     // the host two steps ahead, waiting for the GPU (not in host_us)
  double host_us = 0.0;         // treeattn's host part: the changes handed over, the update, upload and queueing
                                // (waiting for the GPU left out)
  double attention_us = 0.0;    // every layer's attention (GPU time on the device path)
  bool reanalysed = false, chosen = false, held_layout = false;
  std::int64_t replaced_nodes = 0;  // nodes that came in place of ones of the same shape
};

// Counts and sums over every step of a run (its rows are only sampled).
struct StepCounts {
  std::int64_t steps = 0, max_nodes = 0, max_queries = 0, appended_only = 0, replaced = 0, chosen = 0, held = 0;
  double attention_us = 0.0, update_us = 0.0;

  void add(const StepRecord& r);
};

class DemoLoop {
 public:
  DemoLoop(const DemoOptions& o, DemoSetup& setup, const PeakSizes& peak);

  // Every step of the run, then the last ones' times collected.
  void run_steps();

  // Rows kept of the run's steps: all of a short run's, an evenly spaced sample of a long one's.
  static constexpr std::size_t kStepRows = 4096;
  const Sampled<StepRecord>& rows() const { return rows_; }
  const StepCounts& counts() const { return counts_; }
  const SoakChecks* soak() const { return soak_.get(); }
  const Backend& backend() const { return *backend_; }
  const StepRunner& runner() const { return *runner_; }
  const PagedKvCache& cache() const { return cache_; }
  // Tokens generated, and the KV bytes every layer's attention read (unique tree KV) or would read sequence by sequence.
  struct Totals {
    std::int64_t generated = 0, unique_bytes = 0, sequence_bytes = 0;
  };
  const Totals& totals() const { return totals_; }

 private:
  static BackendOptions backend_options(const DemoOptions& o);
  void size_runner();
  void run_step(std::int64_t step);
  const Plan& update_plan(StepRecord& record);
  void queue_layers(const Plan& plan, const HostArray& q, StepRecord& record);
  void beside_the_step(std::int64_t step, const Plan& plan, const HostArray& q);
  void dump_step(const Tree& tree, const HostArray& q);
  void collect(bool wait);

  const DemoOptions& o_;
  DemoSetup& setup_;
  const HeadConfig& heads_;
  PagedKvCache cache_;
  SequenceTree live_;
  HostArray k_, v_, sinks_;
  const AttentionOptions variants_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<StepRunner> runner_;
  const PlanOptions options_;
  IncrementalPlanner incremental_;
  Planner planner_;
  ProgressBar progress_;
  std::unique_ptr<SoakChecks> soak_;
  std::deque<StepRecord> running_;  // steps whose attention time is not in yet
  Sampled<StepRecord> rows_{kStepRows};
  StepCounts counts_;
  Totals totals_;
  std::vector<TreeQuery> queries_;
  std::vector<std::int64_t> new_slots_;
};

}  // namespace treeattn::cli

#pragma once
// The CPU backend: the same two stages as the GPU kernels, executed from the
// Plan by a thread pool. fp32 accumulation; bitwise identical output for any
// thread count, because each (work item, KV head) task and each merged query
// owns its outputs and adds in a fixed order. It runs every attention variant
// (DESIGN.md §8): fp8 K and V are dequantized as their rows are gathered, the
// soft-cap applies to each score, and a sink joins a query head's softmax
// where its O is finished (stage 1 for a query with one contributor, else the
// merge), so exactly once however many partials the query has.

#include <memory>
#include <vector>

#include "backend.hpp"
#include "thread_pool.hpp"

namespace treeattn::cpu {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(const BackendOptions& options);
  const char* name() const noexcept override { return "cpu"; }
  void run(const Plan& plan, const AttentionArgs& args) override;
  // Host read bandwidth, measured once (a quarter second) on first use.
  double peak_gbps() override;
  int threads() const noexcept { return pool_.size(); }

 private:
  struct Scratch {
    std::vector<float> k, v, scores, q, acc;
  };
  void run_item(const Plan& plan, const AttentionArgs& args, std::int32_t item, std::int32_t kv_head,
                Scratch& scratch);
  void merge_query(const Plan& plan, const AttentionArgs& args, std::int32_t query, Scratch& scratch);

  ThreadPool pool_;
  std::vector<Scratch> scratch_;      // one per worker
  std::vector<float> partial_o_;      // [num_partials, heads_q, head_dim_v]
  std::vector<float> partial_lse_;    // [num_partials, heads_q]
  double peak_gbps_ = 0.0;
};

}  // namespace treeattn::cpu

#pragma once
// How `treeattn demo` runs a decode step's layers. A device runner keeps the
// KV cache on the GPU, uploads each step's plan and returns once the layers
// are queued, so the demo plans step N+1 on the host while step N runs; a
// host runner calls Backend::run for each layer and returns when they are done.

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "backend.hpp"
#include "treeattn/treeattn.hpp"

namespace treeattn::cli {

class StepRunner {
 public:
  virtual ~StepRunner() = default;
  virtual const char* name() const noexcept = 0;
  // Whether run() returns before the layers are done (planning then overlaps them).
  virtual bool overlaps() const noexcept = 0;
  // The K and V rows of `slots` were written on the host (new tokens); they
  // stay as written until the step's run(), which may be when they are copied up.
  virtual void kv_written(const std::vector<std::int64_t>& slots) = 0;
  // What run() spent on the host, in microseconds.
  struct HostTimes {
    double upload_us = 0.0;  // the plan's upload (0 with nothing to upload)
    double waited_us = 0.0;  // waiting for the GPU: a runner two steps ahead waits for the step two back to start
  };
  // Whether the runner sizes its memory from the run's steps ahead: then,
  // before the first run(), reserve() gets every step's plan and the count of
  // K/V rows it writes, in order, from a dry replay planned as the run plans
  // (the same changes, options and pool size, so the same plans). Its
  // workspace and staging then hold every step of the run, so the runner's
  // device and host memory are flat from the first step, and a CUDA step graph
  // is captured once. A plan past what was reserved still runs (the workspace grows).
  virtual bool reserves_ahead() const noexcept { return false; }
  virtual void reserve(const Plan& plan, std::size_t written_rows) {
    (void)plan;
    (void)written_rows;
  }
  // Runs `layers` attention calls of `plan` on Q.
  virtual HostTimes run(const Plan& plan, const HostArray& q, int layers) = 0;
  // The attention time of each step run since the last call, in order (GPU
  // time on a device, wall time on the host); `wait` waits for the last one,
  // else only finished steps are reported.
  virtual std::vector<double> finished(bool wait) = 0;
  // Layer 0's O and LSE of the last step (waits for it).
  virtual void outputs(HostArray& o, HostArray& lse) = 0;

  // Memory of the runner's device in use, in bytes, and what counts it (the
  // host runner has none: -1).
  struct MemoryUse {
    std::int64_t bytes = -1;
    const char* source = "none";
  };
  virtual MemoryUse device_memory() const { return {}; }
  // The CUDA graphs captured so far and the step (run() call) of the last
  // capture; a count of -1 where steps are not graphs.
  struct Captures {
    std::int64_t count = -1, last_step = 0;
  };
  virtual Captures graph_captures() const noexcept { return {}; }
};

// The CUDA or Vulkan device runner where the backend is one of those, else layers through `backend`.
// `k` and `v` are the host's KV pool; Q has at most `max_queries` rows; every
// layer's call takes `variants` (a device runner copies their tensors up once).
std::unique_ptr<StepRunner> make_step_runner(Backend& backend, const BackendOptions& options, const HeadConfig& heads,
                                             HostArray& k, HostArray& v, std::int64_t max_queries,
                                             const AttentionOptions& variants);

}  // namespace treeattn::cli

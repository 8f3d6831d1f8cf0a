#pragma once
// What a long `treeattn demo` run keeps of itself without growing: every Nth
// step's layer-0 outputs checked against the CPU backend's run of the same
// plan and inputs, and the process's host and device memory sampled at each
// check, so a soak shows both the answers and the memory staying put.

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "demo_runner.hpp"

namespace treeattn::cli {

// An evenly spaced sample of a sequence of any length in bounded memory: every
// `stride`th item is kept; when `capacity` are held, every other one is
// dropped and the stride doubles. All items are kept while there are at most
// `capacity`.
template <typename T>
class Sampled {
 public:
  // The items' memory is written once here, so that it is resident from the
  // start: a reservation alone is paged in as items fill it, and the process
  // would grow by an item a step until `capacity` are held.
  explicit Sampled(std::size_t capacity) : capacity_(capacity), kept_(capacity) { kept_.clear(); }
  void add(const T& item) {
    if (seen_++ % stride_ != 0) return;
    if (kept_.size() == capacity_) {
      for (std::size_t i = 0; 2 * i < kept_.size(); ++i) kept_[i] = kept_[2 * i];
      kept_.resize((kept_.size() + 1) / 2);
      stride_ *= 2;
      if ((seen_ - 1) % stride_ != 0) return;
    }
    kept_.push_back(item);
  }
  const std::vector<T>& kept() const noexcept { return kept_; }
  std::uint64_t stride() const noexcept { return stride_; }

 private:
  std::size_t capacity_;
  std::vector<T> kept_;
  std::uint64_t seen_ = 0, stride_ = 1;
};

// The resident set of this process, from /proc/self/statm (-1 where there is none).
std::int64_t host_rss_bytes();
// The bytes this process's heap has handed out and not had back (glibc's
// mallinfo2: in use, mapped blocks included; -1 without glibc). Unlike the
// resident set, which keeps the heap's high-water mark, it falls again when
// memory is freed: a leak is a trend in it.
std::int64_t host_heap_bytes();

// The largest absolute difference between two f32 arrays of one shape, and
// the first element where it occurs; a NaN or infinity on one side only is an
// infinite difference.
struct Difference {
  double error = 0.0;
  std::int64_t at = 0;
};
Difference max_difference(const HostArray& got, const HostArray& expected);

class SoakChecks {
 public:
  // Checks every `every`th of `steps` steps against the CPU backend with
  // `tolerance`, running the run's attention variants; memory samples taken
  // from step `steps` / 10 on are the ones after warm-up.
  SoakChecks(std::int64_t every, double tolerance, std::int64_t steps, const AttentionOptions& variants);
  ~SoakChecks();

  bool due(std::int64_t step) const noexcept { return step % every_ == 0; }
  // Layer 0's O and LSE of the step `runner` ran last (the plan and Q of
  // `step`, K and V as they are now) against the CPU backend's; throws
  // Backend naming the step, the tensor, the element and the error when one
  // is past the tolerance. Then samples memory.
  void check(std::int64_t step, const Plan& plan, const HostArray& q, HostArray& k, HostArray& v, StepRunner& runner);

  std::int64_t checks() const noexcept { return checks_; }
  double max_error() const noexcept { return std::max(max_o_, max_lse_); }
  // The "soak" object of the demo's JSON.
  nlohmann::json json(const StepRunner& runner) const;

 private:
  struct MemorySample {
    std::int64_t step, host_rss, host_heap, device;
  };
  struct Profile {  // one kind of memory after warm-up
    std::int64_t first = -1, least = std::numeric_limits<std::int64_t>::max(), most = -1, last = -1;
    void add(std::int64_t bytes);
    nlohmann::json json() const;
  };

  std::int64_t every_, warmup_;
  double tolerance_;
  AttentionOptions variants_;
  std::unique_ptr<Backend> cpu_;
  std::unique_ptr<StepRunner> reference_;
  HostArray o_, lse_, o_cpu_, lse_cpu_;
  std::int64_t checks_ = 0, worst_step_ = 0;
  double max_o_ = 0.0, max_lse_ = 0.0;
  Sampled<MemorySample> samples_{512};
  Profile host_, heap_, device_;
};

}  // namespace treeattn::cli

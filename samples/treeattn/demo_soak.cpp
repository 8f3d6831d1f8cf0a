#include "demo_soak.hpp"

#include <unistd.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <algorithm>
#include <cmath>
#include <fstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

namespace treeattn::cli {

std::int64_t host_rss_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::int64_t size = 0, resident = -1;
  if (!(statm >> size >> resident)) return -1;
  return resident * std::int64_t(sysconf(_SC_PAGESIZE));
}

std::int64_t host_heap_bytes() {
#if defined(__GLIBC__)
  const struct mallinfo2 info = mallinfo2();
  return std::int64_t(info.uordblks + info.hblkhd);
#else
  return -1;
#endif
}

Difference max_difference(const HostArray& got, const HostArray& expected) {
  Difference d;
  const float* a = reinterpret_cast<const float*>(got.bytes.data());
  const float* b = reinterpret_cast<const float*>(expected.bytes.data());
  for (std::int64_t i = 0; i < expected.numel(); ++i) {
    const float x = a[i], y = b[i];
    double error = std::abs(double(x) - double(y));
    if (!std::isfinite(x) || !std::isfinite(y)) error = x == y ? 0.0 : std::numeric_limits<double>::infinity();
    if (error > d.error || std::isnan(error)) {
      d.error = std::isnan(error) ? std::numeric_limits<double>::infinity() : error;
      d.at = i;
    }
  }
  return d;
}

SoakChecks::SoakChecks(std::int64_t every, double tolerance, std::int64_t steps, const AttentionOptions& variants)
    : every_(every), warmup_(steps / 10), tolerance_(tolerance), variants_(variants), cpu_(make_backend(BackendKind::cpu)) {}

SoakChecks::~SoakChecks() = default;

void SoakChecks::check(std::int64_t step, const Plan& plan, const HostArray& q, HostArray& k, HostArray& v,
                       StepRunner& runner) {
  runner.outputs(o_, lse_);
  if (!reference_) reference_ = make_step_runner(*cpu_, BackendOptions{}, plan.heads, k, v, plan.num_queries, variants_);
  reference_->run(plan, q, 1);
  reference_->outputs(o_cpu_, lse_cpu_);
  (void)reference_->finished(true);
  const HeadConfig& h = plan.heads;
  for (const auto& [name, got, expected, max, row] :
       {std::tuple{"O", &o_, &o_cpu_, &max_o_, std::int64_t(h.heads_q) * h.value_dim()},
        std::tuple{"LSE", &lse_, &lse_cpu_, &max_lse_, std::int64_t(h.heads_q)}}) {
    if (got->shape != expected->shape) {
      throw Error(ErrorCategory::Backend, fmt::format("demo: step {}: layer 0's {} has shape {} on the {}, {} on the CPU",
                                                      step, name, fmt::join(got->shape, "x"), runner.name(),
                                                      fmt::join(expected->shape, "x")));
    }
    const Difference d = max_difference(*got, *expected);
    if (d.error > *max) {
      *max = d.error;
      worst_step_ = step;
    }
    if (!(d.error <= tolerance_)) {
      throw Error(ErrorCategory::Backend,
                  fmt::format("demo: step {}: layer 0's {} differs from the CPU backend's by {:.3g} at query {}, head {} "
                              "(tolerance {:.3g}; {} checks passed before)",
                              step, name, d.error, d.at / row, d.at % row / (row / h.heads_q), tolerance_, checks_));
    }
  }
  ++checks_;
  const MemorySample sample{step, host_rss_bytes(), host_heap_bytes(), runner.device_memory().bytes};
  samples_.add(sample);
  if (step >= warmup_) {
    host_.add(sample.host_rss);
    heap_.add(sample.host_heap);
    device_.add(sample.device);
  }
}

void SoakChecks::Profile::add(std::int64_t bytes) {
  if (first < 0) first = bytes;
  least = std::min(least, bytes);
  most = std::max(most, bytes);
  last = bytes;
}

nlohmann::json SoakChecks::Profile::json() const {
  if (first < 0) return nullptr;
  return {{"first", first}, {"least", least}, {"most", most}, {"last", last}, {"growth", most - first}};
}

nlohmann::json SoakChecks::json(const StepRunner& runner) const {
  nlohmann::json samples = nlohmann::json::array();
  for (const MemorySample& s : samples_.kept()) {
    samples.push_back({{"step", s.step}, {"host_rss_bytes", s.host_rss}, {"host_heap_bytes", s.host_heap},
                       {"device_bytes", s.device}});
  }
  const StepRunner::MemoryUse device = runner.device_memory();
  const StepRunner::Captures captures = runner.graph_captures();
  return {{"check_every", every_},
          {"checks", checks_},
          {"tolerance", tolerance_},
          {"max_o_error", max_o_},
          {"max_lse_error", max_lse_},
          {"worst_step", worst_step_},
          {"warmup_steps", warmup_},
          {"host_rss_after_warmup", host_.json()},
          {"host_heap_after_warmup", heap_.json()},
          {"device_bytes_after_warmup", device.bytes < 0 ? nlohmann::json(nullptr) : device_.json()},
          {"device_bytes_source", device.source},
          {"graph_captures", captures.count < 0 ? nlohmann::json(nullptr) : nlohmann::json(captures.count)},
          {"last_capture_step", captures.count < 0 ? nlohmann::json(nullptr) : nlohmann::json(captures.last_step)},
          {"memory_samples_stride", samples_.stride()},
          {"memory_samples", samples}};
}

}  // namespace treeattn::cli

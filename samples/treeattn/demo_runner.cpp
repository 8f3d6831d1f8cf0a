#include "demo_runner.hpp"

#include <chrono>
#include <cstring>
#include <string>
#include <utility>

namespace treeattn::cli {

#if TREEATTN_HAS_CUDA
std::unique_ptr<StepRunner> make_cuda_step_runner(const BackendOptions& options, const HeadConfig& heads, HostArray& k,
                                                  HostArray& v, std::int64_t max_queries, const AttentionOptions& variants);
#endif
#if TREEATTN_HAS_VULKAN
std::unique_ptr<StepRunner> make_vulkan_step_runner(const BackendOptions& options, const HeadConfig& heads, HostArray& k,
                                                    HostArray& v, std::int64_t max_queries, const AttentionOptions& variants);
#endif

namespace {

// Backend::run for each layer: the host arrays copied in and out every call.
class HostRunner final : public StepRunner {
 public:
  HostRunner(Backend& backend, HostArray& k, HostArray& v, const AttentionOptions& variants)
      : backend_(backend), k_(k), v_(v), variants_(variants) {}
  const char* name() const noexcept override { return "host arrays"; }
  bool overlaps() const noexcept override { return false; }
  void kv_written(const std::vector<std::int64_t>&) override {}

  HostTimes run(const Plan& plan, const HostArray& q, int layers) override {
    const HeadConfig& h = plan.heads;
    o_ = HostArray(DType::f32, {plan.num_queries, h.heads_q, h.value_dim()});
    lse_ = HostArray(DType::f32, {plan.num_queries, h.heads_q});
    HostArray& q_in = const_cast<HostArray&>(q);  // view() is not const; run() only reads Q
    const auto t0 = std::chrono::steady_clock::now();
    for (int layer = 0; layer < layers; ++layer) {
      backend_.run(plan, AttentionArgs{q_in.view(), k_.view(), v_.view(), o_.view(), lse_.view(), variants_});
    }
    done_.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    return {};
  }

  std::vector<double> finished(bool) override { return std::exchange(done_, {}); }

  void outputs(HostArray& o, HostArray& lse) override {
    o = o_;
    lse = lse_;
  }

 private:
  Backend& backend_;
  HostArray &k_, &v_;
  const AttentionOptions variants_;
  HostArray o_, lse_;
  std::vector<double> done_;
};

}  // namespace

std::unique_ptr<StepRunner> make_step_runner(Backend& backend, const BackendOptions& options, const HeadConfig& heads,
                                             HostArray& k, HostArray& v, std::int64_t max_queries,
                                             const AttentionOptions& variants) {
#if TREEATTN_HAS_CUDA
  if (std::string(backend.name()) == "cuda") return make_cuda_step_runner(options, heads, k, v, max_queries, variants);
#endif
#if TREEATTN_HAS_VULKAN
  if (std::string(backend.name()) == "vulkan") return make_vulkan_step_runner(options, heads, k, v, max_queries, variants);
#endif
#if !TREEATTN_HAS_CUDA && !TREEATTN_HAS_VULKAN
  (void)options;
  (void)heads;
  (void)max_queries;
#endif
  return std::make_unique<HostRunner>(backend, k, v, variants);
}

}  // namespace treeattn::cli

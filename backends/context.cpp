// treeattn::Context: a backend (registry.cpp) and the calls every surface
// makes of it. The workspace and the record of the plan it holds live in the
// backend; this file only routes.

#include "treeattn/context.hpp"

#include "fail.hpp"
#include "backend.hpp"
#ifdef TREEATTN_HAVE_VULKAN
#include "vulkan/vulkan_backend.hpp"
#endif

namespace treeattn {
namespace {

BackendOptions backend_options(const ContextOptions& o) {
  BackendOptions b;
  b.threads = o.cpu.threads;
  b.device = o.device;
  b.verbose = o.verbose;
  b.log = o.log;
  b.model_cache = o.model_cache_path;
  b.vk_variant = o.vulkan.variant;
  b.vk_pipeline_cache = o.vulkan.pipeline_cache_path;
  b.vk_validation = o.vulkan.validation;
  return b;
}

}  // namespace

Context::Context(const ContextOptions& options) : Context(make_backend(options.backend, backend_options(options))) {}

Context::Context(const vulkan::ExternalDevice& device, const ContextOptions& options) {
#ifdef TREEATTN_HAVE_VULKAN
  backend_ = std::make_unique<vulkan::VulkanBackend>(device, backend_options(options));
  kind_ = BackendKind::vulkan;
  cost_ = backend_->cost_model();
#else
  (void)device;
  (void)options;
  fail(ErrorCategory::Backend,
       "treeattn was built without the vulkan backend (configure found no Vulkan headers, volk or glslang)");
#endif
}

Context::Context(std::unique_ptr<Backend> backend) : backend_(std::move(backend)) {
  if (!backend_) fail(ErrorCategory::InvalidArgument, "Context: the backend is null");
  kind_ = parse_backend(backend_->name());
  cost_ = backend_->cost_model();  // here, not at first use: no calibration inside a caller's capture or threads
}

Context::~Context() = default;
Context::Context(Context&&) noexcept = default;
Context& Context::operator=(Context&&) noexcept = default;

BackendKind Context::backend() const noexcept { return kind_; }

Plan Context::plan(const Tree& tree, PlanOptions options) const {
  options.cost = cost_model();
  return treeattn::plan(tree, options);
}

IncrementalPlanner Context::planner(const HeadConfig& heads, PlanOptions options,
                                    const IncrementalOptions& incremental) const {
  options.cost = cost_model();
  return IncrementalPlanner(heads, options, incremental);
}

IncrementalPlanner Context::planner(const Tree& initial, PlanOptions options, const IncrementalOptions& incremental) const {
  IncrementalPlanner p = planner(initial.heads, std::move(options), incremental);
  p.add_tree(initial);
  return p;
}

void Context::run(const Plan& plan, const AttentionArgs& host_tensors) { backend_->run(plan, host_tensors); }

void Context::enqueue(const Plan& plan, const AttentionArgs& device_tensors, CUstream_st* stream) {
  if (kind_ != BackendKind::cuda) {
    fail(ErrorCategory::InvalidArgument, "enqueue on a CUDA stream needs a CUDA context; this one runs {}{}",
         to_string(kind_), kind_ == BackendKind::vulkan ? " (record into a command buffer)" : " (run host arrays)");
  }
  backend_->enqueue(plan, device_tensors, stream);
}

void Context::upload(const Plan& plan, CUstream_st* stream) {
  if (kind_ != BackendKind::cuda) {
    fail(ErrorCategory::InvalidArgument,
         "upload on a CUDA stream needs a CUDA context; this one runs {}{}", to_string(kind_),
         kind_ == BackendKind::vulkan ? " (record() records the upload of a plan the workspace does not hold)" : "");
  }
  backend_->upload(plan, stream);
}

void Context::record(const Plan& plan, const AttentionArgs& device_addresses, VkCommandBuffer_T* commands) {
  if (kind_ != BackendKind::vulkan) {
    fail(ErrorCategory::InvalidArgument, "record into a Vulkan command buffer needs a Vulkan context; this one runs {}",
         to_string(kind_));
  }
  backend_->enqueue(plan, device_addresses, commands);
}

void Context::graph_stable(const cuda::WorkspaceLimits& limits) { backend_->graph_stable(limits); }

void Context::graph_stable(const std::vector<const Plan*>& plans, double headroom) {
  if (plans.empty()) fail(ErrorCategory::InvalidArgument, "graph_stable: give at least one plan");
  if (!(headroom >= 1.0)) fail(ErrorCategory::InvalidArgument, "graph_stable: headroom {} must be >= 1", headroom);
  cuda::WorkspaceLimits limits;
  for (const Plan* p : plans) {
    if (p == nullptr) fail(ErrorCategory::InvalidArgument, "graph_stable: a plan is null");
    limits.include(cuda::WorkspaceLimits::of(*p));
  }
  backend_->graph_stable(limits.with_headroom(headroom));
}

bool Context::is_graph_stable() const noexcept { return backend_ && backend_->graph_stable(); }

}  // namespace treeattn

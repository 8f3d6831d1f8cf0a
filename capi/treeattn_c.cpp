// The C API (treeattn/treeattn.h, treeattn/treeattn_vulkan.h): opaque handles
// over the C++ objects, every exception turned into a status and the calling
// thread's message.

#include "treeattn/treeattn.h"

#include <fmt/format.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <new>
#include <string>

#include "treeattn/backend.hpp"
#include "treeattn/error.hpp"
#include "treeattn/planner.hpp"
#include "treeattn/tree.hpp"
#if TREEATTN_HAS_CUDA
#include "treeattn/cuda.hpp"
#endif
#if TREEATTN_HAS_VULKAN
#include "../backends/vulkan/workspace_state.hpp"
#include "treeattn/treeattn_vulkan.h"
#include "treeattn/vulkan.hpp"
#endif

using namespace treeattn;

struct treeattn_tree {
  Tree tree;
};

struct treeattn_plan {
  Plan plan;
  std::uint64_t id;  // which plan a device workspace holds
};

struct treeattn_context {
  BackendKind kind = BackendKind::cpu;
  BackendOptions options;
  std::unique_ptr<Backend> backend;  // treeattn_run (not on an application's Vulkan device)
  std::uint64_t uploaded = 0;        // the plan on the device path's workspace
#if TREEATTN_HAS_CUDA
  std::unique_ptr<cuda::Context> cuda;
  std::unique_ptr<cuda::Workspace> cuda_workspace;
#endif
#if TREEATTN_HAS_VULKAN
  std::unique_ptr<vulkan::Context> vulkan;  // on the application's device
  std::unique_ptr<vulkan::Workspace> vulkan_workspace;
  DType vulkan_inputs = DType::f16;
#endif
};

namespace {

thread_local std::string g_last_error;
std::atomic<std::uint64_t> g_next_plan_id{1};

treeattn_status fail(treeattn_status status, std::string message) {
  g_last_error = std::move(message);
  return status;
}

treeattn_status status_of(ErrorCategory category) {
  switch (category) {
    case ErrorCategory::InvalidTree: return TREEATTN_ERROR_INVALID_TREE;
    case ErrorCategory::InvalidArgument: return TREEATTN_ERROR_INVALID_ARGUMENT;
    case ErrorCategory::InvalidPlan: return TREEATTN_ERROR_INVALID_PLAN;
    case ErrorCategory::Io: return TREEATTN_ERROR_IO;
    case ErrorCategory::Backend: return TREEATTN_ERROR_BACKEND;
  }
  return TREEATTN_ERROR_INTERNAL;
}

// Runs `body`, turning whatever it throws into a status and a message.
template <typename Body>
treeattn_status guarded(Body&& body) {
  try {
    body();
    g_last_error.clear();
    return TREEATTN_OK;
  } catch (const Error& e) {
    return fail(status_of(e.category()), e.what());
  } catch (const std::bad_alloc&) {
    return fail(TREEATTN_ERROR_OUT_OF_MEMORY, "out of host memory");
  } catch (const std::exception& e) {
    return fail(TREEATTN_ERROR_INTERNAL, e.what());
  } catch (...) {
    return fail(TREEATTN_ERROR_INTERNAL, "unknown exception");
  }
}

void require(const void* pointer, const char* what) {
  if (pointer == nullptr) throw Error(ErrorCategory::InvalidArgument, fmt::format("{} is NULL", what));
}

// An options struct from a caller that may be older (smaller) than this
// library: the fields it has, defaults for the rest.
template <typename Options>
Options read_options(const Options* given, void (*init)(Options*), const char* what) {
  Options o;
  init(&o);
  if (given == nullptr) return o;
  if (given->struct_size < sizeof(size_t) || given->struct_size > sizeof(Options)) {
    throw Error(ErrorCategory::InvalidArgument,
                fmt::format("{}.struct_size is {}: set it with {}_init (this library's is {})", what, given->struct_size,
                            what, sizeof(Options)));
  }
  std::memcpy(&o, given, given->struct_size);
  o.struct_size = sizeof(Options);
  return o;
}

DType dtype_of(treeattn_dtype d, const char* tensor) {
  switch (d) {
    case TREEATTN_DTYPE_F16: return DType::f16;
    case TREEATTN_DTYPE_BF16: return DType::bf16;
    case TREEATTN_DTYPE_F32: return DType::f32;
  }
  throw Error(ErrorCategory::InvalidArgument, fmt::format("{}: unknown dtype {}", tensor, int(d)));
}

// A C tensor as a TensorRef: dense, or (Q and O) rows `strides[0]` apart.
TensorRef tensor_of(const treeattn_tensor* t, const char* name) {
  TensorRef r;
  if (t == nullptr) return r;
  if (t->ndim < 1 || t->ndim > 4) {
    throw Error(ErrorCategory::InvalidArgument, fmt::format("{}: ndim is {}, expected 1 to 4", name, t->ndim));
  }
  r.data = t->data;
  r.dtype = dtype_of(t->dtype, name);
  r.shape.assign(t->shape, t->shape + t->ndim);
  bool all_zero = true;
  for (int d = 0; d < t->ndim; ++d) all_zero = all_zero && t->strides[d] == 0;
  if (!all_zero) {
    std::int64_t dense = 1;
    for (int d = t->ndim - 1; d >= 1; --d) {
      if (t->strides[d] != dense) {
        throw Error(ErrorCategory::InvalidArgument,
                    fmt::format("{}: strides[{}] is {}, expected {} (only the first dimension may be strided)", name, d,
                                t->strides[d], dense));
      }
      dense *= t->shape[d];
    }
    r.row_stride = t->strides[0];
  }
  return r;
}

AttentionArgs args_of(const treeattn_tensor* q, const treeattn_tensor* k, const treeattn_tensor* v,
                      const treeattn_tensor* o, const treeattn_tensor* lse) {
  require(q, "q");
  require(k, "k");
  require(v, "v");
  require(o, "o");
  return AttentionArgs{tensor_of(q, "q"), tensor_of(k, "k"), tensor_of(v, "v"), tensor_of(o, "o"), tensor_of(lse, "lse")};
}

BackendOptions backend_options(const treeattn_context_options& o) {
  BackendOptions b;
  b.device = o.device;
  b.threads = o.threads;
  b.vk_variant = o.vulkan_variant != nullptr ? o.vulkan_variant : "auto";
  b.verbose = o.verbose != 0;
  if (o.log != nullptr) {
    b.log = [log = o.log, user = o.log_user_data](LogLevel level, const std::string& message) {
      log(level == LogLevel::warning ? TREEATTN_LOG_WARNING : TREEATTN_LOG_INFO, message.c_str(), user);
    };
  }
  return b;
}

}  // namespace

extern "C" {

const char* treeattn_last_error(void) { return g_last_error.c_str(); }
const char* treeattn_version_string(void) { return TREEATTN_VERSION_STRING; }

treeattn_status treeattn_tree_create(int32_t heads_q, int32_t heads_kv, int32_t head_dim, float scale, treeattn_tree** out) {
  return guarded([&] {
    require(out, "out");
    *out = nullptr;
    if (heads_q <= 0 || heads_kv <= 0 || head_dim <= 0 || heads_q % heads_kv != 0) {
      throw Error(ErrorCategory::InvalidTree,
                  fmt::format("heads_q {}, heads_kv {}, head_dim {}: each must be positive and heads_q a multiple of heads_kv",
                              heads_q, heads_kv, head_dim));
    }
    if (!(scale >= 0.0f) || std::isinf(scale)) {
      throw Error(ErrorCategory::InvalidTree, fmt::format("scale {} must be finite and >= 0 (0: 1/sqrt(head_dim))", scale));
    }
    *out = new treeattn_tree{Tree(HeadConfig{heads_q, heads_kv, head_dim, scale})};
  });
}

treeattn_status treeattn_tree_add_node(treeattn_tree* tree, int64_t id, int64_t parent, const int64_t* slots, int64_t count) {
  return guarded([&] {
    require(tree, "tree");
    if (count < 0) throw Error(ErrorCategory::InvalidTree, fmt::format("node {}: count {} is negative", id, count));
    if (count > 0) require(slots, "slots");
    tree->tree.add_node(id, parent, std::vector<std::int64_t>(slots, slots + count));
  });
}

treeattn_status treeattn_tree_add_node_range(treeattn_tree* tree, int64_t id, int64_t parent, int64_t first_slot,
                                             int64_t count) {
  return guarded([&] {
    require(tree, "tree");
    tree->tree.add_node_range(id, parent, first_slot, count);
  });
}

treeattn_status treeattn_tree_add_node_pages(treeattn_tree* tree, int64_t id, int64_t parent, const int64_t* pages,
                                            int64_t page_count, int32_t page_size, int32_t last_page_tokens) {
  return guarded([&] {
    require(tree, "tree");
    if (page_count < 0) throw Error(ErrorCategory::InvalidTree, fmt::format("node {}: page_count {} is negative", id, page_count));
    if (page_count > 0) require(pages, "pages");
    tree->tree.add_node_pages(id, parent, std::vector<std::int64_t>(pages, pages + page_count), page_size, last_page_tokens);
  });
}

treeattn_status treeattn_tree_add_query(treeattn_tree* tree, int64_t node, int64_t upto) {
  return guarded([&] {
    require(tree, "tree");
    tree->tree.add_query(node, upto < 0 ? kWholeNode : upto);
  });
}

void treeattn_tree_destroy(treeattn_tree* tree) { delete tree; }

void treeattn_context_options_init(treeattn_context_options* o) {
  if (o == nullptr) return;
  *o = treeattn_context_options{};
  o->struct_size = sizeof(*o);
  o->backend = TREEATTN_BACKEND_AUTO;
  o->device = -1;
}

treeattn_status treeattn_context_create(const treeattn_context_options* given, treeattn_context** out) {
  return guarded([&] {
    require(out, "out");
    *out = nullptr;
    const treeattn_context_options o = read_options(given, treeattn_context_options_init, "treeattn_context_options");
    auto context = std::make_unique<treeattn_context>();
    context->options = backend_options(o);
    switch (o.backend) {
      case TREEATTN_BACKEND_AUTO: context->kind = BackendKind::automatic; break;
      case TREEATTN_BACKEND_CPU: context->kind = BackendKind::cpu; break;
      case TREEATTN_BACKEND_VULKAN: context->kind = BackendKind::vulkan; break;
      case TREEATTN_BACKEND_CUDA: context->kind = BackendKind::cuda; break;
      default: throw Error(ErrorCategory::InvalidArgument, fmt::format("unknown backend {}", int(o.backend)));
    }
    context->backend = make_backend(context->kind, context->options);
    context->kind = parse_backend(context->backend->name());
    *out = context.release();
  });
}

const char* treeattn_context_backend(const treeattn_context* context) {
  return context == nullptr ? "" : to_string(context->kind);
}

void treeattn_context_destroy(treeattn_context* context) { delete context; }

void treeattn_plan_options_init(treeattn_plan_options* o) {
  if (o == nullptr) return;
  *o = treeattn_plan_options{};
  o->struct_size = sizeof(*o);
  o->strategy = TREEATTN_STRATEGY_FLATTEN;
}

treeattn_status treeattn_plan_create(treeattn_context* context, const treeattn_tree* tree, const treeattn_plan_options* given,
                                     treeattn_plan** out) {
  return guarded([&] {
    require(out, "out");
    *out = nullptr;
    require(context, "context");
    require(tree, "tree");
    const treeattn_plan_options o = read_options(given, treeattn_plan_options_init, "treeattn_plan_options");
    PlanOptions options;
    if (o.strategy < TREEATTN_STRATEGY_FLATTEN || o.strategy > TREEATTN_STRATEGY_GREEDY) {
      throw Error(ErrorCategory::InvalidArgument, fmt::format("unknown strategy {}", int(o.strategy)));
    }
    options.strategy = all_strategies()[std::size_t(o.strategy)];
    if (o.block_tokens < 0) {
      throw Error(ErrorCategory::InvalidArgument, fmt::format("block_tokens {} is negative (0: auto)", o.block_tokens));
    }
    options.block_tokens = o.block_tokens == 0 ? kAutoBlockTokens : o.block_tokens;
#if TREEATTN_HAS_VULKAN
    options.cost = context->vulkan ? context->vulkan->cost_model() : context->backend->cost_model();
#else
    options.cost = context->backend->cost_model();
#endif
    *out = new treeattn_plan{plan(tree->tree, options), g_next_plan_id++};
  });
}

int32_t treeattn_plan_num_queries(const treeattn_plan* plan) { return plan == nullptr ? 0 : plan->plan.num_queries; }

void treeattn_plan_destroy(treeattn_plan* plan) { delete plan; }

treeattn_status treeattn_run(treeattn_context* context, const treeattn_plan* plan, const treeattn_tensor* q,
                             const treeattn_tensor* k, const treeattn_tensor* v, const treeattn_tensor* o,
                             const treeattn_tensor* lse) {
  return guarded([&] {
    require(context, "context");
    require(plan, "plan");
    if (!context->backend) {
      throw Error(ErrorCategory::InvalidArgument,
                  "treeattn_run: a context on the application's Vulkan device runs treeattn_enqueue only");
    }
    context->backend->run(plan->plan, args_of(q, k, v, o, lse));
  });
}

treeattn_status treeattn_enqueue(treeattn_context* context, const treeattn_plan* plan, const treeattn_tensor* q,
                                 const treeattn_tensor* k, const treeattn_tensor* v, const treeattn_tensor* o,
                                 const treeattn_tensor* lse, void* stream) {
  return guarded([&] {
    require(context, "context");
    require(plan, "plan");
    const AttentionArgs args = args_of(q, k, v, o, lse);
#if TREEATTN_HAS_VULKAN
    if (context->vulkan) {
      require(stream, "stream (the VkCommandBuffer)");
      auto commands = static_cast<VkCommandBuffer>(stream);
      if (!context->vulkan_workspace || context->vulkan_inputs != args.q.dtype) {
        context->vulkan_workspace = std::make_unique<vulkan::Workspace>(*context->vulkan, args.q.dtype);
        context->vulkan_inputs = args.q.dtype;
        context->uploaded = 0;
      }
      if (context->uploaded != plan->id) {
        context->vulkan_workspace->upload(plan->plan, commands);
        context->uploaded = plan->id;
      }
      context->vulkan_workspace->state().record_addresses(commands, args);
      return;
    }
#endif
#if TREEATTN_HAS_CUDA
    if (context->kind == BackendKind::cuda) {
      if (!context->cuda) {
        context->cuda = std::make_unique<cuda::Context>(context->options.device >= 0 ? context->options.device : 0);
        context->cuda_workspace = std::make_unique<cuda::Workspace>(*context->cuda);
      }
      auto cuda_stream = static_cast<cuda::Stream>(stream);
      if (context->uploaded != plan->id) {
        context->cuda_workspace->upload(plan->plan, cuda_stream);
        context->uploaded = plan->id;
      }
      context->cuda_workspace->enqueue(args, cuda_stream);
      return;
    }
#endif
    throw Error(ErrorCategory::InvalidArgument,
                fmt::format("treeattn_enqueue needs a CUDA context or one on the application's Vulkan device "
                            "(treeattn_context_create_vulkan); this context runs the {} backend: use treeattn_run",
                            to_string(context->kind)));
  });
}

#if TREEATTN_HAS_VULKAN
treeattn_status treeattn_context_create_vulkan(const treeattn_vulkan_device* device, const treeattn_context_options* given,
                                               treeattn_context** out) {
  return guarded([&] {
    require(out, "out");
    *out = nullptr;
    require(device, "device");
    if (device->struct_size < sizeof(treeattn_vulkan_device)) {
      throw Error(ErrorCategory::InvalidArgument,
                  fmt::format("treeattn_vulkan_device.struct_size is {}, expected {}", device->struct_size,
                              sizeof(treeattn_vulkan_device)));
    }
    const treeattn_context_options o = read_options(given, treeattn_context_options_init, "treeattn_context_options");
    auto context = std::make_unique<treeattn_context>();
    context->kind = BackendKind::vulkan;
    context->options = backend_options(o);
    vulkan::ContextOptions options;
    options.variant = context->options.vk_variant;
    options.verbose = context->options.verbose;
    options.log = context->options.log;
    vulkan::ExternalDevice external;
    external.instance = device->instance;
    external.physical_device = device->physical_device;
    external.device = device->device;
    external.queue_family = device->queue_family;
    external.queue = device->queue;
    external.get_instance_proc_addr = device->get_instance_proc_addr;
    external.enabled_features = device->enabled_features;
    external.enabled_core_features = device->enabled_core_features;
    external.enabled_extensions = device->enabled_extensions;
    external.enabled_extension_count = device->enabled_extension_count;
    context->vulkan = std::make_unique<vulkan::Context>(external, options);
    *out = context.release();
  });
}
#endif

}  // extern "C"

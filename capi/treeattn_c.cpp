// The C API (treeattn/treeattn.h, treeattn/treeattn_vulkan.h): opaque handles
// over the C++ objects (a context is a treeattn::Context, a planner an
// IncrementalPlanner), every exception turned into a status and the calling
// thread's message.

#include "treeattn/treeattn.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "treeattn/context.hpp"
#include "treeattn/error.hpp"
#include "treeattn/incremental_planner.hpp"
#include "treeattn/planner.hpp"
#include "treeattn/tree.hpp"
#if TREEATTN_HAS_VULKAN
#include "treeattn/treeattn_vulkan.h"
#include "treeattn/vulkan.hpp"
#endif

using namespace treeattn;

struct treeattn_tree {
  Tree tree;
};

// A plan the caller owns (treeattn_plan_create), or a planner's (its `owned` empty).
struct treeattn_plan {
  Plan owned;
  const Plan* plan = &owned;
};

struct treeattn_context {
  Context context;
};

struct treeattn_planner {
  IncrementalPlanner planner;
  treeattn_plan current{Plan{}, nullptr};  // the last update's plan, which the planner owns
};

namespace {

thread_local std::string g_last_error;

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
    case ErrorCategory::OutOfMemory: return TREEATTN_ERROR_OUT_OF_MEMORY;
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

// Where each field of an options struct ends: the sizes an older caller's
// struct may have (a size between two would copy part of a field: the low
// bytes of threads = -1 are 65535 threads).
std::vector<std::size_t> field_ends(const treeattn_plan_options*) {
  using O = treeattn_plan_options;
  return {sizeof(O::struct_size),
          offsetof(O, strategy) + sizeof(O::strategy),
          offsetof(O, block_tokens) + sizeof(O::block_tokens),
          offsetof(O, bitwise_updates) + sizeof(O::bitwise_updates),
          offsetof(O, window) + sizeof(O::window),
          sizeof(O)};
}
std::vector<std::size_t> field_ends(const treeattn_context_options*) {
  using O = treeattn_context_options;
  return {sizeof(O::struct_size),
          offsetof(O, backend) + sizeof(O::backend),
          offsetof(O, device) + sizeof(O::device),
          offsetof(O, threads) + sizeof(O::threads),
          offsetof(O, vulkan_variant) + sizeof(O::vulkan_variant),
          offsetof(O, verbose) + sizeof(O::verbose),
          offsetof(O, log) + sizeof(O::log),
          offsetof(O, log_user_data) + sizeof(O::log_user_data),
          sizeof(O)};
}

std::vector<std::size_t> field_ends(const treeattn_tree_options*) {
  using O = treeattn_tree_options;
  return {sizeof(O::struct_size),
          offsetof(O, heads_q) + sizeof(O::heads_q),
          offsetof(O, heads_kv) + sizeof(O::heads_kv),
          offsetof(O, head_dim) + sizeof(O::head_dim),
          offsetof(O, head_dim_v) + sizeof(O::head_dim_v),
          sizeof(O)};
}
std::vector<std::size_t> field_ends(const treeattn_attention_options*) {
  using O = treeattn_attention_options;
  return {sizeof(O::struct_size),
          offsetof(O, logit_softcap) + sizeof(O::logit_softcap),
          offsetof(O, k_scale) + sizeof(O::k_scale),
          offsetof(O, v_scale) + sizeof(O::v_scale),
          offsetof(O, sinks) + sizeof(O::sinks),
          offsetof(O, k_scales) + sizeof(O::k_scales),
          sizeof(O)};
}

// An options struct from a caller that may be older (smaller) than this
// library: the fields it has, defaults for the rest.
template <typename Options>
Options read_options(const Options* given, void (*init)(Options*), const char* what) {
  Options o;
  init(&o);
  if (given == nullptr) return o;
  const std::vector<std::size_t> ends = field_ends(given);
  if (std::find(ends.begin(), ends.end(), given->struct_size) == ends.end()) {
    throw Error(ErrorCategory::InvalidArgument,
                fmt::format("{}.struct_size is {}: set it with {}_init (this library's is {}; a smaller one must end "
                            "at a field's end)",
                            what, given->struct_size, what, sizeof(Options)));
  }
  std::memcpy(&o, given, given->struct_size);
  o.struct_size = sizeof(Options);
  return o;
}

// A C enum field as the integer the caller stored: C may put any int there,
// and loading a value outside a C++ enum's range as that enum is undefined.
template <typename Enum>
std::int64_t value_of(const Enum& field) {
  static_assert(sizeof(Enum) == sizeof(std::int32_t), "C enums of this API are int-sized");
  std::int32_t raw = 0;
  std::memcpy(&raw, &field, sizeof raw);
  return raw;
}

DType dtype_of(const treeattn_dtype& field, const char* tensor) {
  switch (value_of(field)) {
    case TREEATTN_DTYPE_F16: return DType::f16;
    case TREEATTN_DTYPE_BF16: return DType::bf16;
    case TREEATTN_DTYPE_F32: return DType::f32;
    case TREEATTN_DTYPE_FP8_E4M3: return DType::fp8_e4m3;
    case TREEATTN_DTYPE_FP8_E5M2: return DType::fp8_e5m2;
  }
  throw Error(ErrorCategory::InvalidArgument,
              fmt::format("{}: unknown dtype {} (TREEATTN_DTYPE_F16, _BF16, _F32, _FP8_E4M3 or _FP8_E5M2)", tensor,
                          value_of(field)));
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
  for (int d = 0; d < t->ndim; ++d) {
    if (t->shape[d] < 0) {
      throw Error(ErrorCategory::InvalidArgument, fmt::format("{}: shape[{}] is {}, expected >= 0", name, d, t->shape[d]));
    }
  }
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
      if (__builtin_mul_overflow(dense, t->shape[d], &dense)) {
        throw Error(ErrorCategory::InvalidArgument,
                    fmt::format("{}: its rows hold more elements than an int64 counts (shape[{}] = {})", name, d,
                                t->shape[d]));
      }
    }
    r.row_stride = t->strides[0];
  }
  return r;
}

// An options tensor: none where the pointer is NULL; given, it needs its data
// (the C++ options take null data for "none", which would ignore it silently).
TensorRef option_tensor_of(const treeattn_tensor* t, const char* name) {
  if (t != nullptr && t->data == nullptr) {
    throw Error(ErrorCategory::InvalidArgument, fmt::format("{} has no data (pass NULL for none)", name));
  }
  return tensor_of(t, name);
}

// A tree of these heads, checked as far as the C layer can (the planner
// checks the head dims against those the kernels have).
Tree tree_of(const HeadConfig& h) {
  if (h.heads_q <= 0 || h.heads_kv <= 0 || h.head_dim <= 0 || h.heads_q % h.heads_kv != 0) {
    throw Error(ErrorCategory::InvalidTree,
                fmt::format("heads_q {}, heads_kv {}, head_dim {}: each must be positive and heads_q a multiple of heads_kv",
                            h.heads_q, h.heads_kv, h.head_dim));
  }
  if (h.head_dim_v < 0) {
    throw Error(ErrorCategory::InvalidTree, fmt::format("head_dim_v {} must be positive (0: head_dim)", h.head_dim_v));
  }
  if (!(h.scale >= 0.0f) || std::isinf(h.scale)) {
    throw Error(ErrorCategory::InvalidTree, fmt::format("scale {} must be finite and >= 0 (0: 1/sqrt(head_dim))", h.scale));
  }
  return Tree(h);
}

AttentionArgs args_of(const treeattn_tensor* q, const treeattn_tensor* k, const treeattn_tensor* v,
                      const treeattn_tensor* o, const treeattn_tensor* lse, const treeattn_attention_options* given) {
  require(q, "q");
  require(k, "k");
  require(v, "v");
  require(o, "o");
  AttentionArgs args{tensor_of(q, "q"), tensor_of(k, "k"), tensor_of(v, "v"), tensor_of(o, "o"), tensor_of(lse, "lse")};
  if (given == nullptr) return args;
  const treeattn_attention_options c =
      read_options(given, treeattn_attention_options_init, "treeattn_attention_options");
  args.options.logit_softcap = c.logit_softcap;
  args.options.k_scale = c.k_scale;
  args.options.v_scale = c.v_scale;
  args.options.sinks = option_tensor_of(c.sinks, "sinks");
  args.options.k_scales = option_tensor_of(c.k_scales, "k_scales");
  args.options.v_scales = option_tensor_of(c.v_scales, "v_scales");
  return args;
}

ContextOptions context_options(const treeattn_context_options& o) {
  ContextOptions c;
  switch (value_of(o.backend)) {
    case TREEATTN_BACKEND_AUTO: c.backend = BackendKind::automatic; break;
    case TREEATTN_BACKEND_CPU: c.backend = BackendKind::cpu; break;
    case TREEATTN_BACKEND_VULKAN: c.backend = BackendKind::vulkan; break;
    case TREEATTN_BACKEND_CUDA: c.backend = BackendKind::cuda; break;
    default:
      throw Error(ErrorCategory::InvalidArgument,
                  fmt::format("treeattn_context_options.backend is {}: expected TREEATTN_BACKEND_AUTO, _CPU, _VULKAN or _CUDA",
                              value_of(o.backend)));
  }
  c.device = o.device;
  c.cpu.threads = o.threads;
  c.vulkan.variant = o.vulkan_variant != nullptr ? o.vulkan_variant : "auto";
  c.verbose = o.verbose != 0;
  if (o.model_cache_path != nullptr) c.model_cache_path = o.model_cache_path;
  if (o.log != nullptr) {
    c.log = [log = o.log, user = o.log_user_data](LogLevel level, const std::string& message) {
      log(level == LogLevel::warning ? TREEATTN_LOG_WARNING : TREEATTN_LOG_INFO, message.c_str(), user);
    };
  }
  return c;
}

PlanOptions plan_options(const treeattn_plan_options* given) {
  const treeattn_plan_options o = read_options(given, treeattn_plan_options_init, "treeattn_plan_options");
  const std::int64_t strategy = value_of(o.strategy);
  if (strategy < TREEATTN_STRATEGY_FLATTEN || strategy > TREEATTN_STRATEGY_GREEDY) {
    throw Error(ErrorCategory::InvalidArgument,
                fmt::format("treeattn_plan_options.strategy is {}: expected TREEATTN_STRATEGY_FLATTEN (0) to _GREEDY (5)",
                            strategy));
  }
  PlanOptions options;
  options.strategy = all_strategies()[std::size_t(strategy)];
  if (o.block_tokens < 0) {
    throw Error(ErrorCategory::InvalidArgument, fmt::format("block_tokens {} is negative (0: auto)", o.block_tokens));
  }
  options.block_tokens = o.block_tokens == 0 ? kAutoBlockTokens : o.block_tokens;
  options.window = o.window;  // a negative one is refused by the planner, by name
  return options;
}

IncrementalOptions incremental_options(const treeattn_plan_options* given) {
  const treeattn_plan_options o = read_options(given, treeattn_plan_options_init, "treeattn_plan_options");
  IncrementalOptions incremental;
  incremental.hold_flatten_blocks = o.bitwise_updates == 0;
  incremental.hold_greedy_groups = o.bitwise_updates == 0;
  return incremental;
}

std::vector<std::int64_t> list_of(const std::int64_t* values, std::int64_t count, const char* what, std::int64_t node) {
  if (count < 0) throw Error(ErrorCategory::InvalidTree, fmt::format("node {}: {} count {} is negative", node, what, count));
  if (count > 0) require(values, what);
  return std::vector<std::int64_t>(values, values + count);
}

IncrementalPlanner& planner_of(treeattn_planner* p) {
  require(p, "planner");
  return p->planner;
}

const Plan& plan_of(const treeattn_plan* plan) {
  require(plan, "plan");
  if (plan->plan == nullptr) {
    throw Error(ErrorCategory::InvalidPlan, "the planner has not made a plan yet (treeattn_planner_update)");
  }
  return *plan->plan;
}

}  // namespace

extern "C" {

const char* treeattn_last_error(void) { return g_last_error.c_str(); }
const char* treeattn_version_string(void) { return TREEATTN_VERSION_STRING; }

treeattn_status treeattn_tree_create(int32_t heads_q, int32_t heads_kv, int32_t head_dim, float scale, treeattn_tree** out) {
  return guarded([&] {
    require(out, "out");
    *out = nullptr;
    *out = new treeattn_tree{tree_of(HeadConfig{heads_q, heads_kv, head_dim, scale})};
  });
}

void treeattn_tree_options_init(treeattn_tree_options* o) {
  if (o == nullptr) return;
  *o = treeattn_tree_options{};
  o->struct_size = sizeof(*o);
}

treeattn_status treeattn_tree_create_with(const treeattn_tree_options* given, treeattn_tree** out) {
  return guarded([&] {
    require(out, "out");
    *out = nullptr;
    require(given, "options");
    const treeattn_tree_options o = read_options(given, treeattn_tree_options_init, "treeattn_tree_options");
    *out = new treeattn_tree{tree_of(HeadConfig{o.heads_q, o.heads_kv, o.head_dim, o.scale, o.head_dim_v})};
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
    *out = new treeattn_context{Context(context_options(o))};
  });
}

const char* treeattn_context_backend(const treeattn_context* context) {
  return context == nullptr ? "" : to_string(context->context.backend());
}

void treeattn_context_destroy(treeattn_context* context) { delete context; }

treeattn_status treeattn_context_graph_stable(treeattn_context* context, const treeattn_plan* const* plans, int64_t count,
                                              double headroom) {
  return guarded([&] {
    require(context, "context");
    if (count <= 0) throw Error(ErrorCategory::InvalidArgument, fmt::format("graph_stable: count is {}, give at least one plan", count));
    require(plans, "plans");
    std::vector<const Plan*> list;
    for (int64_t i = 0; i < count; ++i) {
      if (plans[i] == nullptr) throw Error(ErrorCategory::InvalidArgument, fmt::format("graph_stable: plans[{}] is NULL", i));
      list.push_back(&plan_of(plans[i]));
    }
    context->context.graph_stable(list, headroom);
  });
}

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
    auto made = std::make_unique<treeattn_plan>();
    made->owned = context->context.plan(tree->tree, plan_options(given));
    *out = made.release();
  });
}

int32_t treeattn_plan_num_queries(const treeattn_plan* plan) {
  return plan == nullptr || plan->plan == nullptr ? 0 : plan->plan->num_queries;
}

void treeattn_plan_destroy(treeattn_plan* plan) {
  if (plan != nullptr && plan->plan == &plan->owned) delete plan;  // a planner's plan stays the planner's
}

treeattn_status treeattn_planner_create(treeattn_context* context, const treeattn_tree* initial,
                                        const treeattn_plan_options* options, treeattn_planner** out) {
  return guarded([&] {
    require(out, "out");
    *out = nullptr;
    require(context, "context");
    require(initial, "initial (a tree: its heads, and its nodes and queries if any)");
    *out = new treeattn_planner{context->context.planner(initial->tree, plan_options(options), incremental_options(options))};
  });
}

treeattn_status treeattn_planner_add_node(treeattn_planner* p, int64_t id, int64_t parent, const int64_t* slots, int64_t count) {
  return guarded([&] { planner_of(p).add_node(id, parent, list_of(slots, count, "slots", id)); });
}

treeattn_status treeattn_planner_add_node_range(treeattn_planner* p, int64_t id, int64_t parent, int64_t first_slot,
                                                int64_t count) {
  return guarded([&] { planner_of(p).add_node_range(id, parent, first_slot, count); });
}

treeattn_status treeattn_planner_add_node_pages(treeattn_planner* p, int64_t id, int64_t parent, const int64_t* pages,
                                                int64_t page_count, int32_t page_size, int32_t last_page_tokens) {
  return guarded([&] {
    planner_of(p).add_node_pages(id, parent, list_of(pages, page_count, "pages", id), page_size, last_page_tokens);
  });
}

treeattn_status treeattn_planner_append_range(treeattn_planner* p, int64_t id, int64_t first_slot, int64_t count) {
  return guarded([&] { planner_of(p).append_range(id, first_slot, count); });
}

treeattn_status treeattn_planner_append_pages(treeattn_planner* p, int64_t id, int64_t count, const int64_t* new_pages,
                                              int64_t new_page_count) {
  return guarded([&] { planner_of(p).append_pages(id, count, list_of(new_pages, new_page_count, "new_pages", id)); });
}

treeattn_status treeattn_planner_remove_node(treeattn_planner* p, int64_t id) {
  return guarded([&] { planner_of(p).remove_node(id); });
}

treeattn_status treeattn_planner_set_queries(treeattn_planner* p, const int64_t* nodes, const int64_t* upto, int64_t count) {
  return guarded([&] {
    IncrementalPlanner& planner = planner_of(p);
    if (count < 0) throw Error(ErrorCategory::InvalidTree, fmt::format("set_queries: count {} is negative", count));
    if (count > 0) require(nodes, "nodes");
    std::vector<TreeQuery> queries(static_cast<std::size_t>(count));
    for (int64_t i = 0; i < count; ++i) {
      queries[std::size_t(i)].node = nodes[i];
      queries[std::size_t(i)].upto = upto == nullptr || upto[i] < 0 ? kWholeNode : upto[i];
    }
    planner.set_queries(queries);
  });
}

treeattn_status treeattn_planner_update(treeattn_planner* p, const treeattn_plan** out) {
  return guarded([&] {
    require(out, "out");
    *out = nullptr;
    IncrementalPlanner& planner = planner_of(p);
    p->current.plan = nullptr;  // the last plan is not valid once an update starts
    p->current.plan = &planner.update();
    *out = &p->current;
  });
}

int32_t treeattn_planner_held_layout(const treeattn_planner* p) {
  return p != nullptr && p->planner.last_update().held_layout ? 1 : 0;
}

void treeattn_planner_destroy(treeattn_planner* p) { delete p; }

treeattn_status treeattn_run(treeattn_context* context, const treeattn_plan* plan, const treeattn_tensor* q,
                             const treeattn_tensor* k, const treeattn_tensor* v, const treeattn_tensor* o,
                             const treeattn_tensor* lse) {
  return treeattn_run_with(context, plan, q, k, v, o, lse, nullptr);
}

void treeattn_attention_options_init(treeattn_attention_options* o) {
  if (o == nullptr) return;
  *o = treeattn_attention_options{};
  o->struct_size = sizeof(*o);
  o->k_scale = 1.0f;
  o->v_scale = 1.0f;
}

treeattn_status treeattn_run_with(treeattn_context* context, const treeattn_plan* plan, const treeattn_tensor* q,
                                  const treeattn_tensor* k, const treeattn_tensor* v, const treeattn_tensor* o,
                                  const treeattn_tensor* lse, const treeattn_attention_options* options) {
  return guarded([&] {
    require(context, "context");
    const Plan& p = plan_of(plan);
    context->context.run(p, args_of(q, k, v, o, lse, options));
  });
}

treeattn_status treeattn_upload(treeattn_context* context, const treeattn_plan* plan, void* stream) {
  return guarded([&] {
    require(context, "context");
    context->context.upload(plan_of(plan), static_cast<CUstream_st*>(stream));
  });
}

treeattn_status treeattn_enqueue(treeattn_context* context, const treeattn_plan* plan, const treeattn_tensor* q,
                                 const treeattn_tensor* k, const treeattn_tensor* v, const treeattn_tensor* o,
                                 const treeattn_tensor* lse, void* stream) {
  return treeattn_enqueue_with(context, plan, q, k, v, o, lse, nullptr, stream);
}

treeattn_status treeattn_enqueue_with(treeattn_context* context, const treeattn_plan* plan, const treeattn_tensor* q,
                                      const treeattn_tensor* k, const treeattn_tensor* v, const treeattn_tensor* o,
                                      const treeattn_tensor* lse, const treeattn_attention_options* options,
                                      void* stream) {
  return guarded([&] {
    require(context, "context");
    const Plan& p = plan_of(plan);
    const AttentionArgs args = args_of(q, k, v, o, lse, options);
    switch (context->context.backend()) {
      case BackendKind::cuda: context->context.enqueue(p, args, static_cast<CUstream_st*>(stream)); return;
      case BackendKind::vulkan:
        require(stream, "stream (the VkCommandBuffer)");
        context->context.record(p, args, static_cast<VkCommandBuffer_T*>(stream));
        return;
      default:
        throw Error(ErrorCategory::InvalidArgument,
                    fmt::format("treeattn_enqueue needs a CUDA context or one on the application's Vulkan device "
                                "(treeattn_context_create_vulkan); this context runs the {} backend: use treeattn_run",
                                to_string(context->context.backend())));
    }
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
    *out = new treeattn_context{Context(external, context_options(o))};
  });
}
#endif

}  // extern "C"

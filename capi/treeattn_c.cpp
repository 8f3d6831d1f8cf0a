// The C API (treeattn/treeattn.h, treeattn/treeattn_vulkan.h): opaque handles
// over the C++ objects (a context is a treeattn::Context, a planner an
// IncrementalPlanner), every exception turned into a status and the calling
// thread's message.

#include "treeattn/treeattn.h"

#include <fmt/format.h>

#include <cstddef>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "treeattn/context.hpp"
#include "treeattn/error.hpp"
#include "treeattn/incremental_planner.hpp"
#include "treeattn/planner.hpp"
#include "treeattn/tree.hpp"
#include "c_arguments.hpp"
#if TREEATTN_HAS_VULKAN
#include "treeattn/treeattn_vulkan.h"
#include "treeattn/vulkan.hpp"
#endif

using namespace treeattn;
using namespace treeattn::capi;

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

// Each *_init is defined with its name in parentheses, which treeattn.h's
// function-like macro of the same name does not expand: the exported function
// fills this header's struct, the macro calls *_init_sized with the caller's sizeof.
void (treeattn_tree_options_init)(treeattn_tree_options* o) {
  if (o == nullptr) return;
  *o = treeattn_tree_options{};
  o->struct_size = sizeof(*o);
}
void treeattn_tree_options_init_sized(treeattn_tree_options* o, size_t size) { init_sized(o, size, (treeattn_tree_options_init)); }

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

void (treeattn_context_options_init)(treeattn_context_options* o) {
  if (o == nullptr) return;
  *o = treeattn_context_options{};
  o->struct_size = sizeof(*o);
  o->backend = TREEATTN_BACKEND_AUTO;
  o->device = -1;
}
void treeattn_context_options_init_sized(treeattn_context_options* o, size_t size) { init_sized(o, size, (treeattn_context_options_init)); }

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

void (treeattn_plan_options_init)(treeattn_plan_options* o) {
  if (o == nullptr) return;
  *o = treeattn_plan_options{};
  o->struct_size = sizeof(*o);
  o->strategy = TREEATTN_STRATEGY_FLATTEN;
}
void treeattn_plan_options_init_sized(treeattn_plan_options* o, size_t size) { init_sized(o, size, (treeattn_plan_options_init)); }

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

void (treeattn_attention_options_init)(treeattn_attention_options* o) {
  if (o == nullptr) return;
  *o = treeattn_attention_options{};
  o->struct_size = sizeof(*o);
  o->k_scale = 1.0f;
  o->v_scale = 1.0f;
}
void treeattn_attention_options_init_sized(treeattn_attention_options* o, size_t size) { init_sized(o, size, (treeattn_attention_options_init)); }

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

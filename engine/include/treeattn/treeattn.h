/* treeattn C API: decode-time attention over a tree of KV cache, for any
 * language with a C FFI (C, C#, Rust, Swift, Python ctypes).
 *
 * Opaque handles; every fallible call returns a treeattn_status (TREEATTN_OK
 * is 0) and, on failure, treeattn_last_error() gives the calling thread's
 * message: which node, which tensor, which limit. No exception crosses it.
 * Options structs begin with struct_size: fill them with the *_init function,
 * which sets it, so that fields added later keep old callers working. Each
 * *_init is a macro over the exported *_init_sized(options, size), passing the
 * caller's own sizeof: a library newer than the header a program was compiled
 * against writes only the bytes of the struct the program has. Languages that
 * bind the exported symbols call *_init_sized with their struct's size (or the
 * exported *_init, which fills this header's struct).
 *
 *   treeattn_tree* tree;
 *   treeattn_tree_create(32, 8, 128, 0.0f, &tree);
 *   treeattn_tree_add_node_range(tree, 0, -1, 0, 4000);     // prompt in slots 0..3999
 *   treeattn_tree_add_node_range(tree, 1, 0, 4000, 20);     // a branch
 *   treeattn_tree_add_query(tree, 1, -1);
 *   treeattn_context* ctx;
 *   treeattn_context_create(NULL, &ctx);                     // auto: CUDA, Vulkan, CPU
 *   treeattn_plan* plan;
 *   treeattn_plan_create(ctx, tree, NULL, &plan);            // a whole tree, planned once
 *   treeattn_run(ctx, plan, &q, &k, &v, &o, &lse);           // once per layer (host memory)
 *
 * A decode loop keeps a planner instead, hands it each step's changes and
 * runs the plan it updates (a few per cent of a from-scratch plan):
 *
 *   treeattn_planner* planner;
 *   treeattn_planner_create(ctx, tree, NULL, &planner);      // the tree's heads, nodes and queries
 *   each step:
 *     treeattn_planner_append_range(planner, 1, next_slot, 1); // ..._add_node*, _remove_node, _set_queries
 *     const treeattn_plan* step;
 *     treeattn_planner_update(planner, &step);
 *     treeattn_enqueue(ctx, step, &q, &k, &v, &o, &lse, stream);  // per layer (or treeattn_run)
 *
 * Threads: the last error is per thread. A context serves one thread (or
 * stream) at a time; trees and plans may be read by several threads at once. */
#ifndef TREEATTN_TREEATTN_H
#define TREEATTN_TREEATTN_H

#include <stddef.h>
#include <stdint.h>

#include "treeattn/config.h"

/* The shared library exports these functions and nothing else. On Windows a
 * program that links treeattn.dll defines TREEATTN_USE_DLL (the CMake target
 * treeattn::treeattn_shared does it). */
#if defined(_WIN32)
#if defined(TREEATTN_BUILDING_LIBRARY)
#define TREEATTN_C_API __declspec(dllexport)
#elif defined(TREEATTN_USE_DLL)
#define TREEATTN_C_API __declspec(dllimport)
#else
#define TREEATTN_C_API
#endif
#else
#define TREEATTN_C_API __attribute__((visibility("default")))
#endif

#ifdef __cplusplus
extern "C" {
#endif

typedef enum treeattn_status {
  TREEATTN_OK = 0,
  TREEATTN_ERROR_INVALID_TREE,      /* the tree, its queries or its heads */
  TREEATTN_ERROR_INVALID_ARGUMENT,  /* NULL handles, options, tensors that do not match the plan */
  TREEATTN_ERROR_INVALID_PLAN,      /* a plan that does not fit what it is used with */
  TREEATTN_ERROR_IO,                /* files */
  TREEATTN_ERROR_BACKEND,           /* a backend missing, unavailable or failing (no device, a driver error) */
  TREEATTN_ERROR_OUT_OF_MEMORY,     /* host, device or pinned memory ran out (a driver's allocation failure) */
  TREEATTN_ERROR_INTERNAL
} treeattn_status;

/* FP8_E4M3 is float8_e4m3fn (no infinities), FP8_E5M2 IEEE-like: K and V
 * only, both of one kind, with Q f16 or bf16 (treeattn_attention_options scales them). */
typedef enum treeattn_dtype {
  TREEATTN_DTYPE_F16 = 0,
  TREEATTN_DTYPE_BF16 = 1,
  TREEATTN_DTYPE_F32 = 2,
  TREEATTN_DTYPE_FP8_E4M3 = 3,
  TREEATTN_DTYPE_FP8_E5M2 = 4
} treeattn_dtype;

typedef enum treeattn_backend {
  TREEATTN_BACKEND_AUTO = 0, /* CUDA when a device is there, then a Vulkan GPU, else the CPU */
  TREEATTN_BACKEND_CPU = 1,
  TREEATTN_BACKEND_VULKAN = 2,
  TREEATTN_BACKEND_CUDA = 3
} treeattn_backend;

typedef enum treeattn_strategy {
  TREEATTN_STRATEGY_FLATTEN = 0,    /* DeFT-Flatten (the default) */
  TREEATTN_STRATEGY_NODE = 1,       /* DeFT-Node */
  TREEATTN_STRATEGY_NODE_CHUNK = 2, /* DeFT-Node-Chunk */
  TREEATTN_STRATEGY_SEQUENCE = 3,   /* every query its whole path (the Flash-Decoding baseline) */
  TREEATTN_STRATEGY_CASCADE = 4,    /* one group per tree level */
  TREEATTN_STRATEGY_GREEDY = 5      /* FastTree's cost model */
} treeattn_strategy;

typedef enum treeattn_log_level { TREEATTN_LOG_INFO = 0, TREEATTN_LOG_WARNING = 1 } treeattn_log_level;
/* Where the library's messages go (device and kernel choices at `verbose`,
 * driver validation); it writes nothing to stderr by itself. */
typedef void (*treeattn_log_fn)(treeattn_log_level level, const char* message, void* user_data);

typedef struct treeattn_tree treeattn_tree;
typedef struct treeattn_context treeattn_context;
typedef struct treeattn_plan treeattn_plan;
typedef struct treeattn_planner treeattn_planner;

/* The calling thread's message of its last failed call ("" when none). */
TREEATTN_C_API const char* treeattn_last_error(void);
/* "0.1.0": the library's version (the macros in treeattn/config.h are the headers'). */
TREEATTN_C_API const char* treeattn_version_string(void);

/* --- trees ----------------------------------------------------------------
 * Node ids are any integers but -1, parents given before children or after (a forest
 * is fine: several roots). Slots index rows of K and V. Checked when planned. */
TREEATTN_C_API treeattn_status treeattn_tree_create(int32_t heads_q, int32_t heads_kv, int32_t head_dim,
                                                    float scale /* 0: 1/sqrt(head_dim) */, treeattn_tree** out);
/* The heads of a tree, with what treeattn_tree_create cannot say: V (and O)
 * rows of head_dim_v columns beside Q and K rows of head_dim (192 / 128). */
typedef struct treeattn_tree_options {
  size_t struct_size;
  int32_t heads_q;
  int32_t heads_kv;
  int32_t head_dim;   /* Q and K columns: 64, 96, 128, 256, or 192 with head_dim_v 128 */
  int32_t head_dim_v; /* V and O columns; 0: head_dim */
  float scale;        /* 0: 1/sqrt(head_dim) */
} treeattn_tree_options;
TREEATTN_C_API void treeattn_tree_options_init(treeattn_tree_options* options);
TREEATTN_C_API void treeattn_tree_options_init_sized(treeattn_tree_options* options, size_t size);
#define treeattn_tree_options_init(options) treeattn_tree_options_init_sized((options), sizeof(treeattn_tree_options))
TREEATTN_C_API treeattn_status treeattn_tree_create_with(const treeattn_tree_options* options, treeattn_tree** out);
TREEATTN_C_API treeattn_status treeattn_tree_add_node(treeattn_tree* tree, int64_t id, int64_t parent /* -1: root */,
                                                      const int64_t* slots, int64_t count);
TREEATTN_C_API treeattn_status treeattn_tree_add_node_range(treeattn_tree* tree, int64_t id, int64_t parent,
                                                            int64_t first_slot, int64_t count);
/* A node on pages of a paged KV cache: page p holds slots [p * page_size,
 * (p + 1) * page_size); the node's tokens fill its pages in order, the last one
 * `last_page_tokens` of them (1..page_size; 0 with no pages). Checked per page. */
TREEATTN_C_API treeattn_status treeattn_tree_add_node_pages(treeattn_tree* tree, int64_t id, int64_t parent,
                                                            const int64_t* pages, int64_t page_count, int32_t page_size,
                                                            int32_t last_page_tokens);
/* Query i (in the order added) is row i of Q; it sees its node's ancestors and
 * its node, or only the node's first `upto` tokens. */
TREEATTN_C_API treeattn_status treeattn_tree_add_query(treeattn_tree* tree, int64_t node, int64_t upto /* < 0: whole node */);
TREEATTN_C_API void treeattn_tree_destroy(treeattn_tree* tree);

/* --- contexts: a backend on a device -----------------------------------------
 * A context owns its device's cost model (plans made with it are planned for
 * that device), one workspace and the record of the plan it holds: a plan is
 * uploaded once however many layers run it. */
typedef struct treeattn_context_options {
  size_t struct_size;
  treeattn_backend backend;     /* TREEATTN_BACKEND_AUTO */
  int32_t device;               /* GPU index; -1: the first (CUDA) or the first discrete GPU (Vulkan) */
  int32_t threads;              /* CPU backend threads; 0: one per hardware thread */
  const char* vulkan_variant;   /* "auto" (NULL), "scalar", "coopmat", "coopmat-shared" */
  int32_t verbose;              /* nonzero: device and kernel choices to the log */
  treeattn_log_fn log;          /* NULL: messages are dropped */
  void* log_user_data;
  const char* model_cache_path; /* CUDA and Vulkan: a JSON file keeping the cost models calibrated on devices
                                   without a fitted one, per device and driver (NULL: this process only) */
} treeattn_context_options;
TREEATTN_C_API void treeattn_context_options_init(treeattn_context_options* options);
TREEATTN_C_API void treeattn_context_options_init_sized(treeattn_context_options* options, size_t size);
#define treeattn_context_options_init(options) treeattn_context_options_init_sized((options), sizeof(treeattn_context_options))
TREEATTN_C_API treeattn_status treeattn_context_create(const treeattn_context_options* options /* NULL: defaults */,
                                                       treeattn_context** out);
/* "cpu", "cuda" or "vulkan": the backend a context runs. */
TREEATTN_C_API const char* treeattn_context_backend(const treeattn_context* context);
TREEATTN_C_API void treeattn_context_destroy(treeattn_context* context);
/* CUDA: fixes the context's workspace to the largest of `plans` times
 * `headroom` (>= 1), so that every treeattn_enqueue records the same launches:
 * a CUDA graph captured once replays every later plan within these limits,
 * each put there by treeattn_upload before the replay. A larger plan is
 * refused (TREEATTN_ERROR_INVALID_PLAN, naming the count). */
TREEATTN_C_API treeattn_status treeattn_context_graph_stable(treeattn_context* context, const treeattn_plan* const* plans,
                                                             int64_t count, double headroom);

/* --- plans ------------------------------------------------------------------ */
typedef struct treeattn_plan_options {
  size_t struct_size;
  treeattn_strategy strategy;   /* TREEATTN_STRATEGY_FLATTEN */
  int32_t block_tokens;         /* KV tokens per block; 0: chosen per tree by the device's cost model */
  int32_t bitwise_updates;      /* planners: nonzero keeps no layout between updates, so every update is
                                   bitwise the whole tree's plan made with the planner's cost-model choices
                                   (block size, launch order, greedy's layout: made again once the tree's
                                   size drifts by a quarter); 0 lets a planner keep flatten's blocks and
                                   greedy's edges over steps that only lengthen nodes (faster, equal up to
                                   rounding) */
  int32_t window;               /* sliding window: a query sees the last `window` tokens of its path, its own
                                   included (transformers' sliding_window); tokens outside every window are
                                   not read. 0: none; negative: TREEATTN_ERROR_INVALID_ARGUMENT naming it.
                                   A planner under a window keeps no layout between updates */
  treeattn_dtype kv_dtype;      /* how the calls that run the plan hold K and V: TREEATTN_DTYPE_FP8_E4M3 or
                                   _FP8_E5M2 plan with the device model's fp8 terms, any other with its plain
                                   ones (TREEATTN_DTYPE_F16). It guides the model's choices only: the plan
                                   runs with K and V of any dtype */
} treeattn_plan_options;
TREEATTN_C_API void treeattn_plan_options_init(treeattn_plan_options* options);
TREEATTN_C_API void treeattn_plan_options_init_sized(treeattn_plan_options* options, size_t size);
#define treeattn_plan_options_init(options) treeattn_plan_options_init_sized((options), sizeof(treeattn_plan_options))
/* Validates the tree (the message names the node or query) and plans it with
 * the context's device model. The plan keeps what it needs: the tree may be destroyed. */
TREEATTN_C_API treeattn_status treeattn_plan_create(treeattn_context* context, const treeattn_tree* tree,
                                                    const treeattn_plan_options* options /* NULL: defaults */,
                                                    treeattn_plan** out);
TREEATTN_C_API int32_t treeattn_plan_num_queries(const treeattn_plan* plan);
/* NULL is fine; a planner's plan is the planner's and is left alone. */
TREEATTN_C_API void treeattn_plan_destroy(treeattn_plan* plan);

/* --- planners: a tree that changes a little every decode step ---------------
 * A planner keeps the tree and what its plan is derived from, takes a step's
 * changes and updates the plan: appends redo only the grown nodes; other
 * changes rebuild what they touch. The plan of an update is the planner's and
 * stays valid until its next update or its destroy; treeattn_run and
 * treeattn_enqueue take it. Changes name nodes by id: a change to a node the
 * planner does not have (or is removing) fails at once, a new node's id in use
 * likewise (TREEATTN_ERROR_INVALID_TREE, naming it); a parent or a query's node
 * it does not have, and slots, are checked at the update, which names the node
 * (and token) and leaves the changes pending. */
TREEATTN_C_API treeattn_status treeattn_planner_create(treeattn_context* context, const treeattn_tree* initial,
                                                       const treeattn_plan_options* options /* NULL: defaults */,
                                                       treeattn_planner** out);
TREEATTN_C_API treeattn_status treeattn_planner_add_node(treeattn_planner* planner, int64_t id, int64_t parent,
                                                         const int64_t* slots, int64_t count);
TREEATTN_C_API treeattn_status treeattn_planner_add_node_range(treeattn_planner* planner, int64_t id, int64_t parent,
                                                               int64_t first_slot, int64_t count);
TREEATTN_C_API treeattn_status treeattn_planner_add_node_pages(treeattn_planner* planner, int64_t id, int64_t parent,
                                                               const int64_t* pages, int64_t page_count, int32_t page_size,
                                                               int32_t last_page_tokens);
/* Tokens appended to a node: a slot range, or (a paged node) `count` tokens
 * that fill its last page and then `new_pages`. */
TREEATTN_C_API treeattn_status treeattn_planner_append_range(treeattn_planner* planner, int64_t id, int64_t first_slot,
                                                             int64_t count);
TREEATTN_C_API treeattn_status treeattn_planner_append_pages(treeattn_planner* planner, int64_t id, int64_t count,
                                                             const int64_t* new_pages, int64_t new_page_count);
/* Removes a node and its whole subtree. */
TREEATTN_C_API treeattn_status treeattn_planner_remove_node(treeattn_planner* planner, int64_t id);
/* This step's queries: query i (row i of Q) on nodes[i], seeing the node's
 * first upto[i] tokens, or all of them (upto NULL, or upto[i] < 0). */
TREEATTN_C_API treeattn_status treeattn_planner_set_queries(treeattn_planner* planner, const int64_t* nodes,
                                                            const int64_t* upto, int64_t count);
TREEATTN_C_API treeattn_status treeattn_planner_update(treeattn_planner* planner, const treeattn_plan** out);
/* 1 when the last update kept an earlier step's layout (flatten's blocks, greedy's
 * edges: equal to a whole-tree plan up to rounding), 0 when it is bitwise the
 * whole tree's plan (or for NULL). */
TREEATTN_C_API int32_t treeattn_planner_held_layout(const treeattn_planner* planner);
/* NULL is fine. */
TREEATTN_C_API void treeattn_planner_destroy(treeattn_planner* planner);

/* --- tensors ----------------------------------------------------------------
 * Layouts: Q [queries, heads_q, head_dim], K [slots, heads_kv, head_dim],
 * V [slots, heads_kv, head_dim_v], O [queries, heads_q, head_dim_v], LSE
 * [queries, heads_q] (f32, natural log); head_dim_v is head_dim unless the tree says.
 * strides are in elements, all 0 for a dense tensor; only the first stride of
 * Q, K, V and O may differ from dense (rows of a wider buffer: a fused QKV
 * projection, some heads of a KV pool). A zero-initialised
 * struct with data, dtype, ndim and shape set is a dense tensor. */
typedef struct treeattn_tensor {
  void* data;
  treeattn_dtype dtype;
  int32_t ndim;
  int64_t shape[4];
  int64_t strides[4];
} treeattn_tensor;

/* Host memory; returns when O (and LSE, unless NULL) are written. */
TREEATTN_C_API treeattn_status treeattn_run(treeattn_context* context, const treeattn_plan* plan, const treeattn_tensor* q,
                                            const treeattn_tensor* k, const treeattn_tensor* v, const treeattn_tensor* o,
                                            const treeattn_tensor* lse /* NULL: no LSE */);
/* The attention variants of a call (the defaults: plain softmax attention).
 * Tensors are in the memory the call's others are in (host for treeattn_run). */
typedef struct treeattn_attention_options {
  size_t struct_size;
  float logit_softcap;             /* s = cap * tanh(s / cap) on the scaled logits (Gemma 2); 0: off */
  float k_scale;                   /* fp8 K: k = K * k_scale (1) */
  float v_scale;                   /* fp8 V: v = V * v_scale (1) */
  const treeattn_tensor* sinks;    /* [heads_q] f32: a logit per query head in the softmax's denominator and
                                      the LSE, with no value (gpt-oss); NULL: none */
  const treeattn_tensor* k_scales; /* [heads_kv] f32: fp8 K scales per KV head instead of k_scale; NULL: none */
  const treeattn_tensor* v_scales; /* [heads_kv] f32: fp8 V scales per KV head instead of v_scale; NULL: none */
} treeattn_attention_options;
/* Scales 1, the rest off. */
TREEATTN_C_API void treeattn_attention_options_init(treeattn_attention_options* options);
TREEATTN_C_API void treeattn_attention_options_init_sized(treeattn_attention_options* options, size_t size);
#define treeattn_attention_options_init(options) treeattn_attention_options_init_sized((options), sizeof(treeattn_attention_options))
/* treeattn_run and treeattn_enqueue with attention variants (NULL options: none),
 * which every backend runs; an option that does not fit the call is refused, naming it. */
TREEATTN_C_API treeattn_status treeattn_run_with(treeattn_context* context, const treeattn_plan* plan,
                                                 const treeattn_tensor* q, const treeattn_tensor* k,
                                                 const treeattn_tensor* v, const treeattn_tensor* o,
                                                 const treeattn_tensor* lse, const treeattn_attention_options* options);
TREEATTN_C_API treeattn_status treeattn_enqueue_with(treeattn_context* context, const treeattn_plan* plan,
                                                     const treeattn_tensor* q, const treeattn_tensor* k,
                                                     const treeattn_tensor* v, const treeattn_tensor* o,
                                                     const treeattn_tensor* lse, const treeattn_attention_options* options,
                                                     void* stream);

/* CUDA: uploads `plan` to the context's workspace on `stream` (a cudaStream_t),
 * without waiting: before capturing or replaying a graph of its layers. */
TREEATTN_C_API treeattn_status treeattn_upload(treeattn_context* context, const treeattn_plan* plan, void* stream);
/* Memory of the context's device, ordered on `stream`, returning without
 * waiting. CUDA: data are device pointers, stream a cudaStream_t (NULL: the
 * default stream). Vulkan: data are buffer device addresses (VkDeviceAddress,
 * 16-byte aligned), stream the VkCommandBuffer being recorded (treeattn/vulkan.hpp
 * documents the barriers around it). A plan other than the one the
 * workspace holds is uploaded first, on the same stream (on CUDA, refused
 * inside a graph capture: treeattn_upload it before capturing). */
TREEATTN_C_API treeattn_status treeattn_enqueue(treeattn_context* context, const treeattn_plan* plan,
                                                const treeattn_tensor* q, const treeattn_tensor* k, const treeattn_tensor* v,
                                                const treeattn_tensor* o, const treeattn_tensor* lse, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* TREEATTN_TREEATTN_H */

#include "c_arguments.hpp"

#include <cmath>

namespace treeattn::capi {

void require(const void* pointer, const char* what) {
  if (pointer == nullptr) throw Error(ErrorCategory::InvalidArgument, fmt::format("{} is NULL", what));
}

std::size_t bytes_to_read(const std::vector<std::size_t>& field_ends, std::size_t struct_size, std::size_t alignment) {
  std::size_t bytes = 0;
  for (const std::size_t end : field_ends) {
    if (end == struct_size || (end + alignment - 1) / alignment * alignment == struct_size) bytes = std::max(bytes, end);
  }
  return bytes;
}

std::vector<std::size_t> field_ends(const treeattn_plan_options*) {
  using O = treeattn_plan_options;
  return {sizeof(O::struct_size),
          offsetof(O, strategy) + sizeof(O::strategy),
          offsetof(O, block_tokens) + sizeof(O::block_tokens),
          offsetof(O, bitwise_updates) + sizeof(O::bitwise_updates),
          offsetof(O, window) + sizeof(O::window),
          offsetof(O, kv_dtype) + sizeof(O::kv_dtype),
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

namespace {

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

}  // namespace

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
  options.kv_dtype = dtype_of(o.kv_dtype, "treeattn_plan_options.kv_dtype");
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

}  // namespace treeattn::capi

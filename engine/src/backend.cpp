#include "backend.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <tuple>
#include <limits>

#include "fail.hpp"

namespace treeattn {

const char* to_string(BackendKind kind) noexcept {
  switch (kind) {
    case BackendKind::automatic: return "auto";
    case BackendKind::cpu: return "cpu";
    case BackendKind::vulkan: return "vulkan";
    case BackendKind::cuda: return "cuda";
  }
  return "?";
}

BackendKind parse_backend(const std::string& name) {
  for (BackendKind k : {BackendKind::automatic, BackendKind::cpu, BackendKind::vulkan, BackendKind::cuda}) {
    if (name == to_string(k)) return k;
  }
  fail(ErrorCategory::InvalidArgument, "unknown backend '{}' (choose auto, cpu, vulkan or cuda)", name);
}

std::vector<double> Backend::time_uploads(const Plan&, int) { return {}; }

void Backend::upload(const Plan&, void*) {
  fail(ErrorCategory::InvalidArgument, "the {} backend runs host arrays only: it has no device path to upload to", name());
}

void Backend::enqueue(const Plan&, const AttentionArgs&, void*) {
  fail(ErrorCategory::InvalidArgument,
       "the {} backend runs host arrays only: enqueue needs a CUDA context or one on the application's Vulkan device",
       name());
}

void Backend::graph_stable(const cuda::WorkspaceLimits&) {
  fail(ErrorCategory::InvalidArgument, "graph-stable workspaces are the CUDA backend's; this context runs {}", name());
}

std::vector<double> Backend::time_layers(const Plan& plan, const AttentionArgs& args, int layers, int repeats) {
  std::vector<double> us;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int layer = 0; layer < layers; ++layer) run(plan, args);
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  return us;
}

namespace {

void expect_shape(const char* name, const TensorRef& t, std::vector<std::int64_t> expected,
                  const char* meaning) {
  if (t.shape != expected) {
    fail(ErrorCategory::InvalidArgument, "{} is {}, expected [{}] ({})", name, describe(t),
         fmt::join(expected, ", "), meaning);
  }
  if (t.data == nullptr && t.numel() > 0) fail(ErrorCategory::InvalidArgument, "{} has no data", name);
}

// Q, K, V and O rows may be strided (16-byte aligned: the kernels load and
// store element pairs and vectors); LSE is dense.
void expect_row_stride(const char* name, const TensorRef& t, bool strided_ok) {
  if (t.dense()) return;
  if (!strided_ok) {
    fail(ErrorCategory::InvalidArgument, "{} is {}: it must be dense (row stride 0 or {})", name, describe(t),
         t.row_elements());
  }
  const std::int64_t align = std::int64_t(16 / dtype_size(t.dtype));
  if (t.row_stride < t.row_elements() || t.row_stride % align != 0) {
    fail(ErrorCategory::InvalidArgument, "{} is {}: the row stride must be at least {} and a multiple of {} (16 bytes)",
         name, describe(t), t.row_elements(), align);
  }
}

// K and V take any number of rows, and Q, K, V and O any row stride: the
// elements up to the last row's end, (rows - 1) row strides and a row, must
// be countable in int64 bytes (every later size and address computation is).
void expect_addressable(const char* name, const TensorRef& t) {
  const std::int64_t rows = t.shape[0], row = t.row_elements(), pitch = std::max(t.row_pitch(), row);
  const std::int64_t limit = std::numeric_limits<std::int64_t>::max() / std::int64_t(dtype_size(t.dtype));
  if (rows > 0 && pitch > 0 && (row > limit || rows - 1 > (limit - row) / pitch)) {
    fail(ErrorCategory::InvalidArgument, "{} is {}: {} rows {} elements apart exceed {} bytes", name, describe(t), rows,
         pitch, std::numeric_limits<std::int64_t>::max());
  }
}

}  // namespace

CallShape CallShape::of(const Plan& plan) { return CallShape{plan.heads, plan.num_queries, plan.min_kv_slots}; }

namespace {

// An options tensor of one f32 per head (sinks: query heads; scales: KV heads), dense.
void expect_per_head(const char* name, const TensorRef& t, std::int64_t heads, const char* meaning) {
  expect_shape(name, t, {heads}, meaning);
  if (t.dtype != DType::f32) fail(ErrorCategory::InvalidArgument, "{} must be f32, got {}", name, to_string(t.dtype));
  expect_row_stride(name, t, false);
}

// K/V dtypes: one of Q's, or both fp8 of one kind with Q f16 or bf16; O f16, bf16 or f32.
void check_dtypes(const AttentionArgs& a) {
  if (is_fp8(a.k.dtype) || is_fp8(a.v.dtype)) {
    if (a.k.dtype != a.v.dtype) {
      fail(ErrorCategory::InvalidArgument, "K and V must both be fp8 of one kind, got K {} and V {}", to_string(a.k.dtype),
           to_string(a.v.dtype));
    }
    if (a.q.dtype != DType::f16 && a.q.dtype != DType::bf16) {
      fail(ErrorCategory::InvalidArgument, "Q must be f16 or bf16 with {} K and V, got {}", to_string(a.k.dtype),
           to_string(a.q.dtype));
    }
  } else if (a.q.dtype != a.k.dtype || a.v.dtype != a.k.dtype) {
    fail(ErrorCategory::InvalidArgument, "Q, K and V must share one dtype, got {}, {} and {}", to_string(a.q.dtype),
         to_string(a.k.dtype), to_string(a.v.dtype));
  }
  if (is_fp8(a.q.dtype)) fail(ErrorCategory::InvalidArgument, "Q must be f16, bf16 or f32, got {}", to_string(a.q.dtype));
  if (is_fp8(a.o.dtype)) fail(ErrorCategory::InvalidArgument, "O must be f16, bf16 or f32, got {}", to_string(a.o.dtype));
}

// The scales dequantize fp8 K and V: with other K and V they are refused, not ignored.
void check_scales(const CallShape& plan, const AttentionArgs& a) {
  const AttentionOptions& opt = a.options;
  const bool fp8 = is_fp8(a.k.dtype);
  const std::tuple<const char*, float, const TensorRef*, const char*> scales[] = {
      {"k_scale", opt.k_scale, &opt.k_scales, "k_scales"}, {"v_scale", opt.v_scale, &opt.v_scales, "v_scales"}};
  for (const auto& [name, value, per_head, tensor_name] : scales) {
    if (!(value > 0.0f) || std::isinf(value)) {
      fail(ErrorCategory::InvalidArgument, "{} = {} must be positive and finite", name, value);
    }
    if (!fp8 && (value != 1.0f || per_head->data != nullptr)) {
      fail(ErrorCategory::InvalidArgument, "{} dequantizes fp8 K and V; K and V are {}", per_head->data ? tensor_name : name,
           to_string(a.k.dtype));
    }
    if (per_head->data == nullptr) continue;
    if (value != 1.0f) {
      fail(ErrorCategory::InvalidArgument, "give {} = {} or {} per KV head, not both", name, value, tensor_name);
    }
    expect_per_head(tensor_name, *per_head, plan.heads.heads_kv, "heads_kv");
  }
}

void check_options(const CallShape& plan, const AttentionArgs& a) {
  const AttentionOptions& opt = a.options;
  if (!(opt.logit_softcap >= 0.0f) || std::isinf(opt.logit_softcap)) {
    fail(ErrorCategory::InvalidArgument, "logit_softcap = {} must be finite and not negative (0: off)", opt.logit_softcap);
  }
  if (opt.sinks.data != nullptr) expect_per_head("sinks", opt.sinks, plan.heads.heads_q, "heads_q");
  check_scales(plan, a);
}

}  // namespace

void check_host_scale_values(const AttentionOptions& options) {
  for (const auto& [name, t] : {std::pair<const char*, const TensorRef*>{"k_scales", &options.k_scales}, {"v_scales", &options.v_scales}}) {
    if (t->data == nullptr) continue;
    const float* values = static_cast<const float*>(t->data);
    for (std::int64_t h = 0; h < t->numel(); ++h) {
      if (!(values[h] > 0.0f) || std::isinf(values[h])) {
        fail(ErrorCategory::InvalidArgument, "{}[{}] = {} must be positive and finite", name, h, values[h]);
      }
    }
  }
}

void check_args(const CallShape& plan, const AttentionArgs& a) {
  const std::int64_t nq = plan.num_queries, hq = plan.heads.heads_q, hkv = plan.heads.heads_kv,
                     d = plan.heads.head_dim, dv = plan.heads.value_dim();
  expect_shape("Q", a.q, {nq, hq, d}, "queries, heads_q, head_dim");
  expect_addressable("Q", a.q);
  if (a.k.shape.size() != 3 || a.k.shape[1] != hkv || a.k.shape[2] != d) {
    fail(ErrorCategory::InvalidArgument, "K is {}, expected [slots, {}, {}] (slots, heads_kv, head_dim)",
         describe(a.k), hkv, d);
  }
  if (a.k.shape[0] < plan.min_kv_slots) {
    fail(ErrorCategory::InvalidArgument, "K has {} slots but the tree reads slot {}", a.k.shape[0],
         plan.min_kv_slots - 1);
  }
  expect_addressable("K", a.k);
  expect_shape("V", a.v, {a.k.shape[0], hkv, dv}, dv == d ? "the shape of K" : "K's slots, heads_kv, head_dim_v");
  expect_addressable("V", a.v);
  if (a.k.data == nullptr && a.k.numel() > 0) fail(ErrorCategory::InvalidArgument, "K has no data");
  check_dtypes(a);
  expect_shape("O", a.o, {nq, hq, dv}, dv == d ? "queries, heads_q, head_dim" : "queries, heads_q, head_dim_v");
  expect_addressable("O", a.o);
  if (a.lse.data != nullptr) {
    expect_shape("LSE", a.lse, {nq, hq}, "queries, heads_q");
    if (a.lse.dtype != DType::f32) fail(ErrorCategory::InvalidArgument, "LSE must be f32, got {}", to_string(a.lse.dtype));
  }
  expect_row_stride("Q", a.q, true);
  expect_row_stride("K", a.k, true);
  expect_row_stride("V", a.v, true);
  expect_row_stride("O", a.o, true);
  expect_row_stride("LSE", a.lse, false);
  check_options(plan, a);
}

}  // namespace treeattn

#include "backend.hpp"

#include <algorithm>
#include <chrono>
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

void check_args(const CallShape& plan, const AttentionArgs& a) {
  const std::int64_t nq = plan.num_queries, hq = plan.heads.heads_q, hkv = plan.heads.heads_kv,
                     d = plan.heads.head_dim;
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
  expect_shape("V", a.v, a.k.shape, "the shape of K");
  expect_addressable("V", a.v);
  if (a.k.data == nullptr && a.k.numel() > 0) fail(ErrorCategory::InvalidArgument, "K has no data");
  if (a.q.dtype != a.k.dtype || a.v.dtype != a.k.dtype) {
    fail(ErrorCategory::InvalidArgument, "Q, K and V must share one dtype, got {}, {} and {}",
         to_string(a.q.dtype), to_string(a.k.dtype), to_string(a.v.dtype));
  }
  expect_shape("O", a.o, {nq, hq, d}, "queries, heads_q, head_dim");
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
}

}  // namespace treeattn

// The CUDA backend: the conformance suite (test_conformance.cpp) plus what is
// particular to it. Without a CUDA device the program says so and exits 77,
// which ctest reports as skipped.

#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <cstdio>
#include <string>
#include <utility>

#include "../backends/cuda/cuda_backend.hpp"
#include "../cuda/attn_launch.hpp"
#include "support/conformance.hpp"
#include "support/oracle.hpp"
#include "treeattn/error.hpp"
#include "treeattn/workloads.hpp"

using namespace treeattn;
using namespace treeattn::test;

std::unique_ptr<Backend> treeattn::test::make_test_backend() { return make_backend(BackendKind::cuda); }

// f32 inputs run stage 1 on the CUDA cores (attn_kernel_f32.cuh): every head
// dimension, blocks of one partial tile to several tiles (and a half-tile step
// at head_dim 256 and 192), query tiles of 7 to 64 rows, groups of 1 and 4.
TEST_CASE("f32 inputs at every head dimension agree with the oracle to f32 precision") {
  auto backend = make_test_backend();
  for (const HeadConfig heads : {HeadConfig{8, 2, 64}, HeadConfig{8, 2, 96}, HeadConfig{32, 8, 128},
                                 HeadConfig{8, 2, 192, 0.0f, 128}, HeadConfig{4, 4, 256}}) {
    const std::string heads_name = describe(heads);
    CAPTURE(heads_name);
    RandomForestOptions o;
    o.seed = std::uint64_t(heads.head_dim);
    o.nodes = 40;
    o.queries = 30;
    o.heads = heads;
    for (const std::int32_t block_tokens : {16, 64, 200}) {
      CAPTURE(block_tokens);
      check_against_oracle(*backend, random_forest(o), DType::f32, 31, 1.0f, block_tokens, block_tokens == 64 ? 7 : 64);
    }
  }
}

// head_dim 96 (its last swizzle panel half full, O's wgmma columns padded to
// 128) and 192 with head_dim_v 128 (K's gather wider than V's) in bf16 and
// f16, through 64-row passes (wgmma on sm_90a) and split-KV passes of at most
// 16 rows (mma.sync), over blocks of part of a tile to several tiles, with O
// in bf16 (odd merge lanes start at odd elements at 96). The conformance
// suite's head-dim case runs them in f16 with every variant.
TEST_CASE("head_dim 96 and head_dim 192 with head_dim_v 128 agree with the oracle through every pass shape") {
  auto backend = make_test_backend();
  for (const HeadConfig heads : {HeadConfig{8, 2, 96}, HeadConfig{4, 4, 96}, HeadConfig{8, 2, 192, 0.0f, 128},
                                 HeadConfig{16, 1, 192, 0.0f, 128}}) {
    const std::string heads_name = describe(heads);
    CAPTURE(heads_name);
    RandomForestOptions o;
    o.seed = std::uint64_t(heads.head_dim + heads.heads_q);
    o.nodes = 40;
    o.queries = 70;
    o.heads = heads;
    const Tree tree = random_forest(o);
    for (const DType dtype : {DType::bf16, DType::f16}) {
      CAPTURE(to_string(dtype));
      Inputs in = make_inputs(tree, dtype, 21);
      const OracleResult expected = oracle_attention(tree, in.q.view(), in.k.view(), in.v.view());
      for (const std::int32_t block_tokens : {16, 64, 200}) {
        for (const std::int32_t query_tile : {4, 64}) {
          CAPTURE(block_tokens);
          CAPTURE(query_tile);
          Outputs out = run_backend(*backend, tree, in, PlanOptions{Strategy::flatten, block_tokens, query_tile, 0},
                                          DType::bf16);
          CHECK(max_abs_error(out.o.view(), expected.o) <= tolerance(DType::bf16));
          CHECK(max_abs_error(out.lse.view(), expected.lse) <= tolerance(dtype));
        }
      }
    }
  }
}

TEST_CASE("the graph-replayed layers compute what run() computes") {
  auto backend = make_test_backend();
  check_timed_layers_match_run(*backend);
  CHECK(backend->peak_gbps() > 0.0);
}

// Device copies of one call's tensors.
struct DeviceCall {
  cuda::DeviceBuffer q, k, v, o;
  explicit DeviceCall(Inputs& in, const HostArray& out)
      : q(in.q.bytes.size()), k(in.k.bytes.size()), v(in.v.bytes.size()), o(out.bytes.size()) {
    REQUIRE(cudaMemcpy(q.data(), in.q.bytes.data(), in.q.bytes.size(), cudaMemcpyHostToDevice) == cudaSuccess);
    REQUIRE(cudaMemcpy(k.data(), in.k.bytes.data(), in.k.bytes.size(), cudaMemcpyHostToDevice) == cudaSuccess);
    REQUIRE(cudaMemcpy(v.data(), in.v.bytes.data(), in.v.bytes.size(), cudaMemcpyHostToDevice) == cudaSuccess);
  }
  AttentionArgs args(const Inputs& in, const HostArray& out) const {
    return AttentionArgs{TensorRef{q.data(), in.q.dtype, in.q.shape}, TensorRef{k.data(), in.k.dtype, in.k.shape},
                         TensorRef{v.data(), in.v.dtype, in.v.shape}, TensorRef{o.data(), out.dtype, out.shape}, {}};
  }
};

TEST_CASE("back-to-back calls on one uploaded plan keep their own results") {
  // 24 branch queries under a 3 000-token prompt: each merges a dozen partials
  // from the plan's workspace, which the next call's stage 1 overwrites (a
  // model's layers share it). With stage 1 allowed to start before the merge
  // before it ended (a trial of programmatic dependent launch without its wait),
  // the first call's output was off by 1e-2.
  Tree tree({32, 8, 128});
  tree.add_node_range(0, kNoParent, 0, 3000);
  for (int b = 0; b < 24; ++b) {
    tree.add_node_range(1 + b, 0, 3000 + 50 * b, 50);
    tree.add_query(1 + b);
  }
  const Plan plan = treeattn::plan(tree);
  Inputs a = make_inputs(tree, DType::f16, 11), b = make_inputs(tree, DType::f16, 12);
  const OracleResult want_a = oracle_attention(tree, a.q.view(), a.k.view(), a.v.view());
  const OracleResult want_b = oracle_attention(tree, b.q.view(), b.k.view(), b.v.view());
  HostArray out_a(DType::f32, {24, 32, 128}), out_b(DType::f32, {24, 32, 128});
  cudaStream_t stream = nullptr;
  REQUIRE(cudaStreamCreate(&stream) == cudaSuccess);
  {
    const cuda::Context context(0);
    cuda::Workspace workspace(context);
    workspace.upload(plan, stream);
    DeviceCall call_a(a, out_a), call_b(b, out_b);
    for (int round = 0; round < 8; ++round) {
      workspace.enqueue(call_a.args(a, out_a), stream);
      workspace.enqueue(call_b.args(b, out_b), stream);
    }
    REQUIRE(cudaMemcpyAsync(out_a.bytes.data(), call_a.o.data(), out_a.bytes.size(), cudaMemcpyDeviceToHost, stream) == cudaSuccess);
    REQUIRE(cudaMemcpyAsync(out_b.bytes.data(), call_b.o.data(), out_b.bytes.size(), cudaMemcpyDeviceToHost, stream) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(stream) == cudaSuccess);
  }
  cudaStreamDestroy(stream);
  CHECK(max_abs_error(out_a.view(), want_a.o) <= tolerance(DType::f16));
  CHECK(max_abs_error(out_b.view(), want_b.o) <= tolerance(DType::f16));
}

TEST_CASE("the cost model's slots are the device's: SMs x stage-1 CTAs per SM") {
  int sms = 0;
  REQUIRE(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) == cudaSuccess);
  const double slots = make_test_backend()->cost_model().slots;
  CHECK(slots >= sms);  // at least one CTA per SM
  CHECK(std::fmod(slots, double(sms)) == 0.0);
  CHECK(slots <= 8.0 * sms);
}

TEST_CASE("stage 1's occupancy: the code the device runs, no spills at head_dim 64, 96 and 128, the cost model's CTAs") {
  int sms = 0, major = 0, minor = 0;
  REQUIRE(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) == cudaSuccess);
  REQUIRE(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) == cudaSuccess);
  REQUIRE(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) == cudaSuccess);
  for (const auto& [head_dim, head_dim_v] : {std::pair{64, 64}, std::pair{96, 96}, std::pair{128, 128},
                                           std::pair{192, 128}, std::pair{256, 256}}) {
    CAPTURE(head_dim);
    CAPTURE(head_dim_v);
    const cuda::Stage1Occupancy o = cuda::stage1_occupancy(head_dim, head_dim_v);
    REQUIRE(o.ctas_per_sm >= 1);
    CHECK(o.binary_arch / 10 == major);  // machine code runs within its major version only
    CHECK(o.binary_arch <= major * 10 + minor);
    CHECK(o.ptx_arch >= 80);
    CHECK(o.ptx_arch <= o.binary_arch);
    if (o.wgmma) CHECK(o.ptx_arch >= 90);
    CHECK(o.registers > 0);
    CHECK(o.registers <= 255);
    CHECK(o.shared_bytes > 0);
    // Each cubin's register cap is set so that these do not spill (attn_traits.cuh).
    if (head_dim <= 128) CHECK(o.spill_bytes == 0);
    // The fitted H100 model (and the fallback) take the occupancy; a calibrated one measures its own.
    const CostModel model = make_test_backend()->cost_model();
    if (head_dim == 128 && model.source.rfind("calibrated", 0) != 0) CHECK(model.slots == double(sms) * o.ctas_per_sm);
  }
  // No such kernels: the engine takes no other head dims.
  CHECK(cuda::stage1_occupancy(80, 80).ctas_per_sm == 0);
  CHECK(cuda::stage1_occupancy(192, 192).ctas_per_sm == 0);
  CHECK(cuda::stage1_occupancy(128, 64).ctas_per_sm == 0);
}

TEST_CASE("the device's cost model: the H100 fit on an H100 or H200, calibrated once per process elsewhere") {
  const cuda::Context first(0);
  const CostModel model = first.cost_model();
  CAPTURE(model.source);
  const std::string& name = first.info().name;
  const bool h100 = (name.find("H100") != std::string::npos || name.find("H200") != std::string::npos) &&
                    first.info().sm_major == 9;
  CHECK(model.source.rfind(h100 ? "h100 (fitted on CUDA" : "calibrated on " + first.info().name, 0) == 0);
  CHECK(model.sms == first.info().sms);
  // A second context on the device takes the model kept in this process: the same coefficients and source.
  const CostModel again = cuda::Context(0).cost_model();
  CHECK(again.to_string() == model.to_string());
  CHECK(again.source == model.source);
}

// fp8 K and V take three paths through stage 1 (docs/cuda.md, "Attention
// variants"): a 64-row pass widens each tile into shared memory (two barriers
// a tile, K widened while the previous tile's P V runs), a split-KV pass
// widens its fragments in registers from a ring of four gather stages, and one
// of at most 8 rows also leaves out its fragments' padding half. Blocks of up
// to 16 tiles run each through many turns of their rings; with unit scales
// each must give the f16 run of the same values bit for bit, as the MMAs see
// the same products in the same order.
TEST_CASE("fp8 K and V over long blocks, in 64-row, split-KV and half-row passes: bitwise the f16 run of the same values") {
  auto backend = make_test_backend();
  for (const HeadConfig heads : {HeadConfig{8, 2, 64}, HeadConfig{32, 8, 128}, HeadConfig{4, 4, 256}}) {
    CAPTURE(heads.head_dim);
    RandomForestOptions o;
    o.seed = 40 + std::uint64_t(heads.head_dim);
    o.nodes = 10;
    o.queries = 48;
    o.min_tokens = 100;
    o.max_tokens = 400;
    o.heads = heads;
    const Tree tree = random_forest(o);
    // Blocks of up to 1024 tokens; query tiles of 64 (passes of up to 64 rows,
    // a large tile's last rows split-KV), of 4 (split-KV passes alone) and of
    // 2 (passes of at most 8 rows: group 4 or less). The longest blocks of
    // each kind of pass (a pass of at most kSmallTileRows rows is split-KV, of
    // at most 8 up to head_dim 128 a half-row one) reach well past their stage rings.
    std::int32_t half_tiles = 0, split_tiles = 0, large_tiles = 0;
    for (const std::int32_t query_tile : {64, 4, 2}) {
      CAPTURE(query_tile);
      PlanOptions options;
      options.block_tokens = 1024;
      options.query_tile = query_tile;
      const Plan plan = treeattn::plan(tree, options);
      for (std::size_t i = 0; i < plan.item_block.size(); ++i) {
        const std::size_t block = std::size_t(plan.item_block[i]);
        std::int32_t tokens = 0;
        for (std::int32_t g = plan.block_segment_begin[block]; g < plan.block_segment_begin[block + 1]; ++g) {
          tokens += plan.segment_token_end[std::size_t(g)] - plan.segment_token_begin[std::size_t(g)];
        }
        const std::int32_t rows = (plan.item_query_begin[i + 1] - plan.item_query_begin[i]) * heads.group_size();
        const std::int32_t tile_rows = plan.item_tile_rows[i];
        for (std::int32_t row = 0; row < rows; row += tile_rows) {
          const std::int32_t pass_rows = std::min(tile_rows, rows - row);
          const bool half = pass_rows <= 8 && heads.head_dim <= 128;  // tree_attn_partial_kernel's dispatch
          std::int32_t& longest = half ? half_tiles : pass_rows <= kSmallTileRows ? split_tiles : large_tiles;
          longest = std::max(longest, (tokens + 63) / 64);
        }
      }
      for (const DType fp8 : {DType::fp8_e4m3, DType::fp8_e5m2}) {
        const std::string fp8_name = to_string(fp8);
        CAPTURE(fp8_name);
        Variant variant;
        variant.kv = fp8;
        Inputs as_fp8 = make_variant_inputs(tree, variant, 9);
        as_fp8.k_scale = as_fp8.v_scale = 1.0f;
        Inputs as_f16 = make_inputs(tree, DType::f16, 9);
        as_f16.q = as_fp8.q;
        for (auto [from, to] : {std::pair{&as_fp8.k, &as_f16.k}, std::pair{&as_fp8.v, &as_f16.v}}) {
          for (std::size_t i = 0; i < std::size_t(from->numel()); ++i) {
            store_from_float(to->bytes.data(), DType::f16, i, load_as_float(from->bytes.data(), fp8, i));
          }
        }
        const Outputs want = run_backend(*backend, tree, as_f16, options);
        const Outputs got = run_backend(*backend, tree, as_fp8, options);
        CHECK(got.o.bytes == want.o.bytes);
        CHECK(got.lse.bytes == want.lse.bytes);
      }
    }
    if (heads.head_dim <= 128) CHECK(half_tiles >= 9);
    CHECK(split_tiles >= 9);
    CHECK(large_tiles >= 9);
  }
}

int main(int argc, char** argv) {
  if (cuda::device_count() == 0) {
    std::printf("test_cuda: no CUDA device here: skipping the CUDA suite (it runs on a GPU machine)\n");
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}

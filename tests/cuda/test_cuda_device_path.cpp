// The public CUDA device path (treeattn/cuda.hpp): one CUDA graph captured once
// and replayed over whole decode replays with a new plan uploaded each step,
// strided Q and O, the attention variants' tensors in device memory, the
// workspace's limits and its errors; and the C API's treeattn_enqueue over it.

#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "../backends/cuda/device_buffer.hpp"
#include "support/c_replay.hpp"
#include "support/c_tensor.hpp"
#include "support/conformance.hpp"
#include "support/oracle.hpp"
#include "support/workloads_dir.hpp"
#include "treeattn/context.hpp"
#include "treeattn/cuda.hpp"
#include "treeattn/error.hpp"
#include "treeattn/planner.hpp"
#include "treeattn/treeattn.h"
#include "treeattn/scenarios.hpp"
#include "treeattn/workloads.hpp"

using namespace treeattn;
using namespace treeattn::test;

namespace {

const HeadConfig kHeads{32, 8, 128, 0.0f};

void check(cudaError_t err) { REQUIRE_MESSAGE(err == cudaSuccess, cudaGetErrorString(err)); }

// A host array copied to a new device buffer of at least `bytes`.
cuda::DeviceBuffer to_device(const HostArray& host, std::size_t bytes = 0) {
  cuda::DeviceBuffer buffer(std::max(host.bytes.size(), bytes));
  check(cudaMemcpy(buffer.data(), host.bytes.data(), host.bytes.size(), cudaMemcpyHostToDevice));
  return buffer;
}

// The trees of a scenario's first `steps` decode steps, on one paged KV cache.
struct Replay {
  std::vector<Tree> trees;
  std::int64_t slots = 0;
};
Replay replay_trees(Scenario& scenario, std::int64_t steps) {
  PagedKvCache cache(16, 0);
  SequenceTree live(cache);
  std::vector<TreeQuery> queries;
  Replay r;
  for (std::int64_t s = 0; s < steps; ++s) {
    scenario.advance(live, queries);
    r.trees.push_back(live.to_tree(kHeads, queries));
  }
  r.slots = cache.slots();
  return r;
}

// One CUDA graph of two layers (each its own KV pool and O) captured at the
// first step and replayed at every step after that step's plan and Q were
// uploaded; at the checkpoints both layers' O equal the CPU backend's.
void check_graph_replay(const Replay& replay, const std::vector<std::size_t>& checkpoints) {
  const cuda::Context context(0);
  PlanOptions options;
  options.cost = context.cost_model();
  Planner planner(1);
  std::vector<Plan> plans;
  cuda::WorkspaceLimits limits;
  for (const Tree& tree : replay.trees) {
    plans.push_back(planner.plan(tree, options));
    limits.include(cuda::WorkspaceLimits::of(plans.back()));
  }
  cuda::Workspace workspace(context, limits);
  REQUIRE(workspace.graph_stable());

  const std::int64_t row = kHeads.heads_q * kHeads.head_dim;
  const std::int64_t pool_rows = std::max<std::int64_t>(replay.slots, 1);
  HostArray k[2], v[2];
  cuda::DeviceBuffer dk[2], dv[2], dq(std::size_t(limits.queries * row * 2)), dout[2];
  for (int l = 0; l < 2; ++l) {
    k[l] = random_array(DType::f16, {pool_rows, kHeads.heads_kv, kHeads.head_dim}, 10 + l);
    v[l] = random_array(DType::f16, {pool_rows, kHeads.heads_kv, kHeads.head_dim}, 20 + l);
    dk[l] = to_device(k[l]);
    dv[l] = to_device(v[l]);
    dout[l] = cuda::DeviceBuffer(std::size_t(limits.queries * row * 4));
  }
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  auto cpu = make_backend(BackendKind::cpu);
  std::size_t checked = 0;
  for (std::size_t step = 0; step < plans.size(); ++step) {
    const Plan& plan = plans[step];
    const HostArray q = random_array(DType::f16, {plan.num_queries, kHeads.heads_q, kHeads.head_dim}, 1000 + step);
    workspace.upload(plan, stream);
    check(cudaMemcpyAsync(dq.data(), q.bytes.data(), q.bytes.size(), cudaMemcpyHostToDevice, stream));
    if (graph == nullptr) {  // captured once, with the first step's shapes
      check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      for (int l = 0; l < 2; ++l) {
        const std::vector<std::int64_t> qshape = {plan.num_queries, kHeads.heads_q, kHeads.head_dim};
        workspace.enqueue(AttentionArgs{TensorRef{dq.data(), DType::f16, qshape}, TensorRef{dk[l].data(), DType::f16, k[l].shape},
                                        TensorRef{dv[l].data(), DType::f16, v[l].shape},
                                        TensorRef{dout[l].data(), DType::f32, qshape}, {}},
                          stream);
      }
      check(cudaStreamEndCapture(stream, &graph));
      check(cudaGraphInstantiate(&exec, graph, 0));
    }
    check(cudaGraphLaunch(exec, stream));
    if (std::find(checkpoints.begin(), checkpoints.end(), step) == checkpoints.end() && step + 1 != plans.size()) continue;
    CAPTURE(step);
    for (int l = 0; l < 2; ++l) {
      CAPTURE(l);
      HostArray got(DType::f32, {plan.num_queries, kHeads.heads_q, kHeads.head_dim});
      check(cudaMemcpyAsync(got.bytes.data(), dout[l].data(), got.bytes.size(), cudaMemcpyDeviceToHost, stream));
      check(cudaStreamSynchronize(stream));
      HostArray want(DType::f32, got.shape);
      HostArray q_host = q, k_host = k[l], v_host = v[l];
      cpu->run(plan, AttentionArgs{q_host.view(), k_host.view(), v_host.view(), want.view(), {}});
      double worst = 0.0;
      const float* g = reinterpret_cast<const float*>(got.bytes.data());
      const float* w = reinterpret_cast<const float*>(want.bytes.data());
      for (std::int64_t i = 0; i < got.numel(); ++i) worst = std::max(worst, double(std::abs(g[i] - w[i])));
      CHECK(worst <= tolerance(DType::f16));
    }
    ++checked;
  }
  check(cudaStreamSynchronize(stream));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  CHECK(checked >= checkpoints.size());
}

}  // namespace

TEST_CASE("graph-stable: one captured graph replays 60 few-shot decode steps with a new plan each") {
  auto scenario = few_shot_scenario(1500, 12, 60);
  check_graph_replay(replay_trees(*scenario, 60), {0, 1, 10, 25, 50});
}

TEST_CASE("graph-stable: one captured graph replays 60 speculative decode steps (Medusa t=64)") {
  const MedusaWorkload medusa = load_medusa(workloads_dir() + "/speculative/APPS_tree_size64.json");
  auto scenario = speculative_scenario(medusa, 0, 800);
  check_graph_replay(replay_trees(*scenario, 60), {0, 1, 10, 25, 50});
}

TEST_CASE("graph-stable: a tree-of-thought replay, queries and nodes coming and going, under one graph") {
  const std::vector<ReasoningTree> trees = load_reasoning(workloads_dir() + "/reasoning/keywordToT.json");
  auto scenario = reasoning_scenario(trees.front());
  check_graph_replay(replay_trees(*scenario, 80), {0, 20, 40, 79});
}

namespace {

// A 700-token prompt and nine 20-token branches, a query at each branch's end.
Tree prompt_and_branches() {
  Tree tree(kHeads);
  tree.add_node_range(0, kNoParent, 0, 700);
  for (int b = 0; b < 9; ++b) {
    tree.add_node_range(1 + b, 0, 700 + 20 * b, 20);
    tree.add_query(1 + b);
  }
  return tree;
}

// `tree` planned with the device's cost model.
Plan plan_for(const cuda::Context& context, const Tree& tree) {
  PlanOptions options;
  options.cost = context.cost_model();
  return treeattn::plan(tree, options);
}

}  // namespace

TEST_CASE("strided Q and O: a slice of a fused QKV projection in, rows of a wider output out, bitwise the dense result") {
  const Tree tree = prompt_and_branches();
  const cuda::Context context(0);
  const Plan plan = plan_for(context, tree);
  const std::int64_t nq = plan.num_queries, row = kHeads.heads_q * kHeads.head_dim;
  const std::int64_t qkv_row = (kHeads.heads_q + 2 * kHeads.heads_kv) * kHeads.head_dim, o_row = row + 64;
  const HostArray qkv = random_array(DType::f16, {nq, qkv_row}, 3);
  HostArray q_dense(DType::f16, {nq, kHeads.heads_q, kHeads.head_dim});
  for (std::int64_t i = 0; i < nq; ++i) std::memcpy(q_dense.bytes.data() + i * row * 2, qkv.bytes.data() + i * qkv_row * 2, row * 2);
  const HostArray k = random_array(DType::f16, {900, kHeads.heads_kv, kHeads.head_dim}, 4);
  const HostArray v = random_array(DType::f16, {900, kHeads.heads_kv, kHeads.head_dim}, 5);
  cuda::DeviceBuffer dqkv = to_device(qkv), dq = to_device(q_dense), dk = to_device(k), dv = to_device(v);
  cuda::DeviceBuffer dense_o(std::size_t(nq * row * 2)), wide_o(std::size_t(nq * o_row * 2)), lse(std::size_t(nq * 32 * 4));
  check(cudaMemset(wide_o.data(), 0xff, wide_o.bytes()));

  cudaStream_t stream = nullptr;
  check(cudaStreamCreate(&stream));
  cuda::Workspace workspace(context);
  workspace.upload(plan, stream);
  const std::vector<std::int64_t> shape = {nq, kHeads.heads_q, kHeads.head_dim};
  const TensorRef tk{dk.data(), DType::f16, k.shape}, tv{dv.data(), DType::f16, v.shape};
  workspace.enqueue({TensorRef{dq.data(), DType::f16, shape}, tk, tv, TensorRef{dense_o.data(), DType::f16, shape},
                     TensorRef{lse.data(), DType::f32, {nq, kHeads.heads_q}}},
                    stream);
  workspace.enqueue({TensorRef{dqkv.data(), DType::f16, shape, qkv_row}, tk, tv,
                     TensorRef{wide_o.data(), DType::f16, shape, o_row}, {}},
                    stream);
  std::vector<std::uint16_t> dense(std::size_t(nq * row)), wide(std::size_t(nq * o_row));
  check(cudaMemcpyAsync(dense.data(), dense_o.data(), dense.size() * 2, cudaMemcpyDeviceToHost, stream));
  check(cudaMemcpyAsync(wide.data(), wide_o.data(), wide.size() * 2, cudaMemcpyDeviceToHost, stream));
  check(cudaStreamSynchronize(stream));
  cudaStreamDestroy(stream);
  for (std::int64_t i = 0; i < nq; ++i) {
    CAPTURE(i);
    CHECK(std::memcmp(dense.data() + i * row, wide.data() + i * o_row, std::size_t(row) * 2) == 0);
    // The gap after each row is left as it was.
    CHECK(wide[std::size_t(i * o_row + row)] == 0xffff);
  }
}

TEST_CASE("variants on the device path: fp8 K and V, per-head scales, sinks and a soft-cap in device memory, captured, bitwise the host call") {
  // 9 queries x 4 query heads: 64-row (wgmma) passes over the prompt; the
  // branches' queries merge partials, so their sinks join in the merge kernel.
  const Tree tree = prompt_and_branches();
  const cuda::Context context(0);
  const Plan plan = plan_for(context, tree);
  REQUIRE(plan.merge_begin[1] > plan.merge_begin[0]);
  Variant variant;
  for (const Variant& v : all_variants()) {
    if (std::string(v.name) == "fp8_e4m3 + sinks + soft-cap 30") variant = v;
  }
  REQUIRE((variant.sinks && variant.per_head_scales));
  Inputs in = make_variant_inputs(tree, variant, 21);
  const Outputs host = run_plan(*make_test_backend(), tree, in, plan);

  cuda::DeviceBuffer dq = to_device(in.q), dk = to_device(in.k), dv = to_device(in.v), sinks = to_device(in.sinks),
                     k_scales = to_device(in.k_scales), v_scales = to_device(in.v_scales);
  cuda::DeviceBuffer o(host.o.bytes.size()), lse(host.lse.bytes.size());
  AttentionOptions device_options = in.options();
  device_options.sinks.data = sinks.data();
  device_options.k_scales.data = k_scales.data();
  device_options.v_scales.data = v_scales.data();
  const AttentionArgs args{TensorRef{dq.data(), in.q.dtype, in.q.shape}, TensorRef{dk.data(), in.k.dtype, in.k.shape},
                           TensorRef{dv.data(), in.v.dtype, in.v.shape}, TensorRef{o.data(), host.o.dtype, host.o.shape},
                           TensorRef{lse.data(), DType::f32, host.lse.shape}, device_options};
  cudaStream_t stream = nullptr;
  check(cudaStreamCreate(&stream));
  cuda::Workspace workspace(context);
  workspace.upload(plan, stream);
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  workspace.enqueue(args, stream);
  check(cudaStreamEndCapture(stream, &graph));
  check(cudaGraphInstantiate(&exec, graph, 0));
  check(cudaGraphLaunch(exec, stream));
  std::vector<unsigned char> got_o(host.o.bytes.size()), got_lse(host.lse.bytes.size());
  check(cudaMemcpyAsync(got_o.data(), o.data(), got_o.size(), cudaMemcpyDeviceToHost, stream));
  check(cudaMemcpyAsync(got_lse.data(), lse.data(), got_lse.size(), cudaMemcpyDeviceToHost, stream));
  check(cudaStreamSynchronize(stream));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  CHECK(got_o == host.o.bytes);
  CHECK(got_lse == host.lse.bytes);
}

TEST_CASE("a head split on the device: each rank's heads as strided rows of the whole Q, K, V and O, bitwise the whole run") {
  check_head_split_is_bitwise(*make_test_backend());  // host arrays, staged dense
  // On device pointers, the kernels reading the strided rows themselves.
  Tree whole(kHeads);
  whole.add_node_range(0, kNoParent, 0, 700);
  for (int b = 0; b < 9; ++b) {
    whole.add_node_range(1 + b, 0, 700 + 20 * b, 20);
    whole.add_query(1 + b);
  }
  Tree half = whole;
  half.heads = {kHeads.heads_q / 2, kHeads.heads_kv / 2, kHeads.head_dim, 0.0f};
  const cuda::Context context(0);
  PlanOptions options{Strategy::flatten, 128};  // a fixed block size: the same plan for any head count
  options.cost = context.cost_model();
  const Plan whole_plan = treeattn::plan(whole, options), half_plan = treeattn::plan(half, options);
  const std::int64_t nq = whole_plan.num_queries, d = kHeads.head_dim, hq = kHeads.heads_q, hkv = kHeads.heads_kv;
  const HostArray q = random_array(DType::f16, {nq, hq, d}, 7);
  const HostArray k = random_array(DType::f16, {900, hkv, d}, 8), v = random_array(DType::f16, {900, hkv, d}, 9);
  cuda::DeviceBuffer dq = to_device(q), dk = to_device(k), dv = to_device(v);
  cuda::DeviceBuffer whole_o(std::size_t(nq * hq * d * 2)), split_o(std::size_t(nq * hq * d * 2));
  cuda::DeviceBuffer whole_lse(std::size_t(nq * hq * 4)), half_lse(std::size_t(nq * hq / 2 * 4));
  cudaStream_t stream = nullptr;
  check(cudaStreamCreate(&stream));
  cuda::Workspace whole_ws(context), half_ws(context);
  whole_ws.upload(whole_plan, stream);
  whole_ws.enqueue({TensorRef{dq.data(), DType::f16, q.shape}, TensorRef{dk.data(), DType::f16, k.shape},
                    TensorRef{dv.data(), DType::f16, v.shape}, TensorRef{whole_o.data(), DType::f16, q.shape},
                    TensorRef{whole_lse.data(), DType::f32, {nq, hq}}},
                   stream);
  half_ws.upload(half_plan, stream);
  std::vector<float> whole_lse_host(std::size_t(nq * hq)), half_lse_host(std::size_t(nq * hq / 2));
  check(cudaMemcpyAsync(whole_lse_host.data(), whole_lse.data(), whole_lse_host.size() * 4, cudaMemcpyDeviceToHost, stream));
  for (int rank = 0; rank < 2; ++rank) {
    CAPTURE(rank);
    auto heads_of = [&](cuda::DeviceBuffer& buffer, std::int64_t heads, std::int64_t rows) {
      return TensorRef{buffer.as<unsigned char>() + rank * heads / 2 * d * 2, DType::f16, {rows, heads / 2, d}, heads * d};
    };
    half_ws.enqueue({heads_of(dq, hq, nq), heads_of(dk, hkv, 900), heads_of(dv, hkv, 900), heads_of(split_o, hq, nq),
                     TensorRef{half_lse.data(), DType::f32, {nq, hq / 2}}},
                    stream);
    check(cudaMemcpyAsync(half_lse_host.data(), half_lse.data(), half_lse_host.size() * 4, cudaMemcpyDeviceToHost, stream));
    check(cudaStreamSynchronize(stream));
    for (std::int64_t i = 0; i < nq; ++i) {
      CHECK(std::memcmp(half_lse_host.data() + i * hq / 2, whole_lse_host.data() + i * hq + rank * hq / 2,
                        std::size_t(hq / 2) * 4) == 0);
    }
  }
  std::vector<std::uint16_t> whole_host(std::size_t(nq * hq * d)), split_host(whole_host.size());
  check(cudaMemcpy(whole_host.data(), whole_o.data(), whole_host.size() * 2, cudaMemcpyDeviceToHost));
  check(cudaMemcpy(split_host.data(), split_o.data(), split_host.size() * 2, cudaMemcpyDeviceToHost));
  CHECK(whole_host == split_host);
  cudaStreamDestroy(stream);
}

TEST_CASE("workspace errors name the limit, the heads, the tensor") {
  const cuda::Context context(0);
  Tree small(kHeads), large(kHeads);
  small.add_node_range(0, kNoParent, 0, 300);
  small.add_query(0);
  large.add_node_range(0, kNoParent, 0, 300);
  for (int b = 0; b < 5; ++b) {
    large.add_node_range(1 + b, 0, 300 + b, 1);
    large.add_query(1 + b);
  }
  const Plan small_plan = plan(small), large_plan = plan(large);
  cuda::Workspace workspace(context, cuda::WorkspaceLimits::of(small_plan));
  cudaStream_t stream = nullptr;
  check(cudaStreamCreate(&stream));
  CHECK_THROWS_WITH_AS(workspace.enqueue({}, stream), doctest::Contains("before any plan was uploaded"), Error);
  CHECK_THROWS_WITH_AS(workspace.upload(large_plan, stream),
                       doctest::Contains("graph-stable workspace: plan has 5 queries, the workspace holds 1"), Error);
  Tree other({16, 1, 128});
  other.add_node_range(0, kNoParent, 0, 10);
  other.add_query(0);
  CHECK_THROWS_WITH_AS(workspace.upload(plan(other), stream), doctest::Contains("plan has heads 16/1/128"), Error);
  workspace.upload(small_plan, stream);
  cuda::DeviceBuffer q(32 * 128 * 2), kv(400 * 8 * 128 * 2), o(32 * 128 * 4);
  const TensorRef tq{q.data(), DType::f16, {1, 32, 128}}, tkv{kv.data(), DType::f16, {400, 8, 128}};
  const TensorRef to{o.data(), DType::f32, {1, 32, 128}};
  CHECK_THROWS_WITH_AS(workspace.enqueue({tq, TensorRef{kv.data(), DType::f16, {200, 8, 128}}, tkv, to, {}}, stream),
                       doctest::Contains("K has 200 slots but the tree reads slot 299"), Error);
  CHECK_THROWS_WITH_AS(workspace.enqueue({TensorRef{q.data(), DType::f16, {1, 32, 128}, 4100}, tkv, tkv, to, {}}, stream),
                       doctest::Contains("Q is [1, 32, 128] f16 row stride 4100: the row stride must be at least 4096 and a multiple of 8"),
                       Error);
  CHECK_THROWS_WITH_AS(workspace.enqueue({tq, tkv, TensorRef{kv.data(), DType::f16, {400, 8, 128}, 1000}, to, {}}, stream),
                       doctest::Contains("V is [400, 8, 128] f16 row stride 1000: the row stride must be at least 1024"),
                       Error);
  CHECK_THROWS_WITH_AS(workspace.enqueue({tq, tkv, TensorRef{kv.data(), DType::f16, {400, 8, 128}, 2048}, to, {}}, stream),
                       doctest::Contains("K and V rows must be equally far apart (got K [400, 8, 128] f16, V [400, 8, 128] "
                                         "f16 row stride 2048)"),
                       Error);
  CHECK_THROWS_AS(cuda::Context(cuda::device_count()), Error);
  check(cudaStreamSynchronize(stream));
  cudaStreamDestroy(stream);
}

TEST_CASE("workspace limits: a plan's own, the larger of two, headroom, and the first count that does not fit") {
  Tree tree(kHeads);
  tree.add_node_range(0, kNoParent, 0, 1000);
  for (int b = 0; b < 70; ++b) {
    tree.add_node_range(1 + b, 0, 1000 + b, 1);
    tree.add_query(1 + b);
  }
  const Plan p = plan(tree);
  const cuda::WorkspaceLimits l = cuda::WorkspaceLimits::of(p);
  CHECK(l.queries == 70);
  CHECK(l.tile_entries == std::int32_t(p.tile_query.size()));
  CHECK(l.partials == p.num_partials);
  CHECK(l.kv_tiles >= (1000 + 63) / 64);
  CHECK(l.passes >= 1);
  CHECK(l.merge_fanin == p.max_merge_fanin());
  CHECK(l.tokens == p.num_tokens());
  CHECK(l.segments == p.num_segments());
  CHECK(l.masks == std::int32_t(p.segment_mask.size()));
  CHECK(l.first_excess(l).empty());
  const cuda::WorkspaceLimits bigger = l.with_headroom(1.5);
  CHECK(bigger.queries == 105);
  CHECK(bigger.first_excess(l).empty());
  CHECK(l.first_excess(bigger) == "plan has 105 queries, the workspace holds 70");
  CHECK(bigger.device_bytes() > l.device_bytes());
}

TEST_CASE("the C API's treeattn_enqueue: device pointers on a stream, the plan uploaded when it changes") {
  treeattn_tree* tree = nullptr;
  REQUIRE(treeattn_tree_create(32, 8, 128, 0.0f, &tree) == TREEATTN_OK);
  REQUIRE(treeattn_tree_add_node_range(tree, 0, -1, 0, 900) == TREEATTN_OK);
  for (int b = 0; b < 6; ++b) {
    REQUIRE(treeattn_tree_add_node_range(tree, 1 + b, 0, 900 + 10 * b, 10) == TREEATTN_OK);
    REQUIRE(treeattn_tree_add_query(tree, 1 + b, -1) == TREEATTN_OK);
  }
  treeattn_context_options options;
  treeattn_context_options_init(&options);
  options.backend = TREEATTN_BACKEND_CUDA;
  treeattn_context* context = nullptr;
  REQUIRE_MESSAGE(treeattn_context_create(&options, &context) == TREEATTN_OK, treeattn_last_error());
  CHECK(std::string(treeattn_context_backend(context)) == "cuda");
  treeattn_plan* plan = nullptr;
  REQUIRE(treeattn_plan_create(context, tree, nullptr, &plan) == TREEATTN_OK);

  const HostArray q = random_array(DType::f16, {6, 32, 128}, 7), k = random_array(DType::f16, {960, 8, 128}, 8),
                  v = random_array(DType::f16, {960, 8, 128}, 9);
  cuda::DeviceBuffer dq = to_device(q), dk = to_device(k), dv = to_device(v), dout(6 * 32 * 128 * 4);
  const treeattn_tensor tq = c_tensor(dq.data(), TREEATTN_DTYPE_F16, 3, 6, 32, 128);
  const treeattn_tensor tk = c_tensor(dk.data(), TREEATTN_DTYPE_F16, 3, 960, 8, 128);
  const treeattn_tensor tv = c_tensor(dv.data(), TREEATTN_DTYPE_F16, 3, 960, 8, 128);
  const treeattn_tensor to = c_tensor(dout.data(), TREEATTN_DTYPE_F32, 3, 6, 32, 128);
  cudaStream_t stream = nullptr;
  check(cudaStreamCreate(&stream));
  for (int layer = 0; layer < 3; ++layer) {  // the plan is uploaded by the first call only
    REQUIRE_MESSAGE(treeattn_enqueue(context, plan, &tq, &tk, &tv, &to, nullptr, stream) == TREEATTN_OK, treeattn_last_error());
  }
  HostArray got(DType::f32, {6, 32, 128});
  check(cudaMemcpyAsync(got.bytes.data(), dout.data(), got.bytes.size(), cudaMemcpyDeviceToHost, stream));
  check(cudaStreamSynchronize(stream));
  cudaStreamDestroy(stream);
  HostArray want(DType::f32, {6, 32, 128});
  HostArray hq = q, hk = k, hv = v;
  treeattn_plan_destroy(plan);
  const Plan cpp_plan = treeattn::plan([] {
    Tree t({32, 8, 128});
    t.add_node_range(0, kNoParent, 0, 900);
    for (int b = 0; b < 6; ++b) {
      t.add_node_range(1 + b, 0, 900 + 10 * b, 10);
      t.add_query(1 + b);
    }
    return t;
  }());
  make_backend(BackendKind::cpu)->run(cpp_plan, {hq.view(), hk.view(), hv.view(), want.view(), {}});
  double worst = 0.0;
  for (std::int64_t i = 0; i < got.numel(); ++i) {
    worst = std::max(worst, double(std::abs(reinterpret_cast<const float*>(got.bytes.data())[i] -
                                            reinterpret_cast<const float*>(want.bytes.data())[i])));
  }
  CHECK(worst <= tolerance(DType::f16));
  treeattn_context_destroy(context);
  treeattn_tree_destroy(tree);
}

namespace {

treeattn_context* c_cuda_context() {
  treeattn_context_options options;
  treeattn_context_options_init(&options);
  options.backend = TREEATTN_BACKEND_CUDA;
  treeattn_context* context = nullptr;
  REQUIRE_MESSAGE(treeattn_context_create(&options, &context) == TREEATTN_OK, treeattn_last_error());
  return context;
}

// One treeattn_enqueue on a stream of the test's, the inputs copied up and O and LSE back.
void call_on_stream(treeattn_context* context, const treeattn_plan* plan, Inputs& in, Outputs& out) {
  cuda::DeviceBuffer dq = to_device(in.q), dk = to_device(in.k), dv = to_device(in.v);
  cuda::DeviceBuffer dout(out.o.bytes.size()), dlse(out.lse.bytes.size());
  const treeattn_tensor tq = c_tensor(dq.data(), TREEATTN_DTYPE_F16, 3, in.q.shape[0], in.q.shape[1], in.q.shape[2]);
  const treeattn_tensor tk = c_tensor(dk.data(), TREEATTN_DTYPE_F16, 3, in.k.shape[0], in.k.shape[1], in.k.shape[2]);
  const treeattn_tensor tv = c_tensor(dv.data(), TREEATTN_DTYPE_F16, 3, in.v.shape[0], in.v.shape[1], in.v.shape[2]);
  const treeattn_tensor to = c_tensor(dout.data(), TREEATTN_DTYPE_F32, 3, out.o.shape[0], out.o.shape[1], out.o.shape[2]);
  const treeattn_tensor tl = c_tensor(dlse.data(), TREEATTN_DTYPE_F32, 2, out.lse.shape[0], out.lse.shape[1]);
  cudaStream_t stream = nullptr;
  check(cudaStreamCreate(&stream));
  REQUIRE_MESSAGE(treeattn_enqueue(context, plan, &tq, &tk, &tv, &to, &tl, stream) == TREEATTN_OK, treeattn_last_error());
  check(cudaMemcpyAsync(out.o.bytes.data(), dout.data(), out.o.bytes.size(), cudaMemcpyDeviceToHost, stream));
  check(cudaMemcpyAsync(out.lse.bytes.data(), dlse.data(), out.lse.bytes.size(), cudaMemcpyDeviceToHost, stream));
  check(cudaStreamSynchronize(stream));
  cudaStreamDestroy(stream);
}

}  // namespace

TEST_CASE("the C API's planner on the caller's stream: a decode replay, every step against a whole plan and the oracle") {
  treeattn_context* context = c_cuda_context();
  for (treeattn_strategy s : {TREEATTN_STRATEGY_FLATTEN, TREEATTN_STRATEGY_GREEDY}) {
    CAPTURE(int(s));
    CReplayOptions options;
    options.strategy = s;
    const int held = check_c_planner_replay(context, call_on_stream, options);
    if (s != TREEATTN_STRATEGY_GREEDY) CHECK(held == 0);  // greedy keeps its layout choice between choices
    options.bitwise_updates = false;
    check_c_planner_replay(context, call_on_stream, options);
  }
  // Host arrays on the same context and workspace, between device calls.
  CReplayOptions host;
  host.steps = 8;
  CHECK(check_c_planner_replay(context, call_on_host, host) == 0);
  treeattn_context_destroy(context);
}

TEST_CASE("the C API graph-stable: a captured graph replays every step's plan, uploaded by treeattn_upload") {
  auto scenario = few_shot_scenario(600, 8, 12);
  const Replay replay = replay_trees(*scenario, 12);
  treeattn_context* context = c_cuda_context();
  std::vector<treeattn_plan*> plans;
  for (const Tree& t : replay.trees) {
    treeattn_tree* c = nullptr;
    REQUIRE(treeattn_tree_create(t.heads.heads_q, t.heads.heads_kv, t.heads.head_dim, 0.0f, &c) == TREEATTN_OK);
    for (std::size_t i = 0; i < t.node_count(); ++i) {
      const TreeNode& n = t.nodes()[i];
      std::vector<std::int64_t> slots;
      for (std::int64_t token = 0; token < n.length; ++token) slots.push_back(t.slot(i, token));
      REQUIRE(treeattn_tree_add_node(c, n.id, n.parent, slots.data(), std::int64_t(slots.size())) == TREEATTN_OK);
    }
    for (const TreeQuery& q : t.queries()) REQUIRE(treeattn_tree_add_query(c, q.node, q.upto) == TREEATTN_OK);
    plans.push_back(nullptr);
    REQUIRE_MESSAGE(treeattn_plan_create(context, c, nullptr, &plans.back()) == TREEATTN_OK, treeattn_last_error());
    treeattn_tree_destroy(c);
  }
  std::vector<const treeattn_plan*> all(plans.begin(), plans.end());
  REQUIRE_MESSAGE(treeattn_context_graph_stable(context, all.data(), std::int64_t(all.size()), 1.0) == TREEATTN_OK,
                  treeattn_last_error());
  CHECK(treeattn_context_graph_stable(context, all.data(), std::int64_t(all.size()), 0.5) == TREEATTN_ERROR_INVALID_ARGUMENT);

  std::int64_t max_queries = 0;
  for (const Tree& t : replay.trees) max_queries = std::max<std::int64_t>(max_queries, std::int64_t(t.query_count()));
  const HeadConfig h = replay.trees.front().heads;
  HostArray k = random_array(DType::f16, {replay.slots, h.heads_kv, h.head_dim}, 5),
            v = random_array(DType::f16, {replay.slots, h.heads_kv, h.head_dim}, 6);
  const HostArray q = random_array(DType::f16, {max_queries, h.heads_q, h.head_dim}, 7);
  cuda::DeviceBuffer dq = to_device(q), dk = to_device(k), dv = to_device(v), dout(std::size_t(max_queries) * h.heads_q * h.head_dim * 4);
  cudaStream_t stream = nullptr;
  check(cudaStreamCreate(&stream));
  cudaGraphExec_t exec = nullptr;
  for (std::size_t step = 0; step < replay.trees.size(); ++step) {
    CAPTURE(step);
    const std::int64_t nq = std::int64_t(replay.trees[step].query_count());
    const treeattn_tensor tq = c_tensor(dq.data(), TREEATTN_DTYPE_F16, 3, nq, h.heads_q, h.head_dim);
    const treeattn_tensor tk = c_tensor(dk.data(), TREEATTN_DTYPE_F16, 3, replay.slots, h.heads_kv, h.head_dim);
    const treeattn_tensor tv = c_tensor(dv.data(), TREEATTN_DTYPE_F16, 3, replay.slots, h.heads_kv, h.head_dim);
    const treeattn_tensor to = c_tensor(dout.data(), TREEATTN_DTYPE_F32, 3, nq, h.heads_q, h.head_dim);
    REQUIRE_MESSAGE(treeattn_upload(context, plans[step], stream) == TREEATTN_OK, treeattn_last_error());
    if (exec == nullptr) {  // the query count is the first step's in the captured launches: the grids are the limits'
      cudaGraph_t graph = nullptr;
      check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      const treeattn_status captured = treeattn_enqueue(context, plans[step], &tq, &tk, &tv, &to, nullptr, stream);
      check(cudaStreamEndCapture(stream, &graph));
      REQUIRE_MESSAGE(captured == TREEATTN_OK, treeattn_last_error());
      check(cudaGraphInstantiate(&exec, graph, 0));
      cudaGraphDestroy(graph);
    }
    REQUIRE(replay.trees[step].query_count() == replay.trees[0].query_count());  // Q's shape is captured
    check(cudaGraphLaunch(exec, stream));
    HostArray got(DType::f32, {nq, h.heads_q, h.head_dim});
    check(cudaMemcpyAsync(got.bytes.data(), dout.data(), got.bytes.size(), cudaMemcpyDeviceToHost, stream));
    check(cudaStreamSynchronize(stream));
    HostArray hq = random_array(DType::f16, {nq, h.heads_q, h.head_dim}, 0);
    std::memcpy(hq.bytes.data(), q.bytes.data(), hq.bytes.size());
    const OracleResult want = oracle_attention(replay.trees[step], hq.view(), k.view(), v.view());
    CHECK(max_abs_error(got.view(), want.o) <= tolerance(DType::f16));
  }
  // Inside a capture, a plan the workspace does not hold is refused: it must be uploaded first.
  cudaGraph_t refused = nullptr;
  const treeattn_tensor tq = c_tensor(dq.data(), TREEATTN_DTYPE_F16, 3, std::int64_t(replay.trees[0].query_count()), h.heads_q, h.head_dim);
  const treeattn_tensor tk = c_tensor(dk.data(), TREEATTN_DTYPE_F16, 3, replay.slots, h.heads_kv, h.head_dim);
  const treeattn_tensor to = c_tensor(dout.data(), TREEATTN_DTYPE_F32, 3, std::int64_t(replay.trees[0].query_count()), h.heads_q, h.head_dim);
  check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const treeattn_status status = treeattn_enqueue(context, plans[0], &tq, &tk, &tk, &to, nullptr, stream);
  cudaStreamEndCapture(stream, &refused);
  if (refused != nullptr) cudaGraphDestroy(refused);
  CHECK(status == TREEATTN_ERROR_INVALID_ARGUMENT);
  CHECK(std::string(treeattn_last_error()).find("upload(plan) before capturing") != std::string::npos);
  cudaGraphExecDestroy(exec);
  cudaStreamDestroy(stream);
  for (treeattn_plan* p : plans) treeattn_plan_destroy(p);
  treeattn_context_destroy(context);
}

TEST_CASE("a CUDA treeattn::Context: graph-stable limits by count or by plans, host and device calls on one workspace") {
  ContextOptions options;
  options.backend = BackendKind::cuda;
  Context context(options);
  auto scenario = few_shot_scenario(600, 8, 6);
  const Replay replay = replay_trees(*scenario, 6);
  std::vector<Plan> plans;
  for (const Tree& t : replay.trees) plans.push_back(context.plan(t));
  // Limits of the first plan only: a later, larger plan is refused by its count.
  context.graph_stable(cuda::WorkspaceLimits::of(plans.front()));
  CHECK(context.is_graph_stable());
  cudaStream_t stream = nullptr;
  check(cudaStreamCreate(&stream));
  CHECK_THROWS_WITH_AS(context.upload(plans.back(), stream), doctest::Contains("graph-stable workspace: plan has"), Error);
  std::vector<const Plan*> all;
  for (const Plan& p : plans) all.push_back(&p);
  context.graph_stable(all, 1.0);

  const HeadConfig h = replay.trees.front().heads;
  HostArray k = random_array(DType::f16, {replay.slots, h.heads_kv, h.head_dim}, 3),
            v = random_array(DType::f16, {replay.slots, h.heads_kv, h.head_dim}, 4);
  cuda::DeviceBuffer dk = to_device(k), dv = to_device(v);
  for (std::size_t step = 0; step < plans.size(); ++step) {
    CAPTURE(step);
    const Plan& plan = plans[step];
    HostArray q = random_array(DType::f16, {plan.num_queries, h.heads_q, h.head_dim}, 10 + step);
    cuda::DeviceBuffer dq = to_device(q), dout(q.numel() * 4);
    const std::vector<std::int64_t> qshape = {plan.num_queries, h.heads_q, h.head_dim};
    const AttentionArgs device{TensorRef{dq.data(), DType::f16, qshape}, TensorRef{dk.data(), DType::f16, k.shape},
                               TensorRef{dv.data(), DType::f16, v.shape}, TensorRef{dout.data(), DType::f32, qshape}, {}};
    context.upload(plan, stream);
    for (int layer = 0; layer < 2; ++layer) context.enqueue(plan, device, stream);  // the uploaded plan: no upload
    HostArray got(DType::f32, qshape);
    check(cudaMemcpyAsync(got.bytes.data(), dout.data(), got.bytes.size(), cudaMemcpyDeviceToHost, stream));
    check(cudaStreamSynchronize(stream));
    HostArray host_out(DType::f32, qshape);
    context.run(plan, {q.view(), k.view(), v.view(), host_out.view(), {}});  // host arrays, same workspace
    CHECK(got.bytes == host_out.bytes);
    const OracleResult want = oracle_attention(replay.trees[step], q.view(), k.view(), v.view());
    CHECK(max_abs_error(got.view(), want.o) <= tolerance(DType::f16));
  }
  cudaStreamDestroy(stream);
}

TEST_CASE("four threads, each with its own CUDA Context and stream, share a plan and the inputs: bitwise one thread's") {
  const Tree tree = determinism_forest();
  const HeadConfig h = tree.heads;
  Inputs in = make_inputs(tree, DType::f16, 9);
  ContextOptions options;
  options.backend = BackendKind::cuda;
  const Plan plan = Context(options).plan(tree);
  const cuda::DeviceBuffer dq = to_device(in.q), dk = to_device(in.k), dv = to_device(in.v);
  const std::vector<std::int64_t> oshape = {plan.num_queries, h.heads_q, h.head_dim};
  // One call on one context: the reference.
  auto run_on = [&](Context& context, cudaStream_t stream, cuda::DeviceBuffer& out) {
    const AttentionArgs args{TensorRef{dq.data(), DType::f16, in.q.shape}, TensorRef{dk.data(), DType::f16, in.k.shape},
                             TensorRef{dv.data(), DType::f16, in.v.shape}, TensorRef{out.data(), DType::f32, oshape}, {}};
    context.enqueue(plan, args, stream);
  };
  auto read = [&](const cuda::DeviceBuffer& out, cudaStream_t stream) {
    HostArray got(DType::f32, oshape);
    check(cudaMemcpyAsync(got.bytes.data(), out.data(), got.bytes.size(), cudaMemcpyDeviceToHost, stream));
    check(cudaStreamSynchronize(stream));
    return got;
  };
  cudaStream_t stream = nullptr;
  check(cudaStreamCreate(&stream));
  Context alone(options);
  cuda::DeviceBuffer out(std::size_t(in.q.numel()) * 4);
  run_on(alone, stream, out);
  const HostArray reference = read(out, stream);
  cudaStreamDestroy(stream);

  std::atomic<int> mismatches{0};
  std::vector<std::string> errors(4);
  auto worker = [&](int t) {
    try {
      Context context(options);
      cudaStream_t mine = nullptr;
      if (cudaStreamCreateWithFlags(&mine, cudaStreamNonBlocking) != cudaSuccess) throw std::runtime_error("stream");
      cuda::DeviceBuffer o(std::size_t(in.q.numel()) * 4);
      for (int r = 0; r < 50; ++r) {
        run_on(context, mine, o);
        if (r % 10 == 9 && read(o, mine).bytes != reference.bytes) ++mismatches;
      }
      cudaStreamDestroy(mine);
    } catch (const std::exception& e) {
      errors[std::size_t(t)] = e.what();
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back(worker, t);
  for (std::thread& t : threads) t.join();
  for (const std::string& e : errors) CHECK_MESSAGE(e.empty(), e);
  CHECK(mismatches.load() == 0);
}

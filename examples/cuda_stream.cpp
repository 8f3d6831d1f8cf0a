// treeattn inside a CUDA serving loop: the KV cache and Q live on the GPU, a
// decode step's layers are one CUDA graph captured once, and each step hands
// its changes to an IncrementalPlanner and uploads the updated plan into the
// same workspace before replaying the graph. Checks O of the last step
// against treeattn's CPU backend on the from-scratch plan of the same tree.
//
// Exit status: 0 when O matches, 1 on a mismatch or error, 77 without a CUDA device.

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdio>
#include <stdexcept>
#include <vector>

#include "treeattn/cuda.hpp"
#include "treeattn/tools.hpp"
#include "treeattn/treeattn.hpp"

namespace {

void check(cudaError_t err) {
  if (err != cudaSuccess) throw std::runtime_error(cudaGetErrorString(err));
}

// Decode step `s`: a 2 000-token prompt and 16 branches of 10 + s tokens.
treeattn::Tree step_tree(const treeattn::HeadConfig& heads, int s) {
  treeattn::Tree tree(heads);
  tree.add_node_range(0, treeattn::kNoParent, 0, 2000);
  for (int b = 0; b < 16; ++b) {
    tree.add_node_range(1 + b, 0, 2000 + b * 128, 10 + s);
    tree.add_query(1 + b);
  }
  return tree;
}

}  // namespace

int main() {
  if (treeattn::cuda::device_count() == 0) {
    std::printf("cuda_stream: no CUDA device here: skipping\n");
    return 77;
  }
  try {
    const treeattn::HeadConfig heads{32, 8, 128, 0.0f};  // llama3-8b
    const int layers = 4, steps = 20;
    const std::int64_t slots = 2000 + 16 * 128, nq = 16;
    const treeattn::cuda::Context context(/*device=*/0);
    treeattn::PlanOptions options;
    options.cost = context.cost_model();
    // The tree across decode steps: each step hands it that step's changes.
    treeattn::IncrementalPlanner planner(heads, options);

    // Capacities for every step's plan: here the largest step's, with headroom.
    const treeattn::cuda::WorkspaceLimits limits =
        treeattn::cuda::WorkspaceLimits::of(treeattn::plan(step_tree(heads, steps - 1), options)).with_headroom(1.25);
    treeattn::cuda::Workspace workspace(context, limits);

    // The engine's tensors: one KV pool per layer, Q and O per step.
    const treeattn::HostArray k = treeattn::random_array(treeattn::DType::f16, {slots, heads.heads_kv, heads.head_dim}, 1);
    const treeattn::HostArray v = treeattn::random_array(treeattn::DType::f16, {slots, heads.heads_kv, heads.head_dim}, 2);
    const treeattn::HostArray q = treeattn::random_array(treeattn::DType::f16, {nq, heads.heads_q, heads.head_dim}, 3);
    void *dk = nullptr, *dv = nullptr, *dq = nullptr, *dout = nullptr;
    check(cudaMalloc(&dk, k.bytes.size()));
    check(cudaMalloc(&dv, v.bytes.size()));
    check(cudaMalloc(&dq, q.bytes.size()));
    check(cudaMalloc(&dout, std::size_t(nq) * heads.heads_q * heads.head_dim * 2));
    check(cudaMemcpy(dk, k.bytes.data(), k.bytes.size(), cudaMemcpyHostToDevice));
    check(cudaMemcpy(dv, v.bytes.data(), v.bytes.size(), cudaMemcpyHostToDevice));
    check(cudaMemcpy(dq, q.bytes.data(), q.bytes.size(), cudaMemcpyHostToDevice));
    const treeattn::AttentionArgs tensors{
        {dq, treeattn::DType::f16, {nq, heads.heads_q, heads.head_dim}},
        {dk, treeattn::DType::f16, {slots, heads.heads_kv, heads.head_dim}},
        {dv, treeattn::DType::f16, {slots, heads.heads_kv, heads.head_dim}},
        {dout, treeattn::DType::f16, {nq, heads.heads_q, heads.head_dim}},
        {}};

    cudaStream_t stream = nullptr;
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaGraphExec_t graph = nullptr;
    treeattn::Plan plan;
    for (int s = 0; s < steps; ++s) {
      if (s == 0) {
        planner.add_tree(step_tree(heads, 0));
      } else {
        for (int b = 0; b < 16; ++b) planner.append_range(1 + b, 2000 + b * 128 + 10 + s - 1, 1);  // a token a branch
      }
      plan = planner.update();         // the host plans step s from its changes ...
      workspace.upload(plan, stream);  // ... and uploads it without waiting
      if (graph == nullptr) {                              // the layers, captured once
        cudaGraph_t captured = nullptr;
        check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        for (int l = 0; l < layers; ++l) workspace.enqueue(tensors, stream);  // (a model: each layer its own K/V)
        check(cudaStreamEndCapture(stream, &captured));
        check(cudaGraphInstantiate(&graph, captured, 0));
        check(cudaGraphDestroy(captured));
      }
      check(cudaGraphLaunch(graph, stream));
    }
    std::vector<std::uint16_t> got(std::size_t(nq) * heads.heads_q * heads.head_dim);
    check(cudaMemcpyAsync(got.data(), dout, got.size() * 2, cudaMemcpyDeviceToHost, stream));
    check(cudaStreamSynchronize(stream));

    treeattn::HostArray want(treeattn::DType::f32, {nq, heads.heads_q, heads.head_dim});
    treeattn::HostArray hq = q, hk = k, hv = v;
    const treeattn::Plan reference = treeattn::plan(step_tree(heads, steps - 1), options);
    treeattn::ContextOptions on_cpu;
    on_cpu.backend = treeattn::BackendKind::cpu;
    treeattn::Context(on_cpu).run(reference, {hq.view(), hk.view(), hv.view(), want.view(), {}});
    double worst = 0.0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      const double w = double(reinterpret_cast<const float*>(want.bytes.data())[i]);
      worst = std::max(worst, std::fabs(double(treeattn::load_as_float(got.data(), treeattn::DType::f16, i)) - w));
    }
    std::printf("cuda_stream: %d steps of %d layers from one graph, max abs error against the CPU backend %.2e\n",
                steps, layers, worst);
    cudaGraphExecDestroy(graph);
    cudaStreamDestroy(stream);
    for (void* p : {dk, dv, dq, dout}) cudaFree(p);
    return worst <= 2e-3 ? 0 : 1;  // f16 outputs: within the f16 tolerance every backend meets (docs/testing.md)
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_stream: error: %s\n", e.what());
    return 1;
  }
}

// The CUDA backend: the conformance suite (test_conformance.cpp) plus what is
// particular to it. Without a CUDA device the program says so and exits 77,
// which ctest reports as skipped.

#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "../backends/cuda/cuda_backend.hpp"
#include "support/conformance.hpp"
#include "treeattn/error.hpp"
#include "treeattn/workloads.hpp"

using namespace treeattn;
using namespace treeattn::test;

std::unique_ptr<Backend> treeattn::test::make_test_backend() { return make_backend(BackendKind::cuda); }

TEST_CASE("f32 inputs and oversized blocks are refused with the limit named") {
  auto backend = make_test_backend();
  Tree tree({4, 2, 64});
  tree.add_node_range(0, kNoParent, 0, 1000);
  tree.add_query(0);
  Inputs f32 = make_inputs(tree, DType::f32, 1);
  CHECK_THROWS_WITH_AS(run_backend(*backend, tree, f32, PlanOptions{}), doctest::Contains("must be f16 or bf16"), Error);
  Inputs f16 = make_inputs(tree, DType::f16, 1);
  CHECK_THROWS_WITH_AS(run_backend(*backend, tree, f16, PlanOptions{Strategy::node, 1000, kMaxQueryTile, 0}),
                       doctest::Contains("more than the kernel's 256"), Error);
}

TEST_CASE("the graph-replayed layers compute what run() computes") {
  auto backend = make_test_backend();
  RandomForestOptions o;
  o.seed = 9;
  o.nodes = 60;
  o.queries = 40;
  o.heads = {32, 8, 128, 0.0f};
  const Tree tree = random_forest(o);
  Inputs in = make_inputs(tree, DType::f16, 2);
  const Outputs direct = run_backend(*backend, tree, in, PlanOptions{});
  const Plan plan = treeattn::plan(tree);
  HostArray out(DType::f32, direct.o.shape);
  const std::vector<double> us =
      backend->time_layers(plan, AttentionArgs{in.q.view(), in.k.view(), in.v.view(), out.view(), {}}, 4, 3);
  REQUIRE(us.size() == 3);
  for (double t : us) CHECK(t > 0.0);
  CHECK(out.bytes == direct.o.bytes);
  CHECK(backend->peak_gbps() > 0.0);
}

int main(int argc, char** argv) {
  if (cuda::device_count() == 0) {
    std::printf("test_cuda: no CUDA device here: skipping the CUDA suite (it runs on a GPU machine)\n");
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}

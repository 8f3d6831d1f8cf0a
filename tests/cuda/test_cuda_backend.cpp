// The CUDA backend: the conformance suite (test_conformance.cpp) plus what is
// particular to it. Without a CUDA device the program says so and exits 77,
// which ctest reports as skipped.

#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>

#include "../backends/cuda/cuda_backend.hpp"
#include "support/conformance.hpp"
#include "treeattn/error.hpp"

using namespace treeattn;
using namespace treeattn::test;

std::unique_ptr<Backend> treeattn::test::make_test_backend() { return make_backend(BackendKind::cuda); }

TEST_CASE("f32 inputs are refused with the types named") {
  auto backend = make_test_backend();
  Tree tree({4, 2, 64});
  tree.add_node_range(0, kNoParent, 0, 1000);
  tree.add_query(0);
  Inputs f32 = make_inputs(tree, DType::f32, 1);
  CHECK_THROWS_WITH_AS(run_backend(*backend, tree, f32, PlanOptions{}), doctest::Contains("must be f16 or bf16"), Error);
}

TEST_CASE("the graph-replayed layers compute what run() computes") {
  auto backend = make_test_backend();
  check_timed_layers_match_run(*backend);
  CHECK(backend->peak_gbps() > 0.0);
}

TEST_CASE("the cost model's slots are the device's: SMs x stage-1 CTAs per SM") {
  int sms = 0;
  REQUIRE(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) == cudaSuccess);
  const double slots = make_test_backend()->cost_model().slots;
  CHECK(slots >= sms);  // at least one CTA per SM
  CHECK(std::fmod(slots, double(sms)) == 0.0);
  CHECK(slots <= 8.0 * sms);
}

int main(int argc, char** argv) {
  if (cuda::device_count() == 0) {
    std::printf("test_cuda: no CUDA device here: skipping the CUDA suite (it runs on a GPU machine)\n");
    return 77;
  }
  doctest::Context context(argc, argv);
  return context.run();
}

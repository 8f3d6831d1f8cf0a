// The CPU backend: the conformance suite (test_conformance.cpp) plus what is
// particular to it: f32 inputs, and bitwise identical output for any thread count.

#include <doctest/doctest.h>

#include "support/conformance.hpp"
#include "treeattn/error.hpp"
#include "treeattn/workloads.hpp"

using namespace treeattn;
using namespace treeattn::test;

std::unique_ptr<Backend> treeattn::test::make_test_backend() { return make_backend(BackendKind::cpu); }

TEST_CASE("f32 inputs") {
  auto backend = make_test_backend();
  RandomForestOptions o;
  o.seed = 4;
  o.nodes = 20;
  o.queries = 10;
  check_against_oracle(*backend, random_forest(o), DType::f32, 9);
}

TEST_CASE("a head split on strided rows of the whole Q, K, V and O is bitwise the whole run's heads") {
  check_head_split_is_bitwise(*make_test_backend());
}

TEST_CASE("output is bitwise identical for any thread count") {
  const Tree tree = determinism_forest();
  Inputs in = make_inputs(tree, DType::f16, 1);
  auto with_threads = [](int threads) {
    BackendOptions options;
    options.threads = threads;
    return make_backend(BackendKind::cpu, options);
  };
  for (Strategy s : {Strategy::flatten, Strategy::sequence}) {
    const Outputs reference = run_backend(*with_threads(1), tree, in, PlanOptions{s, 32, kMaxQueryTile, 0});
    for (int threads : {2, 3, 8}) {
      const Outputs again = run_backend(*with_threads(threads), tree, in, PlanOptions{s, 32, kMaxQueryTile, 0});
      CHECK(again.o.bytes == reference.o.bytes);
      CHECK(again.lse.bytes == reference.lse.bytes);
    }
  }
}

TEST_CASE("a backend this build lacks, or a Vulkan device that does not exist, is named") {
  BackendOptions options;
  options.device = 99;
#ifdef TREEATTN_TEST_HAVE_VULKAN
  bool loader = true;  // a machine without a usable Vulkan loader (wine's) says so instead
  try {
    vulkan_devices();
  } catch (const Error& e) {
    loader = false;
    MESSAGE("no usable Vulkan loader here: " << e.what());
  }
  if (loader) {
    CHECK_THROWS_WITH_AS(make_backend(BackendKind::vulkan, options), doctest::Contains("Vulkan device 99 does not exist"), Error);
  } else {
    CHECK_THROWS_WITH_AS(make_backend(BackendKind::vulkan, options), doctest::Contains("Vulkan"), Error);
  }
#else
  CHECK_THROWS_WITH_AS(make_backend(BackendKind::vulkan, options), doctest::Contains("built without the vulkan backend"), Error);
#endif
}

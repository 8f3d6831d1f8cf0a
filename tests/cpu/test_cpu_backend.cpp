// The CPU backend: the conformance suites (test_conformance.cpp,
// test_exact_coverage.cpp) plus what is particular to it: f32 inputs, bitwise
// identical output for any thread count, and plans corrupted by one token that
// the exact-coverage check catches.

#include <doctest/doctest.h>

#include "support/conformance.hpp"
#include "support/exact_coverage.hpp"
#include "treeattn/error.hpp"
#include "treeattn/planner.hpp"
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

TEST_CASE("exact coverage: a plan one token short, one token long or with a foreign segment fails the check") {
  // One 1 320-token block: the prompt's segment, then the branches'. The f16
  // oracle tolerance (2e-3) passes a token dropped from it; this check does not.
  auto backend = make_test_backend();
  const Tree tree = few_shot_tree({8, 2, 64, 0.0f}, 1300, 4, 5);
  CoverageCheck check(tree, DType::f16);
  const Plan good = treeattn::plan(tree, PlanOptions{Strategy::flatten, 1320});
  REQUIRE(good.num_blocks() == 1);
  REQUIRE(good.segment_token_end[0] == 1300);
  REQUIRE(check.error(*backend, good) == "");

  Plan dropped = good;  // the prompt's last token
  dropped.segment_token_end[0] -= 1;
  validate(dropped);
  CHECK(check.error(*backend, dropped).find("expected ln(1305)") != std::string::npos);

  Plan doubled = good;  // the first branch's first token, twice for every query
  doubled.segment_token_end[0] += 1;
  doubled.block_tokens += 1;
  validate(doubled);
  CHECK(check.error(*backend, doubled).find("expected ln(1305)") != std::string::npos);

  Plan foreign = good;  // query 0 also sees the second branch
  const std::int32_t second_branch = good.block_segment_begin[0] + 2;
  REQUIRE(good.segment_mask[std::size_t(second_branch)] == 2u);
  foreign.segment_mask[std::size_t(second_branch)] |= 1u;
  validate(foreign);
  CHECK(check.error(*backend, foreign).find("query 0 head 0: LSE") != std::string::npos);

  // A token swapped for a foreign one: the count is right, the V bits are not.
  Plan swapped = good;
  swapped.token_slot[0] = 1300 + 5 * 3;  // the last branch's first token, which query 0 does not see
  validate(swapped);
  CHECK(check.error(*backend, swapped).find("query 0 head 0 column") != std::string::npos);
}

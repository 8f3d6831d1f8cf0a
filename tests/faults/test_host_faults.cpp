// Host allocation failures: the Nth operator new of a decode step (the C API's
// planner changes, its update and a run on the CPU backend) throws
// std::bad_alloc, for every N until the step needs no more. Every C call
// either succeeds or fails with TREEATTN_ERROR_OUT_OF_MEMORY and a message,
// nothing crashes, and the same context then runs a fresh planner's plan
// bitwise as before. (Leaks: run it in an AddressSanitizer build.)

#include <doctest/doctest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

#include "support/c_tensor.hpp"
#include "treeattn/treeattn.h"

namespace {

std::atomic<long> g_countdown{-1};  // allocations left before the failing one; -1: none fails

}  // namespace

// Pairs with the operator delete below, which GCC cannot see is malloc's partner.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace {
// malloc's memory, or null where this is the allocation chosen to fail.
void* allocate(std::size_t bytes) noexcept {
  if (g_countdown.load(std::memory_order_relaxed) >= 0 && g_countdown.fetch_sub(1) == 0) return nullptr;
  return std::malloc(bytes == 0 ? 1 : bytes);
}
void* allocate_or_throw(std::size_t bytes) {
  if (void* p = allocate(bytes)) return p;
  throw std::bad_alloc();
}
}  // namespace

void* operator new(std::size_t bytes) { return allocate_or_throw(bytes); }
void* operator new[](std::size_t bytes) { return allocate_or_throw(bytes); }
void* operator new(std::size_t bytes, const std::nothrow_t&) noexcept { return allocate(bytes); }
void* operator new[](std::size_t bytes, const std::nothrow_t&) noexcept { return allocate(bytes); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }

namespace {

using treeattn::test::c_tensor;

constexpr int kHq = 4, kHkv = 2, kD = 64, kSlots = 512;

struct Arrays {
  std::vector<std::uint16_t> q = std::vector<std::uint16_t>(8 * kHq * kD), k, v;
  std::vector<float> o = std::vector<float>(8 * kHq * kD), lse = std::vector<float>(8 * kHq);
  Arrays() : k(std::size_t(kSlots) * kHkv * kD), v(std::size_t(kSlots) * kHkv * kD) {
    for (std::size_t i = 0; i < q.size(); ++i) q[i] = std::uint16_t(0x3000 + (i * 37) % 1024);  // f16 in [0.125, 0.25)
    for (std::size_t i = 0; i < k.size(); ++i) k[i] = std::uint16_t(0x3400 + (i * 53) % 1024);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::uint16_t(0x3800 + (i * 71) % 1024);
  }
};

// The statuses a call may return under allocation failures.
bool acceptable(treeattn_status s) {
  if (s == TREEATTN_OK) return true;
  return s == TREEATTN_ERROR_OUT_OF_MEMORY && std::string(treeattn_last_error()).size() > 0;
}

// A decode step through the C API: a planner from a small tree, the step's
// changes, its update and a run. Returns false at the first failed call
// (each failed call's status checked), true when the whole step ran.
bool decode_step(treeattn_context* context, Arrays& a, std::vector<float>* out) {
  bool ok = true;
  auto call = [&](treeattn_status s) {
    if (!ok) return;
    CHECK_MESSAGE(acceptable(s), "status ", int(s), ": ", treeattn_last_error());
    ok = s == TREEATTN_OK;
  };
  treeattn_tree* tree = nullptr;
  treeattn_planner* planner = nullptr;
  const treeattn_plan* plan = nullptr;
  call(treeattn_tree_create(kHq, kHkv, kD, 0.0f, &tree));
  call(treeattn_tree_add_node_range(tree, 0, -1, 0, 200));
  call(treeattn_tree_add_node_range(tree, 1, 0, 200, 20));
  call(treeattn_tree_add_query(tree, 1, -1));
  call(treeattn_planner_create(context, tree, nullptr, &planner));
  call(treeattn_planner_update(planner, &plan));
  call(treeattn_planner_append_range(planner, 1, 220, 1));
  call(treeattn_planner_add_node_range(planner, 2, 0, 300, 30));
  const std::int64_t nodes[] = {1, 2, 2}, upto[] = {-1, -1, 10};
  call(treeattn_planner_set_queries(planner, nodes, upto, 3));
  call(treeattn_planner_update(planner, &plan));
  const treeattn_tensor q = c_tensor(a.q.data(), TREEATTN_DTYPE_F16, 3, 3, kHq, kD);
  const treeattn_tensor k = c_tensor(a.k.data(), TREEATTN_DTYPE_F16, 3, kSlots, kHkv, kD);
  const treeattn_tensor v = c_tensor(a.v.data(), TREEATTN_DTYPE_F16, 3, kSlots, kHkv, kD);
  const treeattn_tensor o = c_tensor(a.o.data(), TREEATTN_DTYPE_F32, 3, 3, kHq, kD);
  const treeattn_tensor lse = c_tensor(a.lse.data(), TREEATTN_DTYPE_F32, 2, 3, kHq);
  if (ok) call(treeattn_run(context, plan, &q, &k, &v, &o, &lse));
  if (ok && out != nullptr) *out = std::vector<float>(a.o.begin(), a.o.begin() + 3 * kHq * kD);
  treeattn_planner_destroy(planner);
  treeattn_tree_destroy(tree);
  return ok;
}

}  // namespace

TEST_CASE("every allocation of a decode step may fail: a status and a message, then the same context works") {
  treeattn_context_options options;
  treeattn_context_options_init(&options);
  options.backend = TREEATTN_BACKEND_CPU;
  options.threads = 2;
  treeattn_context* context = nullptr;
  REQUIRE(treeattn_context_create(&options, &context) == TREEATTN_OK);
  Arrays a;
  std::vector<float> reference, again;
  REQUIRE(decode_step(context, a, &reference));
  long failures = 0;
  for (long n = 0;; ++n) {
    g_countdown.store(n);
    const bool completed = decode_step(context, a, nullptr);
    const bool injected = g_countdown.load() < 0;
    g_countdown.store(-1);
    if (completed && !injected) break;  // the step needs fewer than n + 1 allocations: every one was failed once
    failures += completed ? 0 : 1;
    REQUIRE(n < 100000);
    again.clear();
    REQUIRE(decode_step(context, a, &again));  // the same context, afterwards
    REQUIRE(again == reference);
  }
  MESSAGE(failures << " allocations of a decode step failed one at a time, each survived");
  CHECK(failures > 10);
  treeattn_context_destroy(context);
}

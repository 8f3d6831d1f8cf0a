// Threads sharing what the library lets them share: read-only trees, plans
// and input arrays, each thread with its own Context (the CPU backend, whose
// own worker pool runs under it) and its own planners. Every run's O and LSE
// equal one thread's, bit for bit. scripts/tsan.sh runs this program under
// ThreadSanitizer (a CPU-only build); ctest runs it as it is.

#include <doctest/doctest.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "support/conformance.hpp"
#include "treeattn/context.hpp"
#include "treeattn/workloads.hpp"

using namespace treeattn;
using namespace treeattn::test;

namespace {

constexpr int kThreads = 4;

// The runs in all: TREEATTN_THREAD_RUNS where the harness sets it, else 10 000.
int total_runs() {
  const char* runs = std::getenv("TREEATTN_THREAD_RUNS");
  return runs != nullptr && std::atoi(runs) > 0 ? std::atoi(runs) : 10000;
}

Context cpu_context(int threads) {
  ContextOptions options;
  options.backend = BackendKind::cpu;
  options.cpu.threads = threads;
  return Context(options);
}

struct Case {
  Tree tree;
  Plan plan;
  Inputs in;
  Outputs alone;
};

// One run of `c.plan` on `context`: the shared inputs are read, never written.
Outputs run_case(Context& context, const Case& c) {
  const HeadConfig& h = c.tree.heads;
  const std::int64_t nq = std::int64_t(c.tree.query_count());
  Outputs out{HostArray(DType::f32, {nq, h.heads_q, h.head_dim}), HostArray(DType::f32, {nq, h.heads_q})};
  auto view = [](const HostArray& a) { return TensorRef{const_cast<unsigned char*>(a.bytes.data()), a.dtype, a.shape}; };
  context.run(c.plan, AttentionArgs{view(c.in.q), view(c.in.k), view(c.in.v), out.o.view(), out.lse.view()});
  return out;
}

Case make_case(std::uint64_t seed, Strategy strategy) {
  RandomForestOptions o;
  o.seed = seed;
  o.nodes = 24;
  o.roots = 2;
  o.queries = 12;
  o.max_tokens = 24;
  o.heads = {4, 2, 64, 0.0f};
  Case c{random_forest(o), Plan{}, Inputs{}, Outputs{}};
  c.plan = plan(c.tree, PlanOptions{strategy, 16, kMaxQueryTile, 0});
  c.in = make_inputs(c.tree, DType::f16, seed);
  Context alone = cpu_context(1);
  c.alone = run_case(alone, c);
  return c;
}

}  // namespace

TEST_CASE("threads with their own contexts share trees, plans and inputs: every run bitwise one thread's") {
  std::vector<Case> cases;
  std::uint64_t seed = 1;
  for (Strategy s : all_strategies()) cases.push_back(make_case(seed++, s));
  const int runs = total_runs();
  std::atomic<int> mismatches{0}, done{0};
  auto worker = [&](int t) {
    Context context = cpu_context(t % 2 == 0 ? 1 : 2);  // half of them with a worker pool of their own
    for (int r = t; r < runs; r += kThreads) {
      const Case& c = cases[std::size_t(r) % cases.size()];
      if (r % 50 == 0) {  // now and then a plan of the shared tree, made in this thread
        const Plan again = treeattn::plan(c.tree, PlanOptions{c.plan.strategy, 16, kMaxQueryTile, 0});
        if (again.token_slot != c.plan.token_slot || again.segment_mask != c.plan.segment_mask) ++mismatches;
      }
      const Outputs got = run_case(context, c);
      if (got.o.bytes != c.alone.o.bytes || got.lse.bytes != c.alone.lse.bytes) ++mismatches;
      ++done;
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (std::thread& t : threads) t.join();
  MESSAGE(done.load() << " runs on " << kThreads << " threads");
  CHECK(done.load() == runs);
  CHECK(mismatches.load() == 0);
}

TEST_CASE("threads with their own incremental planners on shared trees: every update bitwise one thread's") {
  std::vector<Case> cases;
  for (std::uint64_t seed : {11, 12, 13, 14}) cases.push_back(make_case(seed, Strategy::flatten));
  std::atomic<int> mismatches{0};
  auto worker = [&](int t) {
    const Case& c = cases[std::size_t(t) % cases.size()];
    IncrementalOptions bitwise;
    bitwise.hold_flatten_blocks = false;
    bitwise.hold_greedy_groups = false;
    IncrementalPlanner planner(c.tree.heads, PlanOptions{Strategy::flatten, 16, kMaxQueryTile, 0}, bitwise);
    planner.add_tree(c.tree);
    for (int r = 0; r < 40; ++r) {
      const Plan& p = planner.update();
      if (p.token_slot != c.plan.token_slot || p.tile_query != c.plan.tile_query) ++mismatches;
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
  for (std::thread& t : threads) t.join();
  CHECK(mismatches.load() == 0);
}

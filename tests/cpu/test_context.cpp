// treeattn::Context on the CPU backend: host runs through it, its planners plan
// with its device model, and the device-path calls a CPU context cannot make
// are refused by name.

#include <doctest/doctest.h>

#include "support/conformance.hpp"
#include "support/oracle.hpp"
#include "treeattn/context.hpp"
#include "treeattn/error.hpp"
#include "treeattn/workloads.hpp"

using namespace treeattn;
using namespace treeattn::test;

namespace {

Context cpu_context() {
  ContextOptions options;
  options.backend = BackendKind::cpu;
  options.cpu.threads = 2;
  return Context(options);
}

}  // namespace

TEST_CASE("a Context's plans and planners use its device model, and its runs agree with the oracle") {
  Context context = cpu_context();
  CHECK(context.backend() == BackendKind::cpu);
  RandomForestOptions o;
  o.seed = 12;
  o.nodes = 30;
  o.queries = 20;
  o.heads = {8, 2, 64, 0.0f};
  const Tree tree = random_forest(o);
  PlanOptions options;
  options.cost.pass_ns = 1.0;  // replaced by the context's model
  const Plan plan = context.plan(tree, options);
  PlanOptions with_model;
  with_model.cost = context.cost_model();
  const Plan expected = treeattn::plan(tree, with_model);
  CHECK(plan.item_tile_rows == expected.item_tile_rows);
  CHECK(plan.block_tokens == expected.block_tokens);
  CHECK(plan.id != 0);
  CHECK(plan.id != expected.id);

  Inputs in = make_inputs(tree, DType::f16, 3);
  const OracleResult want = oracle_attention(tree, in.q.view(), in.k.view(), in.v.view());
  HostArray out(DType::f32, {o.queries, 8, 64}), lse(DType::f32, {o.queries, 8});
  context.run(plan, {in.q.view(), in.k.view(), in.v.view(), out.view(), lse.view()});
  CHECK(max_abs_error(out.view(), want.o) <= tolerance(DType::f16));
  CHECK(max_abs_error(lse.view(), want.lse) <= tolerance(DType::f16));

  IncrementalPlanner planner = context.planner(tree);
  const Plan& updated = planner.update();
  CHECK(updated.id != 0);
  CHECK(updated.token_slot == expected.token_slot);
  CHECK(planner.options().cost.pass_ns == context.cost_model().pass_ns);
  const std::uint64_t first = updated.id;
  CHECK(planner.update().id != first);  // every update is a plan a workspace must take again
}

TEST_CASE("a CPU Context refuses the device path by name") {
  Context context = cpu_context();
  Tree tree({4, 2, 64});
  tree.add_node_range(0, kNoParent, 0, 16);
  tree.add_query(0);
  const Plan plan = context.plan(tree);
  const AttentionArgs none{};
  CHECK_THROWS_WITH_AS(context.enqueue(plan, none, nullptr), doctest::Contains("needs a CUDA context; this one runs cpu"),
                       Error);
  CHECK_THROWS_WITH_AS(context.upload(plan, nullptr), doctest::Contains("needs a CUDA context"), Error);
  CHECK_THROWS_WITH_AS(context.record(plan, none, nullptr), doctest::Contains("needs a Vulkan context"), Error);
  CHECK_THROWS_WITH_AS(context.graph_stable({&plan}), doctest::Contains("graph-stable workspaces are the CUDA backend's"),
                       Error);
  CHECK_THROWS_WITH_AS(context.graph_stable(std::vector<const Plan*>{}), doctest::Contains("at least one plan"), Error);
  CHECK_THROWS_WITH_AS(context.graph_stable({&plan}, 0.5), doctest::Contains("headroom 0.5 must be >= 1"), Error);
  CHECK_FALSE(context.is_graph_stable());
}

// treeattn bench: planning and execution time per strategy on seeded random
// forests, as a table and as JSON. (The paper workloads of DESIGN §6 plug in
// here as further workload kinds.)

#include <algorithm>
#include <chrono>
#include <fstream>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_support.hpp"
#include "commands.hpp"
#include "treeattn/treeattn.hpp"

namespace treeattn::cli {
namespace {

struct BenchOptions {
  RandomForestOptions forest;
  std::vector<std::string> strategies = {"flatten"};
  int block_tokens = 256;
  int query_tile = kMaxQueryTile;
  int repeat = 20;
  std::string backend = "none";
  int run_repeat = 3;
  int threads = 0;
  std::string json;
};

struct Timing {
  double min_us, median_us;
};

template <typename F>
Timing time_it(int repeat, F&& body) {
  std::vector<double> us;
  for (int r = 0; r < repeat; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    body();
    const auto t1 = std::chrono::steady_clock::now();
    us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  std::sort(us.begin(), us.end());
  return {us.front(), us[us.size() / 2]};
}

void run_bench(const BenchOptions& o) {
  const Tree tree = random_forest(o.forest);
  const std::int64_t tokens = total_tokens(tree);
  fmt::print(stderr, "bench: random forest, seed {}, {} nodes in {} trees, {} queries, {} tokens\n", o.forest.seed,
             tree.node_count(), o.forest.roots, tree.query_count(), tokens);
  std::unique_ptr<Backend> backend;
  HostArray q, k, v, out;
  if (o.backend != "none") {
    BackendOptions backend_options;
    backend_options.threads = o.threads;
    backend = make_backend(parse_backend(o.backend), backend_options);
    const HeadConfig& h = tree.heads;
    const std::int64_t nq = std::int64_t(tree.query_count());
    q = random_array(DType::f16, {nq, h.heads_q, h.head_dim}, 1);
    k = random_array(DType::f16, {std::max<std::int64_t>(tokens, 1), h.heads_kv, h.head_dim}, 2);
    v = random_array(DType::f16, {std::max<std::int64_t>(tokens, 1), h.heads_kv, h.head_dim}, 3);
    out = HostArray(DType::f32, {nq, h.heads_q, h.head_dim});
  }

  nlohmann::json rows = nlohmann::json::array();
  fmt::print("{:<11} {:>12} {:>12} {:>8} {:>8} {:>10} {:>13}\n", "strategy", "plan_min_us", "plan_med_us", "items",
             "blocks", "kv_io_x", backend ? "run_med_ms" : "");
  for (std::size_t i = 0; i < o.strategies.size(); ++i) {
    PlanOptions options;
    options.strategy = parse_strategy(o.strategies[i]);
    options.block_tokens = o.block_tokens;
    options.query_tile = o.query_tile;
    fmt::print(stderr, "[{}/{}] {}...\n", i + 1, o.strategies.size(), o.strategies[i]);
    Plan plan;
    const Timing plan_time = time_it(o.repeat, [&] { plan = treeattn::plan(tree, options); });
    const PlanStats st = compute_stats(plan);
    const double io = st.tokens ? double(st.sequence_read_tokens) / double(st.plan_read_tokens) : 0.0;
    nlohmann::json row = {{"workload", "random_forest"}, {"strategy", o.strategies[i]},
                          {"nodes", tree.node_count()},   {"queries", tree.query_count()},
                          {"tokens", st.tokens},          {"items", st.items},
                          {"blocks", st.blocks},          {"plan_min_us", plan_time.min_us},
                          {"plan_median_us", plan_time.median_us}, {"kv_io_reduction", io}};
    std::string run_cell;
    if (backend) {
      const Timing run_time = time_it(o.run_repeat, [&] {
        backend->run(plan, AttentionArgs{q.view(), k.view(), v.view(), out.view(), {}});
      });
      row["backend"] = backend->name();
      row["run_median_us"] = run_time.median_us;
      row["run_min_us"] = run_time.min_us;
      run_cell = fmt::format("{:.2f}", run_time.median_us / 1000.0);
    }
    fmt::print("{:<11} {:>12.1f} {:>12.1f} {:>8} {:>8} {:>10.2f} {:>13}\n", o.strategies[i], plan_time.min_us,
               plan_time.median_us, st.items, st.blocks, io, run_cell);
    rows.push_back(std::move(row));
  }
  if (!o.json.empty()) {
    PendingOutputs outputs;
    outputs.write_text(o.json, rows.dump(2) + "\n");
    outputs.commit();
  }
}

}  // namespace

Command add_bench_command(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  o->forest.nodes = 10000;
  o->forest.queries = 2000;
  o->forest.roots = 100;
  o->forest.min_tokens = 1;
  o->forest.max_tokens = 32;
  o->forest.heads = {32, 8, 128, 0.0f};
  o->forest.listed_fraction = 0.0;
  CLI::App* sub = app.add_subcommand(
      "bench",
      "Time planning (and optionally execution) per strategy on a seeded random forest.\n"
      "Prints a table; --json FILE also writes the rows. Plan time is the min and median of --repeat runs.\n"
      "Example: treeattn bench --nodes 10000 --queries 2000 --strategy flatten,sequence --repeat 50");
  sub->add_option("--nodes", o->forest.nodes, "Nodes in the forest")->check(CLI::Range(1, 10000000))->capture_default_str();
  sub->add_option("--queries", o->forest.queries, "Queries")->check(CLI::Range(0, 10000000))->capture_default_str();
  sub->add_option("--trees", o->forest.roots, "Independent trees (requests) in the forest")->check(CLI::Range(1, 10000000))->capture_default_str();
  sub->add_option("--min-tokens", o->forest.min_tokens, "Fewest tokens per node")->check(CLI::NonNegativeNumber)->capture_default_str();
  sub->add_option("--max-tokens", o->forest.max_tokens, "Most tokens per node")->check(CLI::NonNegativeNumber)->capture_default_str();
  sub->add_option("--seed", o->forest.seed, "Random seed")->capture_default_str();
  sub->add_option("--strategy", o->strategies, "Strategies to compare (comma-separated)")
      ->delimiter(',')
      ->check(CLI::IsMember(strategy_names()))
      ->capture_default_str();
  sub->add_option("--block-tokens", o->block_tokens, "Max KV tokens per block")->check(CLI::Range(1, 65536))->capture_default_str();
  sub->add_option("--repeat", o->repeat, "Plan repetitions")->check(CLI::Range(1, 100000))->capture_default_str();
  sub->add_option("--backend", o->backend, "Also time execution on a backend (none: planning only)")
      ->check(CLI::IsMember({"none", "auto", "cpu", "vulkan", "cuda"}))
      ->capture_default_str();
  sub->add_option("--run-repeat", o->run_repeat, "Execution repetitions")->check(CLI::Range(1, 100000))->capture_default_str();
  sub->add_option("--threads", o->threads, "CPU backend threads (0: one per hardware thread)")->check(CLI::NonNegativeNumber);
  sub->add_option("--json", o->json, "Also write the rows as JSON to this file");
  return {sub, [o] {
            if (o->forest.min_tokens > o->forest.max_tokens) {
              throw Error(ErrorCategory::InvalidArgument,
                          fmt::format("--min-tokens {} exceeds --max-tokens {}", o->forest.min_tokens, o->forest.max_tokens));
            }
            if (o->forest.roots > o->forest.nodes) {
              throw Error(ErrorCategory::InvalidArgument,
                          fmt::format("--trees {} exceeds --nodes {}", o->forest.roots, o->forest.nodes));
            }
            run_bench(*o);
          }};
}

}  // namespace treeattn::cli

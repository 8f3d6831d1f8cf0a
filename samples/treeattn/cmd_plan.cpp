// treeattn plan: show how a strategy splits a tree into work items, how even
// the split is, and how much KV traffic it saves over a Q-guided kernel.

#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_support.hpp"
#include "commands.hpp"
#include "plan_svg.hpp"
#include "treeattn/tools.hpp"
#include "treeattn/treeattn.hpp"

namespace treeattn::cli {
namespace {

struct PlanCommandOptions {
  std::string tree;
  PlanFlags plan;
  std::string backend = "none";  // whose device model plans: none (the H100 defaults) or a backend
  BackendFlags backend_flags;
  bool json = false;
  int items = 24;
  std::string svg;
};

constexpr std::size_t kKvElementBytes = 2;  // the IO model assumes f16/bf16 KV

nlohmann::json plan_json(const Tree& tree, const Plan& plan, const PlanStats& st, const CostEstimate& est) {
  using nlohmann::json;
  const auto node_id = [&](std::int32_t index) { return tree.nodes()[std::size_t(index)].id; };
  json items = json::array();
  for (std::int32_t i = 0; i < plan.num_items(); ++i) {
    const std::int32_t block = plan.item_block[std::size_t(i)];
    json segments = json::array();
    const std::int32_t s0 = plan.block_segment_begin[std::size_t(block)];
    for (std::int32_t s = s0; s < plan.block_segment_begin[std::size_t(block) + 1]; ++s) {
      segments.push_back({{"node", node_id(plan.segment_node[std::size_t(s)])},
                          {"token_begin", plan.segment_token_begin[std::size_t(s)]},
                          {"token_end", plan.segment_token_end[std::size_t(s)]},
                          {"mask", fmt::format("{:#x}", plan.segment_mask[std::size_t(plan.item_mask_begin[std::size_t(i)] + s - s0)])}});
    }
    json queries = json::array(), partials = json::array();
    for (std::int32_t k = plan.item_query_begin[std::size_t(i)]; k < plan.item_query_begin[std::size_t(i) + 1]; ++k) {
      queries.push_back(plan.tile_query[std::size_t(k)]);
      partials.push_back(plan.tile_partial[std::size_t(k)]);
    }
    items.push_back({{"block", block}, {"tokens", plan.block_token_count(block)},
                     {"tile_rows", plan.item_tile_rows[std::size_t(i)]}, {"queries", queries}, {"partials", partials},
                     {"segments", segments}});
  }
  return {
      {"strategy", to_string(plan.strategy)},
      {"block_tokens", plan.block_tokens},
      {"query_tile", plan.query_tile},
      {"heads_q", plan.heads.heads_q},
      {"heads_kv", plan.heads.heads_kv},
      {"head_dim", plan.heads.head_dim},
      {"scale", plan.heads.scale},
      {"num_queries", plan.num_queries},
      {"stats",
       {{"tokens", st.tokens},
        {"segments", st.segments},
        {"blocks", st.blocks},
        {"items", st.items},
        {"partials", st.partials},
        {"direct_queries", st.direct_queries},
        {"passes_per_kv_head", st.passes},
        {"small_tile_items", st.small_tile_items},
        {"model_us", est.time_us},
        {"model_item_order_us", est.item_order_us},
        {"block_tokens_min", st.block_tokens_min},
        {"block_tokens_mean", st.block_tokens_mean},
        {"block_tokens_max", st.block_tokens_max},
        {"item_queries_min", st.item_queries_min},
        {"item_queries_mean", st.item_queries_mean},
        {"item_queries_max", st.item_queries_max},
        {"unique_kv_bytes", st.kv_bytes(st.tokens, kKvElementBytes)},
        {"plan_read_kv_bytes", st.kv_bytes(st.plan_read_tokens, kKvElementBytes)},
        {"sequence_read_kv_bytes", st.kv_bytes(st.sequence_read_tokens, kKvElementBytes)}}},
      {"items", items},
      {"merge", {{"begin", plan.merge_begin}, {"partials", plan.merge_partial}}},
      {"launch_order", plan.launch_order},
      {"token_slot", plan.token_slot},
  };
}

void print_plan(const Tree& tree, const Plan& plan, const PlanStats& st, const CostEstimate& est, int max_items) {
  const double unique = double(st.kv_bytes(st.tokens, kKvElementBytes));
  const double reads = double(st.kv_bytes(st.plan_read_tokens, kKvElementBytes));
  const double sequence = double(st.kv_bytes(st.sequence_read_tokens, kKvElementBytes));
  fmt::print("plan: strategy {}, block_tokens {}, query_tile {}\n", to_string(plan.strategy), plan.block_tokens,
             plan.query_tile);
  fmt::print("tree: {} nodes, {} queries, heads {}/{}, head_dim {}, scale {:.6g}\n", tree.node_count(),
             plan.num_queries, plan.heads.heads_q, plan.heads.heads_kv, plan.heads.head_dim, plan.heads.scale);
  fmt::print("work: {} visible tokens, {} segments, {} KV blocks, {} work items, {} partials, {} queries written directly\n",
             st.tokens, st.segments, st.blocks, st.items, st.partials, st.direct_queries);
  if (st.items == 0) return;
  fmt::print("load balance, KV tokens per work item: min {}, mean {:.1f}, max {}\n", st.block_tokens_min,
             st.block_tokens_mean, st.block_tokens_max);
  fmt::print("queries per work item: min {}, mean {:.1f}, max {}\n", st.item_queries_min, st.item_queries_mean,
             st.item_queries_max);
  fmt::print("IO model (f16 KV): unique tree KV {}; this plan reads {} ({:.2f}x); a Q-guided kernel reads {} ({:.2f}x)\n",
             format_bytes(unique), format_bytes(reads), reads / unique, format_bytes(sequence), sequence / unique);
  fmt::print("KV-IO reduction of this plan over Q-guided: {:.2f}x\n", sequence / reads);
  fmt::print("kernel passes per KV head: {} ({} items in {}-row tiles, {} in {}-row tiles); cost model: {:.1f} us\n",
             st.passes, st.items - st.small_tile_items, kLargeTileRows, st.small_tile_items, kSmallTileRows, est.time_us);
  if (est.longest_first) {
    fmt::print("launch order: blocks with the longest passes first (cost model: {:.1f} us in item order)\n",
               est.item_order_us);
  }

  fmt::print("\n{:>6} {:>6} {:>7} {:>8} {:>5}  segments as node:[begin,end) mask\n", "item", "block", "tokens", "queries",
             "rows");
  const std::int32_t shown = std::min(plan.num_items(), max_items);
  for (std::int32_t i = 0; i < shown; ++i) {
    const std::int32_t block = plan.item_block[std::size_t(i)];
    const std::int32_t s0 = plan.block_segment_begin[std::size_t(block)];
    const std::int32_t s1 = plan.block_segment_begin[std::size_t(block) + 1];
    std::string segments;
    for (std::int32_t s = s0; s < s1 && s < s0 + 6; ++s) {
      segments += fmt::format(" {}:[{},{}) {:#x}", tree.nodes()[std::size_t(plan.segment_node[std::size_t(s)])].id,
                              plan.segment_token_begin[std::size_t(s)], plan.segment_token_end[std::size_t(s)],
                              plan.segment_mask[std::size_t(plan.item_mask_begin[std::size_t(i)] + s - s0)]);
    }
    if (s1 - s0 > 6) segments += fmt::format(" ... ({} more)", s1 - s0 - 6);
    fmt::print("{:>6} {:>6} {:>7} {:>8} {:>5} {}\n", i, block, plan.block_token_count(block),
               plan.item_query_begin[std::size_t(i) + 1] - plan.item_query_begin[std::size_t(i)],
               plan.item_tile_rows[std::size_t(i)], segments);
  }
  if (shown < plan.num_items()) {
    fmt::print("... {} more work items (--items N shows more, --json lists all)\n", plan.num_items() - shown);
  }
}

void run_plan(const PlanCommandOptions& o) {
  const Tree tree = load_tree_json(o.tree);
  // With --backend, the device model `run --backend` plans with (its SMs, its
  // block sizes), so the plan shown is the one that would run there.
  const CostModel base = o.backend == "none" ? cost_model_for("h100")
                                             : make_backend(parse_backend(o.backend), o.backend_flags.options)->cost_model();
  const PlanOptions options = o.plan.options(0, base);
  const Plan plan = Planner(o.plan.plan_threads).plan(tree, options);
  const PlanStats st = compute_stats(plan);
  const CostEstimate est = estimate_cost(plan, options.cost);
  if (o.json) fmt::print("{}\n", plan_json(tree, plan, st, est).dump(2));
  else print_plan(tree, plan, st, est, o.items);
  if (!o.svg.empty()) {
    PendingOutputs outputs;
    outputs.write_text(o.svg, plan_svg(tree, plan, o.tree));
    outputs.commit();
  }
}

}  // namespace

Command add_plan_command(CLI::App& app) {
  auto o = std::make_shared<PlanCommandOptions>();
  CLI::App* sub = app.add_subcommand(
      "plan",
      "Plan a tree and show the work items (segments, queries, masks), the load balance and the IO model:\n"
      "unique tree KV bytes against what a Q-guided (sequence-based) kernel reads.\n"
      "Example: treeattn plan --tree examples/fewshot.json --strategy sequence");
  sub->add_option("--tree", o->tree, "Tree JSON")->required();
  o->plan.add_to(*sub);
  sub->add_option("--backend", o->backend,
                  "Plan with this backend's device model, as `run --backend` does (cuda: the GPU's SMs; vulkan: its "
                  "shaders' coefficients, two work groups an SM, 192-2048-token blocks for auto); none: the H100 "
                  "defaults, no device needed")
      ->check(CLI::IsMember({"none", "auto", "cpu", "vulkan", "cuda"}))
      ->capture_default_str();
  o->backend_flags.add_to(*sub);
  sub->add_flag("--json", o->json, "Print the whole plan as JSON instead of the summary");
  sub->add_option("--svg", o->svg, "Also draw the plan over the tree as SVG (KV coloured by the block that reads it)");
  sub->add_option("--items", o->items, "Work items listed in the summary")->check(nonnegative())->capture_default_str();
  return {sub, [o] { run_plan(*o); }};
}

}  // namespace treeattn::cli

#include "treeattn/cost_model.hpp"
#include "cost_model_internal.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "fail.hpp"
#include "lowering.hpp"
#include "plan_shape.hpp"
#include "treeattn/plan.hpp"

namespace treeattn {
namespace {

std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }

constexpr double kAutoLadderAnchor = 256.0;  // tokens: the rung of auto_block_candidates' ladder at k = 0

// How the kernels run an item of `rows` query rows in passes of `tile_rows`
// (row_passes()): every pass of 16 rows or fewer (a small tile, or a large
// tile's last rows) takes the small path.
struct PassSplit {
  std::int64_t large, small;
};
PassSplit split_passes(std::int64_t rows, std::int32_t tile_rows) {
  const std::int64_t passes = row_passes(rows, tile_rows);
  const std::int64_t last_rows = rows - (passes - 1) * tile_rows;
  const std::int64_t small = tile_rows <= kSmallTileRows ? passes : std::int64_t(passes > 0 && last_rows <= kSmallTileRows);
  return {passes - small, small};
}

struct Coefficient {
  const char* name;
  double CostModel::*field;
};
constexpr Coefficient kCoefficients[] = {
    {"pass_ns", &CostModel::pass_ns},       {"tile_ns_large", &CostModel::tile_ns_large},
    {"tile_ns_small", &CostModel::tile_ns_small}, {"partial_ns", &CostModel::partial_ns},
    {"slots", &CostModel::slots},           {"sms", &CostModel::sms},
    {"solo_speedup", &CostModel::solo_speedup}, {"split_solo_speedup", &CostModel::split_solo_speedup},
    {"refill_spread", &CostModel::refill_spread},
    {"switch_gain", &CostModel::switch_gain}, {"merge_ns", &CostModel::merge_ns},
    {"fanin_ns", &CostModel::fanin_ns},     {"reorder_gain", &CostModel::reorder_gain},
    {"fp8_small_tile_factor", &CostModel::fp8_small_tile_factor}, {"fp8_solo_speedup", &CostModel::fp8_solo_speedup},
};

// The token counts among the coefficients.
struct Count {
  const char* name;
  std::int32_t CostModel::*field;
};
constexpr Count kCounts[] = {
    {"min_split_tokens", &CostModel::min_split_tokens},
    {"auto_block_min", &CostModel::auto_block_min},
    {"auto_block_max", &CostModel::auto_block_max},
};

}  // namespace

void CostModel::set(const std::string& assignments) {
  std::size_t pos = 0;
  while (pos < assignments.size()) {
    std::size_t end = assignments.find(',', pos);
    if (end == std::string::npos) end = assignments.size();
    std::string item = assignments.substr(pos, end - pos);
    pos = end + 1;
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    if (item.empty()) continue;
    const std::size_t eq = item.find('=');
    const std::string key = item.substr(0, eq);
    if (eq == std::string::npos) {
      fail(ErrorCategory::InvalidArgument, "cost model: '{}' is not KEY=VALUE", item);
    }
    const std::string text = item.substr(eq + 1);
    char* parsed_end = nullptr;
    const double value = std::strtod(text.c_str(), &parsed_end);
    if (text.empty() || *parsed_end != '\0' || !std::isfinite(value) || value < 0) {
      fail(ErrorCategory::InvalidArgument, "cost model: {} = '{}' is not a non-negative number", key, text);
    }
    if (const auto* n = std::find_if(std::begin(kCounts), std::end(kCounts), [&](const Count& k) { return key == k.name; });
        n != std::end(kCounts)) {
      if (value < 1 || value > kMaxBlockTokens || value != std::floor(value)) {
        fail(ErrorCategory::InvalidArgument, "cost model: {} = '{}' is not an integer in [1, {}]", key, text,
             kMaxBlockTokens);
      }
      this->*(n->field) = std::int32_t(value);
      continue;
    }
    const auto* c = std::find_if(std::begin(kCoefficients), std::end(kCoefficients),
                                 [&](const Coefficient& k) { return key == k.name; });
    if (c == std::end(kCoefficients)) {
      fail(ErrorCategory::InvalidArgument,
           "cost model: unknown coefficient '{}' (choose pass_ns, tile_ns_large, tile_ns_small, partial_ns, slots, "
           "sms, solo_speedup, split_solo_speedup, refill_spread, switch_gain, merge_ns, fanin_ns, reorder_gain, "
           "fp8_small_tile_factor, fp8_solo_speedup, min_split_tokens, auto_block_min or auto_block_max)",
           key);
    }
    if ((c->field == &CostModel::slots || c->field == &CostModel::sms || c->field == &CostModel::solo_speedup ||
         c->field == &CostModel::split_solo_speedup || c->field == &CostModel::fp8_small_tile_factor) &&
        value <= 0) {
      fail(ErrorCategory::InvalidArgument, "cost model: {} must be positive", key);
    }
    this->*(c->field) = value;
  }
  if (auto_block_min > auto_block_max) {
    fail(ErrorCategory::InvalidArgument, "cost model: auto_block_min = {} is above auto_block_max = {}", auto_block_min,
         auto_block_max);
  }
}

std::string CostModel::to_string() const {
  std::string out;
  for (const Coefficient& c : kCoefficients) out += fmt::format("{}={:g},", c.name, this->*(c.field));
  for (const Count& n : kCounts) out += fmt::format("{}={},", n.name, this->*(n.field));
  out.pop_back();
  return out;
}

CostModel CostModel::for_kv(DType kv) const {
  CostModel model = *this;
  if (is_fp8(kv)) {
    model.tile_ns_small *= fp8_small_tile_factor;
    if (fp8_solo_speedup > 0.0) model.solo_speedup = fp8_solo_speedup;
  }
  return model;
}

namespace {

// The Vulkan coopmat shaders on an H100: two work groups an SM (225-231
// registers), every pass 64 rows, so a 16-row tile costs a 64-row one
// (docs/performance.md). The fragments shader plans as well with the
// shared-memory shader's tile costs: scaled by 0.85 or 0.75 they move DESIGN
// 1.001x and 0.993x.
CostModel h100_vulkan() {
  CostModel model;
  model.source = "h100-vulkan (fitted on Vulkan)";
  // A work group's start (its chain of loads before the first chunk) and end
  // take 5 000-9 000 and 600-2 500 cycles: 2 500 ns, above the tile fit's
  // 1 469 (benchmarks/h100/vulkan_start_latency_and_pass_cost.json).
  model.pass_ns = 2500.0;
  model.tile_ns_large = 3993.0;
  model.tile_ns_small = 3972.0;
  model.slots = 2.0 * model.sms;
  // partial_ns stays the CUDA kernels' 169: at the merge's own 86 ns a row,
  // greedy keeps the partials of deep trees it reads whole (0.65x on
  // 1/2/.../1024 x 16 tokens).
  // A lone work group runs 1.25x its full-SM pace: the speedup whose block
  // sizes come closest to the best measured size per tree (DESIGN 1.078x over
  // 256 tokens, the best size per tree 1.083x; docs/performance.md).
  model.solo_speedup = 1.25;
  model.split_solo_speedup = 1.25;
  // Each SM's freed slots refill in turn: spread refills mispredict four
  // greedy peer plans by 0.72-0.99x (docs/performance.md).
  model.refill_spread = 0.0;
  // Blocks from 192 tokens: a tree under one wave runs each work group alone
  // at the pace of its chunk chain, and shorter blocks spread it over more SMs
  // (DESIGN 1.029x flatten, 1.034x greedy over 256). Up to 2048: long prompts
  // under many queries and the wide 32/32 trees take longer blocks (the peer
  // shapes 1.020x over 1024; docs/performance.md).
  model.auto_block_min = 192;
  model.auto_block_max = 2048;
  // Greedy's own layouts are mispredicted more than on CUDA: flatten's is
  // kept unless the own one is predicted 1.4x faster (the 57 peer shapes
  // 1.095x, against 1.090x at 1.2; docs/performance.md).
  model.switch_gain = 1.4;
  // fp8 K and V plan with the f16 terms: the shaders decode fp8 rows into the
  // f16 tiles every pass reads (docs/performance.md, "Vulkan fp8").
  model.fp8_small_tile_factor = 1.0;
  model.fp8_solo_speedup = 0.0;
  return model;
}

}  // namespace

CostModel cost_model_for(const std::string& device) {
  if (device == "h100") return CostModel{};  // the member defaults
  if (device == "h100-vulkan") return h100_vulkan();
  fail(ErrorCategory::InvalidArgument, "cost model: no fitted model named '{}' (choose h100 or h100-vulkan)", device);
}

CostModel scaled_cost_model(const CostModel& base, double sms, double per_sm, const std::string& source) {
  CostModel model = base;
  model.sms = std::max(1.0, sms);
  model.slots = model.sms * std::max(1.0, per_sm);
  model.source = source;
  return model;
}

std::vector<std::int32_t> auto_block_candidates(const CostModel& model) {
  // The ladder's sizes strictly inside the range, between its two ends.
  std::vector<std::int32_t> sizes{model.auto_block_min};
  const int first = int(std::floor(4.0 * std::log2(double(model.auto_block_min) / kAutoLadderAnchor)));
  for (int step = first;; ++step) {
    const double exact = kAutoLadderAnchor * std::exp2(step / 4.0);
    if (exact >= model.auto_block_max) break;
    const std::int32_t size = exact < kKvTileTokens ? std::int32_t(std::lround(exact))
                                                    : std::int32_t(std::lround(exact / kKvTileTokens)) * kKvTileTokens;
    if (size > sizes.back() && size < model.auto_block_max) sizes.push_back(size);
  }
  if (model.auto_block_max > sizes.back()) sizes.push_back(model.auto_block_max);
  return sizes;
}

namespace {

// What one pass over a block costs on each path: its tiles are the block's
// tokens in 64-token KV tiles.
struct PassPrices {
  double small, large;
};
PassPrices pass_prices(const CostModel& model, std::int64_t block_tokens) {
  const double tiles = double(ceil_div(std::max<std::int64_t>(block_tokens, 1), kKvTileTokens));
  return {model.pass_ns + tiles * model.tile_ns_small, model.pass_ns + tiles * model.tile_ns_large};
}

// choose_tile() with the pass prices known: the planner's innermost step
// (greedy prices every edge at every candidate block size), so it is inline.
inline TileChoice cheaper_tile(const PassPrices& pass, std::int64_t rows) {
  auto price = [&](std::int32_t tile_rows) {
    const PassSplit split = split_passes(rows, tile_rows);
    return TileChoice{tile_rows, split.large + split.small,
                      double(split.large) * pass.large + double(split.small) * pass.small,
                      split.large > 0 ? pass.large : pass.small};
  };
  const TileChoice large = price(kLargeTileRows), small = price(kSmallTileRows);
  return small.cost_ns <= large.cost_ns ? small : large;  // a tie runs the small path anyway
}

}  // namespace

TileChoice choose_tile(const CostModel& model, std::int64_t rows, std::int64_t block_tokens) {
  return cheaper_tile(pass_prices(model, block_tokens), rows);
}

GroupCost group_cost(const CostModel& model, std::int64_t tokens, std::int64_t blocks, std::int64_t queries,
                     std::int32_t group, std::int32_t query_tile) {
  if (tokens <= 0 || queries <= 0) return {};
  blocks = std::clamp<std::int64_t>(blocks, 1, tokens);
  const PassPrices pass = pass_prices(model, ceil_div(tokens, blocks));
  const std::int64_t full_items = queries / query_tile, rest = queries % query_tile;
  GroupCost block;
  auto add = [&](const TileChoice& t, std::int64_t count) {
    block.passes += t.passes * count;
    block.cost_ns += t.cost_ns * double(count);
    block.max_pass_ns = std::max(block.max_pass_ns, t.max_pass_ns);
  };
  if (full_items > 0) add(cheaper_tile(pass, std::int64_t(query_tile) * group), full_items);
  if (rest > 0) add(cheaper_tile(pass, rest * group), 1);
  return {block.passes * blocks, block.cost_ns * double(blocks), block.max_pass_ns};
}

EdgeTrade edge_trade(const CostModel& model, const EdgeShape& e, std::int32_t group, std::int32_t block_tokens,
                     std::int32_t query_tile) {
  auto blocks = [&](std::int64_t tokens) { return ceil_div(tokens, block_tokens); };
  auto cost = [&](std::int64_t tokens, std::int64_t queries) {
    return group_cost(model, tokens, blocks(tokens), queries, group, query_tile).cost_ns;
  };
  const double apart = cost(e.parent_tokens, e.parent_queries) + cost(e.child_tokens, e.child_queries);
  const double joined = cost(e.parent_tokens, e.parent_queries - e.child_queries) +
                        cost(e.parent_tokens + e.child_tokens, e.child_queries);
  // Each of the child's queries reads the parent's blocks and its own in one
  // run instead of two: that many fewer partial rows per query head.
  return {joined - apart,
          e.child_queries * (blocks(e.parent_tokens) + blocks(e.child_tokens) - blocks(e.parent_tokens + e.child_tokens))};
}

bool prefer_concatenation(const CostModel& model, const EdgeShape& e, std::int32_t heads_q, std::int32_t heads_kv,
                          std::int32_t block_tokens, std::int32_t query_tile) {
  const std::int32_t group = heads_q / std::max(heads_kv, 1);
  return edge_trade(model, e, group, block_tokens, query_tile).worth_it(model, heads_q, heads_kv);
}

std::vector<std::int32_t> longest_first_order(const std::vector<std::int32_t>& item_block,
                                              const std::vector<double>& item_pass_ns) {
  // Each block's first item and its longest pass, sorted stably by that pass.
  struct Block {
    std::int32_t first_item;
    double pass_ns;
  };
  std::vector<Block> blocks;
  for (std::size_t i = 0; i < item_block.size(); ++i) {
    if (i == 0 || item_block[i] != item_block[i - 1]) blocks.push_back(Block{std::int32_t(i), 0.0});
    blocks.back().pass_ns = std::max(blocks.back().pass_ns, item_pass_ns[i]);
  }
  std::stable_sort(blocks.begin(), blocks.end(), [](const Block& a, const Block& b) { return a.pass_ns > b.pass_ns; });
  std::vector<std::int32_t> order;
  order.reserve(item_block.size());
  for (const Block& b : blocks) {
    const std::int32_t block = item_block[std::size_t(b.first_item)];
    for (std::size_t i = std::size_t(b.first_item); i < item_block.size() && item_block[i] == block; ++i) {
      order.push_back(std::int32_t(i));
    }
  }
  return order;
}

namespace {

// One item's CTAs as the placement sees them: its passes' cost, large passes
// first (a kernel's row order), each over the KV heads.
struct ItemCtas {
  double large_ns, small_ns;
  std::int64_t large, small;  // CTAs, all KV heads
  double longest_pass_ns() const { return std::max(large > 0 ? large_ns : 0.0, small > 0 ? small_ns : 0.0); }
  void append(std::vector<double>& cta_ns) const {
    cta_ns.insert(cta_ns.end(), std::size_t(large), large_ns);
    cta_ns.insert(cta_ns.end(), std::size_t(small), small_ns);
  }
};

// Each item's CTAs, in the shape's order.
std::vector<ItemCtas> item_ctas(const PlanShape& shape, const HeadConfig& heads, const CostModel& model) {
  const std::int64_t group = heads.group_size(), heads_kv = heads.heads_kv;
  std::vector<ItemCtas> items;
  items.reserve(shape.items.size());
  for (const ItemShape& item : shape.items) {
    const std::int64_t tiles = ceil_div(item.block_tokens, kKvTileTokens);
    const PassSplit split = split_passes(std::int64_t(item.queries) * group, item.tile_rows);
    items.push_back(ItemCtas{model.pass_ns + double(tiles) * model.tile_ns_large,
                             model.pass_ns + double(tiles) * model.tile_ns_small, split.large * heads_kv,
                             split.small * heads_kv});
  }
  return items;
}

// longest_first_order() of the shape's items, or empty where that is item order.
std::vector<std::int32_t> longest_first_launch(const PlanShape& shape, const std::vector<ItemCtas>& items) {
  std::vector<std::int32_t> block(items.size());
  std::vector<double> longest(items.size());
  for (std::size_t i = 0; i < items.size(); ++i) {
    block[i] = shape.items[i].block;
    longest[i] = items[i].longest_pass_ns();
  }
  std::vector<std::int32_t> order = longest_first_order(block, longest);
  if (std::is_sorted(order.begin(), order.end())) order.clear();
  return order;
}

std::vector<std::int32_t> longest_first_launch(const PlanShape& shape, const HeadConfig& heads, const CostModel& model) {
  return longest_first_launch(shape, item_ctas(shape, heads, model));
}

// estimate_shape(), and where it chooses the longest-first order, that order in `launch_order`.
CostEstimate estimate_with_order(const PlanShape& shape, const HeadConfig& heads, const CostModel& model,
                                 double to_beat_us, std::vector<std::int32_t>* launch_order) {
  CostEstimate e;
  std::vector<ItemCtas> items = item_ctas(shape, heads, model);
  // Launch order: the shape's item order, an item's passes in row order, each over the KV heads.
  std::vector<double> cta_ns;
  for (std::size_t i = 0; i < items.size(); ++i) {
    const ItemCtas& item = items[i];
    const std::int64_t tiles = ceil_div(shape.items[i].block_tokens, kKvTileTokens);
    e.small_passes += item.small;
    e.large_passes += item.large;
    e.small_tiles += item.small * tiles;
    e.large_tiles += item.large * tiles;
    item.append(cta_ns);
    const double pass_ns = item.large > 0 ? item.large_ns : item.small_ns;
    if (pass_ns > e.max_pass_ns) {
      e.max_pass_ns = pass_ns;
      e.longest_pass_tiles = tiles;
      e.longest_pass_large = item.large > 0;
    }
  }
  e.partial_rows = shape.partials * heads.heads_q;
  e.max_fanin = shape.max_fanin;
  const double partials_ns =
      double(e.partial_rows) * model.partial_ns / model.slots + double(shape.max_fanin) * model.fanin_ns;
  if (to_beat_us < std::numeric_limits<double>::infinity()) {
    // The margin keeps the placement's rounding from ever making a plan
    // skipped here the fastest: it would have lost by a billionth at least.
    // (The bound holds in any launch order.)
    const double bound_us = (step_lower_bound_ns(model, cta_ns) + partials_ns) / 1000.0;
    if (bound_us * (1.0 - 1e-9) >= to_beat_us) {
      e.time_us = bound_us;
      e.item_order_us = bound_us;
      return e;
    }
  }
  std::vector<std::int32_t> order;  // longest first, when it differs from item order and is asked for
  if (shape.order == LaunchOrder::longest_first || (shape.order == LaunchOrder::model && model.reorder_gain > 0.0)) {
    order = longest_first_launch(shape, items);
  }
  auto time_in = [&](const std::vector<std::int32_t>& launch) {
    if (launch.empty()) return (simulate_step_ns(model, cta_ns) + partials_ns) / 1000.0;
    std::vector<double> reordered;
    reordered.reserve(cta_ns.size());
    for (std::int32_t i : launch) items[std::size_t(i)].append(reordered);
    return (simulate_step_ns(model, reordered) + partials_ns) / 1000.0;
  };
  if (shape.order == LaunchOrder::longest_first) {  // the only order placed
    e.time_us = e.item_order_us = time_in(order);
    e.longest_first = !order.empty();
    if (launch_order != nullptr) *launch_order = order;
    return e;
  }
  e.time_us = e.item_order_us = time_in({});
  if (!order.empty()) {
    const double time_us = time_in(order);
    if (time_us * model.reorder_gain <= e.time_us) {
      e.time_us = time_us;
      e.longest_first = true;
      if (launch_order != nullptr) *launch_order = order;
    }
  }
  return e;
}

// The plan's items as a shape: in its launch order, to time it as it runs, or
// in item order. Either way in that order only (no reorder): the caller says
// where the launch order is still to be chosen.
PlanShape plan_shape(const Plan& plan, bool in_launch_order) {
  PlanShape shape;
  shape.items.reserve(std::size_t(plan.num_items()));
  for (std::int32_t k = 0; k < plan.num_items(); ++k) {
    const std::size_t i = std::size_t(in_launch_order ? plan.launch_item(k) : k);
    shape.items.push_back(ItemShape{plan.item_query_begin[i + 1] - plan.item_query_begin[i],
                                    plan.block_token_count(plan.item_block[i]), plan.item_tile_rows[i],
                                    plan.item_block[i]});
  }
  shape.partials = plan.num_partials;
  shape.max_fanin = plan.max_merge_fanin();
  shape.order = LaunchOrder::items;
  return shape;
}

}  // namespace

CostEstimate estimate_shape(const PlanShape& shape, const HeadConfig& heads, const CostModel& model, double to_beat_us) {
  return estimate_with_order(shape, heads, model, to_beat_us, nullptr);
}

CostEstimate estimate_cost(const Plan& plan, const CostModel& model) {
  CostEstimate e = estimate_shape(plan_shape(plan, true), plan.heads, model);
  if (!plan.launch_order.empty()) {
    e.longest_first = true;
    e.item_order_us = estimate_shape(plan_shape(plan, false), plan.heads, model).time_us;
  }
  return e;
}

std::vector<std::int32_t> plan_launch_order(const Plan& plan, const CostModel& model, LaunchOrder launch) {
  if (launch == LaunchOrder::items) return {};
  PlanShape shape = plan_shape(plan, false);
  shape.order = launch;
  if (launch == LaunchOrder::longest_first) return longest_first_launch(shape, plan.heads, model);  // nothing to time
  std::vector<std::int32_t> order;
  estimate_with_order(shape, plan.heads, model, std::numeric_limits<double>::infinity(), &order);
  return order;
}

double step_time_us(const CostModel& model, double work_ns, double max_pass_ns) {
  return std::max(work_ns / model.slots, max_pass_ns / model.split_solo_speedup) / 1000.0;
}

namespace {

// How the placement sees the device for `ctas` CTAs: the busy SMs, the
// residents each may hold, and how fast a resident runs beside others.
struct Residency {
  std::size_t per_sm;  // slots / sms
  std::size_t sms;     // the busy ones
  std::size_t stride;  // residents an SM holds at most: no SM takes more than its share
  double solo_speedup;
  double pace(std::size_t resident) const {
    if (per_sm == 1) return solo_speedup;
    return 1.0 + (solo_speedup - 1.0) * double(per_sm - resident) / double(per_sm - 1);
  }
};
Residency residency(const CostModel& model, std::size_t ctas) {
  const double sms_model = std::max(1.0, std::round(model.sms));
  Residency r;
  r.per_sm = std::size_t(std::max(1.0, std::round(model.slots / sms_model)));
  r.sms = std::size_t(std::min(sms_model, double(ctas)));
  r.stride = std::min(r.per_sm, (ctas + r.sms - 1) / r.sms);
  r.solo_speedup = model.solo_speedup;
  return r;
}

}  // namespace

double step_lower_bound_ns(const CostModel& model, const std::vector<double>& cta_ns) {
  if (cta_ns.empty()) return 0.0;
  const Residency r = residency(model, cta_ns.size());
  double sm_rate = 0.0, cta_rate = 0.0;  // the most work an SM, and one CTA, does per ns
  for (std::size_t n = 1; n <= r.stride; ++n) {
    sm_rate = std::max(sm_rate, double(n) * r.pace(n));
    cta_rate = std::max(cta_rate, r.pace(n));
  }
  double total = 0.0, longest = 0.0;
  for (double ns : cta_ns) {
    total += ns;
    longest = std::max(longest, ns);
  }
  return std::max(total / (double(r.sms) * sm_rate), longest / cta_rate);
}

double simulate_step_ns(const CostModel& model, const std::vector<double>& cta_ns) {
  if (cta_ns.empty()) return 0.0;
  const Residency r = residency(model, cta_ns.size());
  const std::size_t sms = r.sms, stride = r.stride;
  auto pace = [&](std::size_t resident) { return r.pace(resident); };
  // SM s: `count[s]` resident CTAs whose remaining work (at full-SM pace) is
  // left[s * stride ...], brought up to date at clock[s].
  std::vector<double> left(sms * stride), clock(sms, 0.0);
  std::vector<std::size_t> count(sms, 0);
  std::size_t next = 0;
  for (std::size_t round = 0; round < stride && next < cta_ns.size(); ++round) {
    for (std::size_t s = 0; s < sms && next < cta_ns.size(); ++s) left[s * stride + count[s]++] = cta_ns[next++];
  }
  // Each SM with residents has one pending event, `due[s]`: when its next CTA
  // finishes (never, once it is idle). A tournament tree over the SMs keeps the
  // earliest, ties to the lower SM: one walk to the root per event.
  constexpr double kNever = std::numeric_limits<double>::infinity();
  std::size_t leaves = 1;
  while (leaves < sms) leaves *= 2;
  std::vector<double> due(leaves, kNever);
  std::vector<std::uint32_t> winner(2 * leaves);
  auto earlier = [&](std::uint32_t a, std::uint32_t b) { return due[a] < due[b] || (due[a] == due[b] && a < b) ? a : b; };
  auto first_to_finish = [&](std::size_t s) {
    double* w = left.data() + s * stride;
    return std::size_t(std::min_element(w, w + count[s]) - w);
  };
  auto schedule = [&](std::size_t s) {
    due[s] = count[s] == 0 ? kNever : clock[s] + left[s * stride + first_to_finish(s)] / pace(count[s]);
  };
  for (std::size_t s = 0; s < sms; ++s) schedule(s);
  for (std::size_t s = 0; s < leaves; ++s) winner[leaves + s] = std::uint32_t(s);
  for (std::size_t k = leaves - 1; k >= 1; --k) winner[k] = earlier(winner[2 * k], winner[2 * k + 1]);
  auto update = [&](std::size_t s) {
    for (std::size_t k = (leaves + s) / 2; k >= 1; k /= 2) winner[k] = earlier(winner[2 * k], winner[2 * k + 1]);
  };
  double end = 0.0;
  std::vector<std::size_t> freed;  // the SMs whose CTAs finish at the same time
  // Slots freed together are refilled as at launch, one CTA per SM a round:
  // equal CTAs finish together, and the next ones spread over those SMs
  // (refill_spread 0: each SM's slots in turn).
  const std::size_t per_round = model.refill_spread > 0.0 ? 1 : stride;
  while (due[winner[1]] != kNever) {
    end = due[winner[1]];
    freed.clear();
    while (due[winner[1]] == end) {
      const std::size_t s = winner[1];
      double* w = left.data() + s * stride;
      const double done = w[first_to_finish(s)];  // the work every resident did until `end`
      std::size_t kept = 0;
      for (std::size_t i = 0; i < count[s]; ++i) {
        if (w[i] - done > 0.0) w[kept++] = w[i] - done;
      }
      count[s] = kept;
      clock[s] = end;
      freed.push_back(s);
      due[s] = kNever;
      update(s);
    }
    for (bool placed = true; placed && next < cta_ns.size();) {
      placed = false;
      for (std::size_t s : freed) {
        for (std::size_t k = 0; k < per_round && count[s] < stride && next < cta_ns.size(); ++k) {
          left[s * stride + count[s]++] = cta_ns[next++];
          placed = true;
        }
      }
    }
    for (std::size_t s : freed) {
      schedule(s);
      update(s);
    }
  }
  return end;
}

}  // namespace treeattn

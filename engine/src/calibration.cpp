#include "calibration.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "fail.hpp"
#include "thread_pool.hpp"
#include "treeattn/planner.hpp"

namespace treeattn {
namespace {

// `roots` requests of `tokens` tokens each, `queries` queries on each, cut
// into blocks of `block_tokens` (one item per block: queries <= 64), in item
// order so the CTAs launch as placed.
Plan forest_plan(std::int64_t roots, std::int64_t tokens, std::int64_t queries, std::int32_t block_tokens) {
  Tree tree(HeadConfig{1, 1, 128, 0.0f});
  for (std::int64_t r = 0; r < roots; ++r) {
    tree.add_node_range(r, kNoParent, r * tokens, tokens);
    for (std::int64_t q = 0; q < queries; ++q) tree.add_query(r);
  }
  PlanOptions options;
  options.strategy = Strategy::node_chunk;
  options.block_tokens = block_tokens;
  options.launch_order = LaunchOrder::items;
  return plan(tree, options);
}

// The coefficients fitted, in the columns' order (the overhead is the last column).
constexpr std::array<double CostModel::*, 4> kFitted = {&CostModel::pass_ns, &CostModel::tile_ns_large,
                                                        &CostModel::tile_ns_small, &CostModel::partial_ns};
constexpr std::size_t kColumns = kFitted.size() + 1;
using Row = std::array<double, kColumns>;

// Solves the normal equations a x = b (Gaussian elimination, partial
// pivoting); false when they are singular.
bool solve(std::array<Row, kColumns> a, Row b, Row& x) {
  for (std::size_t c = 0; c < kColumns; ++c) {
    std::size_t pivot = c;
    for (std::size_t r = c + 1; r < kColumns; ++r) {
      if (std::abs(a[r][c]) > std::abs(a[pivot][c])) pivot = r;
    }
    if (std::abs(a[pivot][c]) < 1e-300) return false;
    std::swap(a[c], a[pivot]);
    std::swap(b[c], b[pivot]);
    for (std::size_t r = c + 1; r < kColumns; ++r) {
      const double f = a[r][c] / a[c][c];
      for (std::size_t k = c; k < kColumns; ++k) a[r][k] -= f * a[c][k];
      b[r] -= f * b[c];
    }
  }
  for (std::size_t c = kColumns; c-- > 0;) {
    double sum = b[c];
    for (std::size_t k = c + 1; k < kColumns; ++k) sum -= a[c][k] * x[k];
    x[c] = sum / a[c][c];
  }
  return true;
}

}  // namespace

std::vector<Plan> calibration_plans(std::int32_t compute_units) {
  if (compute_units < 1) fail(ErrorCategory::InvalidArgument, "calibration: compute_units = {} (expected >= 1)", compute_units);
  const std::int64_t units = compute_units;
  struct Shape {
    std::int64_t roots, tokens, queries;
    std::int32_t block_tokens;
  };
  std::vector<Shape> shapes = {
      {4 * units, 128, 64, 128},             // 64-row passes over 2 tiles
      {2 * units, 1024, 64, 1024},           // ... over 16
      {4 * units, 128, 16, 128},             // 16-row passes over 2 tiles
      {2 * units, 1024, 16, 1024},           // ... over 16
      {(units + 1) / 2, 1024, 64, 128},      // 4 passes a unit again, 8 partials a query
  };
  for (std::int64_t per_unit : {1, 2, 3, 4, 6, 8}) shapes.push_back({per_unit * units, 512, 64, 512});
  // Planned in parallel: the calibration runs once per device, at first use, within its time budget.
  std::vector<Plan> plans(shapes.size());
  ThreadPool pool(0);
  pool.parallel_for(std::int64_t(shapes.size()), [&](std::int64_t i, int) {
    const Shape& s = shapes[std::size_t(i)];
    plans[std::size_t(i)] = forest_plan(s.roots, s.tokens, s.queries, s.block_tokens);
  });
  return plans;
}

std::int64_t calibration_kv_slots(const std::vector<Plan>& plans) {
  std::int64_t slots = 0;
  for (const Plan& p : plans) {
    for (std::int32_t s : p.token_slot) slots = std::max<std::int64_t>(slots, std::int64_t(s) + 1);
  }
  return slots;
}

CalibrationFit fit_cost_model(const std::vector<Plan>& plans, const std::vector<double>& call_us,
                              std::int32_t compute_units, const CostModel& base) {
  if (plans.size() != call_us.size() || plans.size() < kColumns) {
    fail(ErrorCategory::InvalidArgument, "calibration: {} plans and {} times (expected the same, at least {})",
         plans.size(), call_us.size(), kColumns);
  }
  for (std::size_t i = 0; i < call_us.size(); ++i) {
    if (!(call_us[i] > 0.0) || !std::isfinite(call_us[i])) {
      fail(ErrorCategory::InvalidArgument, "calibration: time {} of plan {} is not a positive number", call_us[i], i);
    }
  }
  // Every (CTAs a unit, lone-CTA speedup) shape is fitted on its own, in
  // parallel; the best is taken in a fixed order, so the result does not
  // depend on the threads.
  std::vector<std::pair<int, double>> grid;
  for (int per_unit = 1; per_unit <= 8; ++per_unit) {
    for (double solo : {1.0, 1.25, 1.5, 1.75, 2.0}) {
      if (per_unit == 1 && solo != 1.0) continue;  // one CTA a unit: its pace is one of the costs
      grid.emplace_back(per_unit, solo);
    }
  }
  std::vector<CalibrationFit> fits(grid.size());
  for (CalibrationFit& f : fits) f.rms_error = std::numeric_limits<double>::infinity();
  ThreadPool pool(0);
  pool.parallel_for(std::int64_t(grid.size()), [&](std::int64_t g, int) {
    const auto [per_unit, solo] = grid[std::size_t(g)];
    CostModel shape = scaled_cost_model(base, double(compute_units), double(per_unit), base.source);
    shape.solo_speedup = solo;
    // Each plan's time for each coefficient alone at 1 ns: linear in the
    // coefficients, since every CTA of a plan costs the same; `fixed`, the
    // merge latency of base's fanin_ns, comes off the times.
    CostModel zero = shape;
    for (double CostModel::*field : kFitted) zero.*field = 0.0;
    std::vector<double> fixed(plans.size());
    for (std::size_t i = 0; i < plans.size(); ++i) fixed[i] = estimate_cost(plans[i], zero).time_us;
    zero.fanin_ns = 0.0;
    std::vector<Row> columns(plans.size());
    for (std::size_t c = 0; c < kFitted.size(); ++c) {
      CostModel unit = zero;
      unit.*kFitted[c] = 1.0;
      for (std::size_t i = 0; i < plans.size(); ++i) columns[i][c] = estimate_cost(plans[i], unit).time_us;
    }
    // Weighted by 1 / time: relative errors, so short plans count as much as long ones.
    std::array<Row, kColumns> normal{};
    Row rhs{};
    for (std::size_t i = 0; i < plans.size(); ++i) {
      columns[i][kColumns - 1] = 1.0;
      const double w = 1.0 / (call_us[i] * call_us[i]);
      for (std::size_t r = 0; r < kColumns; ++r) {
        for (std::size_t c = 0; c < kColumns; ++c) normal[r][c] += w * columns[i][r] * columns[i][c];
        rhs[r] += w * columns[i][r] * (call_us[i] - fixed[i]);
      }
    }
    Row x{};
    if (!solve(normal, rhs, x)) return;
    for (std::size_t c = 0; c < kFitted.size(); ++c) {
      const double b = base.*kFitted[c];
      shape.*kFitted[c] = std::clamp(x[c], b / 10.0, b * 1000.0);
    }
    const double overhead = std::max(0.0, x[kColumns - 1]);
    double sum = 0.0;
    for (std::size_t i = 0; i < plans.size(); ++i) {
      double predicted = overhead + fixed[i];
      for (std::size_t c = 0; c < kFitted.size(); ++c) predicted += columns[i][c] * (shape.*kFitted[c]);
      sum += std::pow(predicted / call_us[i] - 1.0, 2);
    }
    fits[std::size_t(g)] = CalibrationFit{shape, overhead, std::sqrt(sum / double(plans.size()))};
  });
  CalibrationFit best;
  best.rms_error = std::numeric_limits<double>::infinity();
  for (const CalibrationFit& f : fits) {
    if (f.rms_error < best.rms_error) best = f;
  }
  if (!std::isfinite(best.rms_error)) fail(ErrorCategory::Backend, "calibration: the timings fit no model");
  return best;
}

std::string describe_fit(const std::vector<Plan>& plans, const std::vector<double>& call_us, const CalibrationFit& fit,
                         const CostModel& other) {
  std::string out;
  for (std::size_t i = 0; i < plans.size() && i < call_us.size(); ++i) {
    const CostEstimate e = estimate_cost(plans[i], fit.model);
    out += fmt::format("{}plan {}: {} large + {} small passes, {} tiles, {} partial rows: {:.2f} us, fitted {:.2f}, {} {:.2f}",
                       out.empty() ? "" : "\n", i, e.large_passes, e.small_passes, e.large_tiles + e.small_tiles,
                       e.partial_rows, call_us[i], e.time_us + fit.overhead_us, other.source,
                       estimate_cost(plans[i], other).time_us + fit.overhead_us);
  }
  return out;
}

}  // namespace treeattn

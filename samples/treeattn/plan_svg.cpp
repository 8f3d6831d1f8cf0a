#include "plan_svg.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include <fmt/format.h>

namespace treeattn::cli {
namespace {

constexpr double kWidth = 1400.0, kLeft = 16.0, kTop = 56.0, kRow = 34.0, kGap = 10.0;
constexpr double kMinNodeWidth = 3.0;  // tiny nodes (1-token drafts) stay visible

// Distinct, evenly spread hues for consecutive blocks.
std::string block_colour(std::int32_t block) {
  const double hue = std::fmod(double(block) * 137.50776, 360.0);
  return fmt::format("hsl({:.0f},65%,{}%)", hue, block % 2 ? 62 : 48);
}

std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else out += c;
  }
  return out;
}

}  // namespace

std::string plan_svg(const Tree& tree, const Plan& plan, const std::string& title) {
  const std::size_t n = tree.node_count();
  // Depth of each node (parents by id).
  std::map<std::int64_t, std::size_t> index;
  for (std::size_t i = 0; i < n; ++i) index[tree.nodes()[i].id] = i;
  std::vector<int> depth(n, -1);
  for (std::size_t i = 0; i < n; ++i) {
    int d = 0;
    for (std::int64_t p = tree.nodes()[i].parent; p != kNoParent; p = tree.nodes()[index.at(p)].parent) ++d;
    depth[i] = d;
  }
  const int rows = n ? *std::max_element(depth.begin(), depth.end()) + 1 : 1;

  // Each node's token range in the plan's order, and the blocks that read it:
  // (block, begin, end) of each block's part of the node, in block order.
  struct Read {
    std::int32_t block, begin, end;
  };
  std::vector<std::int32_t> first(n, -1), last(n, -1);
  std::vector<std::vector<Read>> readers(n);
  for (std::int32_t b = 0; b < plan.num_blocks(); ++b) {
    for (std::int32_t s = plan.block_segment_begin[std::size_t(b)]; s < plan.block_segment_begin[std::size_t(b) + 1]; ++s) {
      const std::size_t v = std::size_t(plan.segment_node[std::size_t(s)]);
      const std::int32_t begin = plan.segment_token_begin[std::size_t(s)], end = plan.segment_token_end[std::size_t(s)];
      first[v] = first[v] < 0 ? begin : std::min(first[v], begin);
      last[v] = std::max(last[v], end);
      if (readers[v].empty() || readers[v].back().block != b) readers[v].push_back({b, begin, end});
      readers[v].back().begin = std::min(readers[v].back().begin, begin);
      readers[v].back().end = std::max(readers[v].back().end, end);
    }
  }
  // Lanes: blocks whose parts of a node overlap (the same tokens read twice)
  // share the node's row; disjoint parts keep the full height.
  std::vector<std::map<std::int32_t, int>> lane_of(n);
  std::vector<int> lanes(n, 1);
  for (std::size_t v = 0; v < n; ++v) {
    std::vector<std::int32_t> lane_end;
    for (const Read& r : readers[v]) {
      std::size_t lane = 0;
      while (lane < lane_end.size() && lane_end[lane] > r.begin) ++lane;
      if (lane == lane_end.size()) lane_end.push_back(0);
      lane_end[lane] = r.end;
      lane_of[v][r.block] = int(lane);
    }
    lanes[v] = std::max<int>(1, int(lane_end.size()));
  }
  // x positions: nodes in token order, each at least kMinNodeWidth wide, scaled to fit.
  std::vector<std::size_t> order;
  for (std::size_t v = 0; v < n; ++v) {
    if (first[v] >= 0) order.push_back(v);
  }
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) { return first[a] < first[b]; });
  const double tokens = std::max(1, plan.num_tokens());
  const double raw_scale = (kWidth - 2 * kLeft) / tokens;
  double total = 0.0;
  for (std::size_t v : order) total += std::max(kMinNodeWidth, (last[v] - first[v]) * raw_scale);
  const double fit = total > 0 ? (kWidth - 2 * kLeft) / total : 1.0;
  std::vector<double> x0(n, 0.0), per_token(n, 0.0);
  double x = kLeft;
  for (std::size_t v : order) {
    const double w = std::max(kMinNodeWidth, (last[v] - first[v]) * raw_scale) * fit;
    x0[v] = x;
    per_token[v] = w / double(last[v] - first[v]);
    x += w;
  }

  const double height = kTop + rows * (kRow + kGap) + 30;
  std::string svg = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{:.0f}\" height=\"{:.0f}\" font-family=\"sans-serif\">\n"
      "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
      "<text x=\"{}\" y=\"22\" font-size=\"16\">{}</text>\n"
      "<text x=\"{}\" y=\"42\" font-size=\"12\" fill=\"#444\">strategy {}: {} KV blocks of at most {} tokens, {} work items, "
      "{} tokens; rows are tree depths, nodes in depth-first token order, colour = KV block</text>\n",
      kWidth, height, kLeft, escape(title), kLeft, to_string(plan.strategy), plan.num_blocks(), plan.block_tokens,
      plan.num_items(), plan.num_tokens());

  // Parent-child links, then the segments, then node labels where they fit.
  for (std::size_t v : order) {
    const std::int64_t p = tree.nodes()[v].parent;
    if (p == kNoParent || first[index.at(p)] < 0) continue;
    const double y_parent = kTop + depth[index.at(p)] * (kRow + kGap) + kRow;
    svg += fmt::format("<line x1=\"{:.1f}\" y1=\"{:.1f}\" x2=\"{:.1f}\" y2=\"{:.1f}\" stroke=\"#999\" stroke-width=\"0.7\"/>\n",
                       x0[v], y_parent, x0[v], y_parent + kGap);
  }
  for (std::int32_t b = 0; b < plan.num_blocks(); ++b) {
    for (std::int32_t s = plan.block_segment_begin[std::size_t(b)]; s < plan.block_segment_begin[std::size_t(b) + 1]; ++s) {
      const std::size_t v = std::size_t(plan.segment_node[std::size_t(s)]);
      const int lane = lane_of[v].at(b);
      const double lane_height = kRow / double(lanes[v]);
      const double sx = x0[v] + (plan.segment_token_begin[std::size_t(s)] - first[v]) * per_token[v];
      const double sw = (plan.segment_token_end[std::size_t(s)] - plan.segment_token_begin[std::size_t(s)]) * per_token[v];
      svg += fmt::format(
          "<rect x=\"{:.2f}\" y=\"{:.2f}\" width=\"{:.2f}\" height=\"{:.2f}\" fill=\"{}\"><title>node {} tokens "
          "[{}, {}) block {}</title></rect>\n",
          sx, kTop + depth[v] * (kRow + kGap) + double(lane) * lane_height, std::max(sw, 0.5), lane_height,
          block_colour(b), tree.nodes()[v].id, plan.segment_token_begin[std::size_t(s)] - first[v],
          plan.segment_token_end[std::size_t(s)] - first[v], b);
    }
  }
  for (std::size_t v : order) {
    const double w = (last[v] - first[v]) * per_token[v];
    const std::string label = fmt::format("{}", tree.nodes()[v].id);
    if (w < 8.0 * double(label.size()) + 4) continue;
    svg += fmt::format("<text x=\"{:.1f}\" y=\"{:.1f}\" font-size=\"11\" fill=\"white\">{}</text>\n", x0[v] + 3,
                       kTop + depth[v] * (kRow + kGap) + kRow / 2 + 4, label);
  }
  svg += fmt::format("<text x=\"{}\" y=\"{:.0f}\" font-size=\"11\" fill=\"#444\">{} visible tokens; node widths are "
                     "proportional to tokens (at least {} px)</text>\n</svg>\n",
                     kLeft, height - 10, plan.num_tokens(), kMinNodeWidth);
  return svg;
}

}  // namespace treeattn::cli

// IncrementalPlanner against plan(), on change sequences decoded from the
// input: nodes added (ranged, listed, paged; under live, unknown or removed
// parents), tokens appended, pages replaced, nodes removed, queries set (with
// upto), some with bad slots. A change is refused at once with an Error or
// taken; an update that fails is repaired by removing the nodes given bad
// input and setting queries on live nodes, and then succeeds. After every
// successful update the plan is valid and covers every query's tokens (the
// last `window` of its path, under a sliding window) exactly once; where it
// holds no earlier layout it is bitwise
// plan(tree(), held_options()). Every slot is used once (a page is
// page_size fresh slots), so coverage is exact per slot.

#include <fuzzer/FuzzedDataProvider.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "support/plan_check.hpp"
#include "treeattn/error.hpp"
#include "treeattn/incremental_planner.hpp"
#include "treeattn/planner.hpp"

using namespace treeattn;

namespace {

constexpr std::int64_t kMaxSlots = 3000;  // the most slots an input hands out: each input runs fast
constexpr int kMaxChanges = 96;

[[noreturn]] void finding(const std::string& what) {
  std::fprintf(stderr, "fuzz_incremental_planner: %s\n", what.c_str());
  __builtin_trap();
}

struct Driver {
  FuzzedDataProvider& in;
  IncrementalPlanner planner;
  std::int32_t page_size;
  std::int64_t next_slot = 0;
  std::int64_t next_id = 0;
  std::set<std::int64_t> bad;      // nodes given input the update must refuse (bad slots, unknown parents)
  std::set<std::int64_t> removed;  // removal pending or done: these ids are gone

  Driver(FuzzedDataProvider& input, const PlanOptions& options, const IncrementalOptions& incremental,
         std::int32_t page)
      : in(input), planner(HeadConfig{4, 2, 64, 0.0f}, options, incremental), page_size(page) {}

  std::vector<std::int64_t> live_ids() const {
    std::vector<std::int64_t> ids;
    for (const TreeNode& n : planner.tree().nodes()) {
      if (removed.count(n.id) == 0) ids.push_back(n.id);
    }
    return ids;
  }

  // A live node's id, or sometimes one not in the tree.
  std::int64_t some_id() {
    const std::vector<std::int64_t> ids = live_ids();
    if (ids.empty() || in.ConsumeIntegralInRange<int>(0, 15) == 0) return in.ConsumeIntegralInRange<std::int64_t>(-2, next_id + 2);
    return ids[in.ConsumeIntegralInRange<std::size_t>(0, ids.size() - 1)];
  }

  std::int64_t fresh_slots(std::int64_t count) {
    const std::int64_t first = next_slot;
    next_slot += count;
    return first;
  }
  std::vector<std::int64_t> fresh_pages(std::int64_t count) {
    next_slot = (next_slot + page_size - 1) / page_size * page_size;
    std::vector<std::int64_t> pages;
    for (std::int64_t p = 0; p < count; ++p) pages.push_back(fresh_slots(page_size) / page_size);
    return pages;
  }
  // A node's slots: fresh ones, or (marking the node bad) one out of range.
  std::vector<std::int64_t> listed(std::int64_t count, std::int64_t id) {
    std::vector<std::int64_t> slots;
    for (std::int64_t t = 0; t < count; ++t) slots.push_back(fresh_slots(1));
    if (count > 0 && in.ConsumeIntegralInRange<int>(0, 15) == 0) {
      slots[in.ConsumeIntegralInRange<std::size_t>(0, slots.size() - 1)] = in.ConsumeBool() ? -5 : std::int64_t(1) << 40;
      bad.insert(id);
    }
    return slots;
  }

  void add() {
    const std::int64_t id = in.ConsumeIntegralInRange<int>(0, 15) == 0 ? some_id() : next_id++;
    std::int64_t parent = in.ConsumeIntegralInRange<int>(0, 3) == 0 ? kNoParent : some_id();
    if (parent == id) parent = kNoParent;
    const std::vector<std::int64_t> ids = live_ids();
    const bool known = parent == kNoParent || std::find(ids.begin(), ids.end(), parent) != ids.end();
    const std::int64_t count = in.ConsumeIntegralInRange<std::int64_t>(0, 40);
    try {
      switch (in.ConsumeIntegralInRange<int>(0, 2)) {
        case 0: planner.add_node_range(id, parent, fresh_slots(count), count); break;
        case 1: planner.add_node(id, parent, listed(count, id)); break;
        default: {
          const std::int64_t pages = (count + page_size - 1) / page_size;
          planner.add_node_pages(id, parent, fresh_pages(pages), page_size,
                                 std::int32_t(count - (pages == 0 ? 0 : (pages - 1) * page_size)));
        }
      }
      if (!known) bad.insert(id);
    } catch (const Error&) {
    }
  }

  void append() {
    const std::int64_t id = some_id();
    const std::int64_t count = in.ConsumeIntegralInRange<std::int64_t>(0, 24);
    try {
      switch (in.ConsumeIntegralInRange<int>(0, 2)) {
        case 0: planner.append_range(id, fresh_slots(count), count); break;
        case 1: planner.append(id, listed(count, id)); break;
        default: {
          // Tokens that fill the last page, then fresh pages: as many as they need (or a wrong count).
          const auto& nodes = planner.tree().nodes();
          const auto it = std::find_if(nodes.begin(), nodes.end(), [&](const TreeNode& n) { return n.id == id; });
          const std::int64_t room = it == nodes.end() ? 0 : it->pages * page_size - it->length;
          std::int64_t pages = std::max<std::int64_t>(0, (count - room + page_size - 1) / page_size);
          if (in.ConsumeIntegralInRange<int>(0, 15) == 0) pages += 1;
          planner.append_pages(id, count, fresh_pages(pages));
        }
      }
    } catch (const Error&) {
    }
  }

  void replace_pages() {
    const std::int64_t id = some_id();
    const std::int64_t count = in.ConsumeIntegralInRange<std::int64_t>(0, 40);
    const std::int64_t pages = (count + page_size - 1) / page_size;
    try {
      planner.replace_pages(id, fresh_pages(pages), page_size,
                            std::int32_t(count - (pages == 0 ? 0 : (pages - 1) * page_size)));
    } catch (const Error&) {
    }
  }

  void remove(std::int64_t id) {
    try {
      planner.remove_node(id);
      removed.insert(id);
    } catch (const Error&) {
    }
  }

  // Whether `q` is on a live node with good input, within its length, and sees a token.
  bool sees_tokens(const TreeQuery& q) const {
    const std::vector<TreeNode>& nodes = planner.tree().nodes();
    auto find = [&](std::int64_t id) {
      return std::find_if(nodes.begin(), nodes.end(), [&](const TreeNode& n) { return n.id == id; });
    };
    auto it = find(q.node);
    if (it == nodes.end() || removed.count(q.node) > 0 || bad.count(q.node) > 0) return false;
    if (q.upto != kWholeNode && q.upto > it->length) return false;
    std::int64_t tokens = q.upto == kWholeNode ? it->length : q.upto;
    for (std::size_t depth = 0; it->parent != kNoParent && depth < nodes.size(); ++depth) {
      it = find(it->parent);
      if (it == nodes.end() || removed.count(it->id) > 0) return false;
      tokens += it->length;
    }
    return tokens > 0;
  }

  void set_queries(bool valid_only) {
    std::vector<TreeQuery> queries;
    const std::size_t count = in.ConsumeIntegralInRange<std::size_t>(0, 12);
    for (std::size_t i = 0; i < count; ++i) {
      TreeQuery q;
      q.node = some_id();
      if (in.ConsumeIntegralInRange<int>(0, 3) == 0) q.upto = in.ConsumeIntegralInRange<std::int64_t>(0, 8);
      queries.push_back(q);
    }
    if (valid_only) {  // on live nodes, none past its node's length, each seeing a token
      queries.erase(std::remove_if(queries.begin(), queries.end(), [&](const TreeQuery& q) { return !sees_tokens(q); }),
                    queries.end());
    }
    try {
      planner.set_queries(queries);
    } catch (const Error&) {
    }
  }

  void check(const Plan& updated, const IncrementalOptions& incremental) {
    const Tree& tree = planner.tree();
    try {
      validate(updated);
    } catch (const Error& e) {
      finding(std::string("the updated plan is invalid: ") + e.what());
    }
    const std::string coverage = test::coverage_error(tree, updated, planner.options().window);
    if (!coverage.empty()) finding("the updated plan's coverage: " + coverage);
    const bool bitwise = !incremental.hold_flatten_blocks && !incremental.hold_greedy_groups;
    if (bitwise || !planner.last_update().held_layout) {
      const std::string difference = test::plan_difference(updated, plan(tree, planner.held_options()));
      if (!difference.empty()) finding("the updated plan differs from plan(): " + difference);
    }
  }

  void update(const IncrementalOptions& incremental) {
    try {
      check(planner.update(), incremental);
      return;
    } catch (const Error& e) {
      if (bad.empty() && e.category() != ErrorCategory::InvalidTree) finding(std::string("update: ") + e.what());
    }
    // Repair: drop the nodes given bad input, queries on live nodes only.
    for (std::int64_t id : std::vector<std::int64_t>(bad.begin(), bad.end())) remove(id);
    bad.clear();
    set_queries(true);
    try {
      check(planner.update(), incremental);
    } catch (const Error& e) {
      finding(std::string("update after the repair: ") + e.what());
    }
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  const Strategy strategy = all_strategies()[in.ConsumeIntegralInRange<std::size_t>(0, all_strategies().size() - 1)];
  const std::int32_t blocks[] = {kAutoBlockTokens, 1, 7, 16, 64};
  PlanOptions options{strategy, blocks[in.ConsumeIntegralInRange<int>(0, 4)]};
  options.query_tile = in.ConsumeBool() ? kMaxQueryTile : in.ConsumeIntegralInRange<std::int32_t>(1, 64);
  if (strategy == Strategy::greedy && in.ConsumeBool()) options.greedy_candidate = GreedyCandidate::own;
  IncrementalOptions incremental;
  if (in.ConsumeBool()) {  // bitwise: every update plan(tree(), held_options())
    incremental.hold_flatten_blocks = incremental.hold_greedy_groups = false;
    incremental.redecide_drift = 0.0;
  } else {
    const double drifts[] = {0.0, 0.25, 1.0, 100.0};
    incremental.redecide_drift = drifts[in.ConsumeIntegralInRange<int>(0, 3)];
  }
  const std::int32_t page_size = in.ConsumeIntegralInRange<std::int32_t>(1, 8);
  if (in.ConsumeBool()) options.window = in.ConsumeIntegralInRange<std::int32_t>(1, 40);  // windows that slide as nodes grow
  Driver driver(in, options, incremental, page_size);
  for (int change = 0; change < kMaxChanges && in.remaining_bytes() > 0 && driver.next_slot < kMaxSlots; ++change) {
    switch (in.ConsumeIntegralInRange<int>(0, 9)) {
      case 0: case 1: driver.add(); break;
      case 2: case 3: driver.append(); break;
      case 4: driver.replace_pages(); break;
      case 5: driver.remove(driver.some_id()); break;
      case 6: driver.set_queries(false); break;
      default: driver.update(incremental); break;
    }
  }
  driver.update(incremental);
  return 0;
}

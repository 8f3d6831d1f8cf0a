// The tree JSON reader, then the planner on what it accepts: every input is
// either refused with a treeattn::Error or read into a tree that writes back
// to the same JSON; a tree of at most kMaxTokens tokens is then planned with
// every strategy, each plan refused with an Error or valid (validate()).

#include <cstddef>
#include <cstdint>
#include <string>

#include "treeattn/error.hpp"
#include "treeattn/planner.hpp"
#include "treeattn/tree_json.hpp"

namespace {

constexpr std::size_t kMaxInputBytes = 1 << 16;
constexpr std::int64_t kMaxTokens = 4096;  // larger trees are read but not planned: each input runs fast

// The tree's tokens, or -1 past kMaxTokens (lengths are unchecked until plan()).
std::int64_t small_token_count(const treeattn::Tree& tree) {
  std::int64_t tokens = 0;
  for (const treeattn::TreeNode& node : tree.nodes()) {
    if (node.length > kMaxTokens) return -1;
    if (node.length > 0) tokens += node.length;
    if (tokens > kMaxTokens) return -1;
  }
  return tokens;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size > kMaxInputBytes) return -1;
  const std::string text(reinterpret_cast<const char*>(data), size);
  treeattn::Tree tree;
  try {
    tree = treeattn::parse_tree_json(text, "fuzz tree");
  } catch (const treeattn::Error&) {
    return 0;
  }
  const std::string written = treeattn::tree_to_json(tree);
  if (treeattn::tree_to_json(treeattn::parse_tree_json(written, "written tree")) != written) __builtin_trap();
  if (small_token_count(tree) < 0 || tree.query_count() > std::size_t(kMaxTokens)) return 0;
  for (const treeattn::Strategy strategy : treeattn::all_strategies()) {
    treeattn::PlanOptions options;
    options.strategy = strategy;
    try {
      treeattn::validate(treeattn::plan(tree, options));
    } catch (const treeattn::Error& e) {
      if (e.category() == treeattn::ErrorCategory::InvalidPlan) __builtin_trap();  // plan() made an invalid plan
    }
  }
  return 0;
}

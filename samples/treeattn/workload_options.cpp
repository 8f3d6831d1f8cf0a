#include "workload_options.hpp"

#include <fmt/format.h>

#include <cstdlib>
#include <set>
#include <filesystem>

#ifdef _WIN32
#include <windows.h>
#endif

#include "cli_support.hpp"
#include "treeattn/error.hpp"

namespace treeattn::cli {
namespace {

std::vector<std::int64_t> parse_list(const std::string& text, const std::string& what) {
  std::vector<std::int64_t> values;
  std::size_t at = 0;
  while (at <= text.size()) {
    const std::size_t comma = std::min(text.find(',', at), text.size());
    try {
      values.push_back(std::stoll(text.substr(at, comma - at)));
    } catch (const std::exception&) {
      throw Error(ErrorCategory::InvalidArgument, fmt::format("{} '{}' is not a comma-separated list of integers", what, text));
    }
    at = comma + 1;
  }
  return values;
}

// The n-th tree of a reasoning file that is not marked incompleted.
const ReasoningTree& complete_tree(const std::vector<ReasoningTree>& trees, std::size_t n, const std::string& file) {
  for (const ReasoningTree& t : trees) {
    if (!t.incompleted && n-- == 0) return t;
  }
  throw Error(ErrorCategory::InvalidArgument, fmt::format("{}: fewer complete trees than asked for", file));
}

std::filesystem::path executable_path() {
#ifdef _WIN32
  std::wstring path(MAX_PATH, L'\0');
  for (;;) {
    const DWORD n = GetModuleFileNameW(nullptr, path.data(), DWORD(path.size()));
    if (n < path.size()) return std::filesystem::path(path.substr(0, n));
    path.resize(path.size() * 2);
  }
#else
  std::error_code error;
  return std::filesystem::read_symlink("/proc/self/exe", error);
#endif
}

// A workload file, or an error that says where it was looked for and how to point elsewhere.
std::string workload_file(const WorkloadOptions& o, const std::string& relative) {
  const std::string path = fmt::format("{}/{}", o.workloads_dir, relative);
  if (!std::filesystem::exists(path)) {
    throw Error(ErrorCategory::Io, fmt::format("workload file {} not found (the DeFT workloads directory is {}; "
                                               "set --workloads-dir or TREEATTN_WORKLOADS_DIR)",
                                               path, o.workloads_dir));
  }
  return path;
}

}  // namespace

std::string default_workloads_dir() {
  if (const char* dir = std::getenv("TREEATTN_WORKLOADS_DIR"); dir != nullptr && *dir != '\0') return dir;
  const std::filesystem::path exe = executable_path();
  if (exe.empty()) return TREEATTN_WORKLOADS_FROM_BINDIR;
  return (exe.parent_path() / TREEATTN_WORKLOADS_FROM_BINDIR).lexically_normal().string();
}

const std::vector<std::string>& workload_kinds() {
  static const std::vector<std::string> kinds = {"fewshot", "speculative", "reasoning", "levels", "random"};
  return kinds;
}

void WorkloadOptions::add_to(CLI::App& sub) {
  sub.add_option("--workloads-dir", workloads_dir, "DeFT workload files (speculative/*.json, reasoning/*.json); default: $TREEATTN_WORKLOADS_DIR, else share/treeattn/workloads/deft beside the executable")
      ->capture_default_str();
  sub.add_option("--prompt", prompt, "fewshot: prompt tokens")->check(positive())->capture_default_str();
  sub.add_option("--branches", branches, "fewshot: branches (comma-separated)")->delimiter(',')->check(positive())->capture_default_str();
  sub.add_option("--generated", generated, "fewshot: tokens each branch decodes")->check(positive())->capture_default_str();
  sub.add_option("--tree-size", tree_sizes, "speculative: Medusa token-tree sizes")
      ->delimiter(',')
      ->check(CLI::IsMember({32, 64, 128, 256}))
      ->capture_default_str();
  sub.add_option("--spec-record", spec_record, "speculative: record (prompt) of the workload file")->capture_default_str();
  sub.add_option("--spec-step", spec_step, "speculative: snapshot after this many decode steps")->check(positive())->capture_default_str();
  sub.add_option("--reasoning", reasoning, "reasoning: files of reasoning/ without .json")
      ->delimiter(',')
      ->check(CLI::IsMember({"sorting128ToT", "keywordToT", "docmergeToT"}))
      ->capture_default_str();
  sub.add_option("--reasoning-tree", reasoning_tree, "reasoning: which complete tree of each file (0 = first)")->capture_default_str();
  sub.add_option("--reasoning-at", reasoning_at, "reasoning: snapshot at this fraction of the iterations")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  sub.add_option("--reasoning-step", reasoning_step, "reasoning: snapshot at this iteration instead (0: use --reasoning-at)")
      ->check(nonnegative())
      ->capture_default_str();
  sub.add_option("--levels", levels, "levels: FastTree shapes NODES:CONTEXT per level, e.g. 1,4,16,512:1024,256,128,32")
      ->capture_default_str();
  sub.add_option("--nodes", random.nodes, "random: nodes")->check(CLI::Range(1, 10000000))->capture_default_str();
  sub.add_option("--queries", random.queries, "random: queries")->check(CLI::Range(0, 10000000))->capture_default_str();
  sub.add_option("--trees", random.roots, "random: independent trees in the forest")->check(CLI::Range(1, 10000000))->capture_default_str();
  sub.add_option("--max-tokens", random.max_tokens, "random: most tokens per node (at least 1)")->check(CLI::Range(1, 1000000))->capture_default_str();
  sub.add_option("--seed", random.seed, "random, serving: seed")->capture_default_str();
}

std::vector<NamedScenario> make_scenarios(const std::string& kind, const WorkloadOptions& o) {
  std::vector<NamedScenario> out;
  if (kind == "fewshot") {
    for (int b : o.branches) {
      out.push_back({fmt::format("fewshot b={}", b), few_shot_scenario(o.prompt, b, o.generated)});
    }
  } else if (kind == "speculative") {
    for (int t : o.tree_sizes) {
      const MedusaWorkload w = load_medusa(workload_file(o, fmt::format("speculative/APPS_tree_size{}.json", t)));
      out.push_back({fmt::format("speculative t={}", t), speculative_scenario(w, o.spec_record)});
    }
  } else if (kind == "reasoning") {
    for (const std::string& file : o.reasoning) {
      const std::string path = workload_file(o, fmt::format("reasoning/{}.json", file));
      const std::vector<ReasoningTree> trees = load_reasoning(path);
      out.push_back({fmt::format("reasoning {}", file), reasoning_scenario(complete_tree(trees, o.reasoning_tree, path))});
    }
  } else if (kind == "serving") {
    ServingOptions serving = o.serving;
    serving.seed = o.random.seed;
    out.push_back({fmt::format("serving seed={}", serving.seed), serving_scenario(serving)});
  } else {
    throw Error(ErrorCategory::InvalidArgument,
                fmt::format("workload '{}' cannot be replayed step by step (choose fewshot, speculative, reasoning or "
                            "serving)", kind));
  }
  return out;
}

namespace {

// The replay continued from its snapshot, on its own paged cache; each start
// replays again from a new scenario.
class ReplaySteps final : public NextSteps {
 public:
  ReplaySteps(std::function<std::unique_ptr<Scenario>()> make, std::int64_t steps)
      : make_(std::move(make)), steps_(steps) {}
  void start(IncrementalPlanner& planner, const Tree&) override {
    scenario_ = make_();
    live_.reset();  // returns its pages to the cache it came from
    cache_ = std::make_unique<PagedKvCache>(16, 0);  // counted, never backed by memory
    live_ = std::make_unique<SequenceTree>(*cache_);
    for (done_ = 0; done_ < steps_; ++done_) scenario_->advance(*live_, queries_);
    live_->sync(planner, queries_);
  }
  bool next() override {
    if (done_ == scenario_->steps()) return false;
    scenario_->advance(*live_, queries_);
    ++done_;
    return true;
  }
  void hand_over(IncrementalPlanner& planner) override { live_->sync(planner, queries_); }

 private:
  std::function<std::unique_ptr<Scenario>()> make_;
  std::int64_t steps_, done_ = 0;
  std::unique_ptr<Scenario> scenario_;
  std::unique_ptr<PagedKvCache> cache_;
  std::unique_ptr<SequenceTree> live_;  // destroyed before the cache it returns pages to
  std::vector<TreeQuery> queries_;
};

// Every query's node grows by one token, in a fresh slot (or a fresh page
// when its last page is full).
class GrowQueryNodes final : public NextSteps {
 public:
  explicit GrowQueryNodes(const Tree& tree) {
    std::set<std::int64_t> seen;
    for (const TreeQuery& q : tree.queries()) seen.insert(q.node);
    for (std::size_t i = 0; i < tree.node_count(); ++i) {
      const TreeNode& n = tree.nodes()[i];
      if (seen.count(n.id) != 0) nodes_.push_back(Grown{n.id, n.page_size, n.length, n.length});
      for (std::int64_t p = 0; n.page_size > 0 && p < n.pages; ++p) next_page_ = std::max(next_page_, tree.page(i, p) + 1);
      for (std::int64_t t = 0; n.page_size == 0 && t < n.length; ++t) next_slot_ = std::max(next_slot_, tree.slot(i, t) + 1);
    }
  }
  void start(IncrementalPlanner& planner, const Tree& snapshot) override {
    planner.add_tree(snapshot);
    for (Grown& n : nodes_) n.length = n.start_length;
  }
  bool next() override { return true; }
  void hand_over(IncrementalPlanner& planner) override {
    for (Grown& n : nodes_) {
      if (n.page_size > 0) {
        planner.append_pages(n.id, 1, n.length % n.page_size == 0 ? std::vector<std::int64_t>{next_page_++}
                                                                  : std::vector<std::int64_t>{});
      } else {
        planner.append_range(n.id, next_slot_++, 1);
      }
      ++n.length;
    }
  }

 private:
  struct Grown {
    std::int64_t id;
    std::int32_t page_size;
    std::int64_t length, start_length;
  };
  std::vector<Grown> nodes_;
  std::int64_t next_slot_ = 0, next_page_ = 0;
};

}  // namespace

std::vector<NamedTree> make_trees(const std::string& kind, const WorkloadOptions& o, const HeadConfig& heads) {
  std::vector<NamedTree> out;
  if (kind == "fewshot") {
    for (int b : o.branches) out.push_back({fmt::format("fewshot b={}", b), few_shot_tree(heads, o.prompt, b, o.generated), nullptr});
  } else if (kind == "speculative" || kind == "reasoning") {
    std::vector<NamedScenario> scenarios = make_scenarios(kind, o);
    for (std::size_t i = 0; i < scenarios.size(); ++i) {
      NamedScenario& s = scenarios[i];
      std::int64_t steps = std::min(o.spec_step, s.scenario->steps());
      if (kind == "reasoning") {
        steps = o.reasoning_step > 0 ? o.reasoning_step
                                     : std::max<std::int64_t>(1, std::int64_t(o.reasoning_at * double(s.scenario->steps())));
      }
      auto make = [o, kind, i] { return std::move(make_scenarios(kind, o)[i].scenario); };
      out.push_back({fmt::format("{} @{}", s.name, steps), replay(*s.scenario, steps, heads),
                     std::make_unique<ReplaySteps>(make, steps)});
    }
  } else if (kind == "levels") {
    for (const std::string& shape : o.levels) {
      const std::size_t colon = shape.find(':');
      if (colon == std::string::npos) {
        throw Error(ErrorCategory::InvalidArgument, fmt::format("--levels '{}' needs NODES:CONTEXT, e.g. 1,10:4000,400", shape));
      }
      const auto nodes = parse_list(shape.substr(0, colon), "--levels node counts");
      const auto context = parse_list(shape.substr(colon + 1), "--levels contexts");
      std::string name = "levels";
      for (std::size_t k = 0; k < nodes.size(); ++k) name += fmt::format("{}{}x{}", k ? "/" : " ", nodes[k], k < context.size() ? context[k] : 0);
      out.push_back({name, level_tree(heads, nodes, context), nullptr});
    }
  } else if (kind == "random") {
    RandomForestOptions r = o.random;
    r.heads = heads;
    out.push_back({fmt::format("random n={} q={}", r.nodes, r.queries), random_forest(r), nullptr});
  } else {
    throw Error(ErrorCategory::InvalidArgument,
                fmt::format("unknown workload '{}' (choose fewshot, speculative, reasoning, levels or random)", kind));
  }
  // The generated kinds' next step: every query's node grows a token, as in a few-shot decode step.
  for (NamedTree& t : out) {
    if (!t.next) t.next = std::make_unique<GrowQueryNodes>(t.tree);
  }
  return out;
}

}  // namespace treeattn::cli

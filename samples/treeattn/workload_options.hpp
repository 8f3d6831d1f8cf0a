#pragma once
// The workloads (docs/cli.md) as command-line choices, shared by `bench` and
// `demo`: each becomes a replayable Scenario (for demo) or a tree snapshot (for
// bench) under a short name that tables and JSON use.

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "treeattn/scenarios.hpp"
#include "treeattn/workloads.hpp"

namespace treeattn::cli {

// Where `bench` and `demo` find the DeFT workload files (speculative/, reasoning/):
// $TREEATTN_WORKLOADS_DIR when it is set, else the directory installed beside the
// executable (share/treeattn/workloads/deft under the prefix; the build tree
// mirrors that layout). --workloads-dir overrides both.
std::string default_workloads_dir();

struct WorkloadOptions {
  std::string workloads_dir = default_workloads_dir();     // holds speculative/ and reasoning/
  std::int64_t prompt = 4000;                              // few-shot prompt tokens
  std::vector<int> branches = {20, 30, 50};
  std::int64_t generated = 400;
  std::vector<int> tree_sizes = {32, 64, 128, 256};
  std::size_t spec_record = 0;
  std::int64_t spec_step = 100;                            // snapshot after this many steps
  std::vector<std::string> reasoning = {"sorting128ToT", "keywordToT", "docmergeToT"};
  std::size_t reasoning_tree = 0;                          // n-th complete tree of the file
  double reasoning_at = 0.5;                               // snapshot at this fraction of the run
  std::int64_t reasoning_step = 0;                         // or at this iteration (0: use the fraction)
  std::vector<std::string> levels = {"1,4,16,512:1024,256,128,32", "1,10:4000,400"};
  RandomForestOptions random = [] {  // a 10 000-node forest of 100 requests, 2 000 queries
    RandomForestOptions r;
    r.nodes = 10000;
    r.roots = 100;
    r.queries = 2000;
    r.max_tokens = 32;
    r.listed_fraction = 0.0;
    return r;
  }();
  ServingOptions serving;  // its seed is random.seed (--seed); demo alone sets the rest

  void add_to(CLI::App& sub);
};

struct NamedScenario {
  std::string name;
  std::unique_ptr<Scenario> scenario;
};

// Replayable scenarios of a kind: fewshot, speculative, reasoning or serving.
std::vector<NamedScenario> make_scenarios(const std::string& kind, const WorkloadOptions& o);

// A snapshot's next decode steps, handed to an IncrementalPlanner: what
// `bench` times as plan_update_median_us. Replayed workloads continue their
// replay (speculative: a fresh token tree on a prefix grown by the accepted
// tokens; reasoning: leaves that grow, fork and are pruned); the generated
// ones grow every query's node by one token, a few-shot decode step.
class NextSteps {
 public:
  virtual ~NextSteps() = default;
  // Gives a new `planner` the snapshot's tree, its first step (each start begins again there).
  virtual void start(IncrementalPlanner& planner, const Tree& snapshot) = 0;
  // Runs the workload's next decode step; false when it has no more.
  virtual bool next() = 0;
  // Gives `planner` that step's changes (what a serving loop's planning includes).
  virtual void hand_over(IncrementalPlanner& planner) = 0;
};

struct NamedTree {
  std::string name;
  Tree tree;
  std::unique_ptr<NextSteps> next;
};

// Snapshots of a kind (the three above, plus levels and random), with `heads`.
std::vector<NamedTree> make_trees(const std::string& kind, const WorkloadOptions& o, const HeadConfig& heads);

const std::vector<std::string>& workload_kinds();

}  // namespace treeattn::cli

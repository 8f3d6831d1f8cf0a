#pragma once
// Tree-decoding scenarios of the workloads (docs/cli.md), replayed step by step on a
// SequenceTree: few-shot prompting, speculative decoding with Medusa token
// trees, tree-of-thought reasoning, and a seeded serving loop of requests that
// come and go. A scenario is the branch controller: it
// decides what grows, forks and is pruned at each decode step, and which nodes
// query attention. Static snapshots for benchmarks come from the same replay.

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "treeattn/sequence_tree.hpp"
#include "treeattn/tree.hpp"

namespace treeattn {

// workloads/deft/speculative/*.json
struct MedusaWorkload {
  std::int32_t tree_size = 0;                    // tokens in a token tree, its root included
  std::vector<std::vector<std::int32_t>> paths;  // Tree_Structure: one 1-token node per path
  struct Record {
    std::int64_t prompt_chars = 0;
    std::vector<std::int32_t> accept_lengths;  // tokens accepted at each decode step
  };
  std::vector<Record> records;
};
MedusaWorkload load_medusa(const std::string& path);

// workloads/deft/reasoning/*.json: node `id` decodes one token per iteration
// from `start` to `end` (the root's negative start is its prompt), then forks
// into `children` or, with none, is pruned.
struct ReasoningNode {
  std::int64_t id = 0, value = 0, start = 0, end = 0;
  std::vector<std::int64_t> children;
};
struct ReasoningTree {
  bool incompleted = false;
  std::vector<ReasoningNode> nodes;  // nodes[i].id == i
};
std::vector<ReasoningTree> load_reasoning(const std::string& path);

inline constexpr std::int64_t kEndless = std::numeric_limits<std::int64_t>::max();

class Scenario {
 public:
  virtual ~Scenario() = default;
  virtual std::string name() const = 0;
  virtual std::int64_t steps() const = 0;  // decode steps in a full replay (kEndless: any number)
  // Runs the next decode step (the first call also prefills): grows, forks and
  // prunes `tree`, sets `queries` to this step's queries, and returns the
  // number of tokens the step generated.
  virtual std::int64_t advance(SequenceTree& tree, std::vector<TreeQuery>& queries) = 0;
};

// A `prompt`-token root; `branches` children each decode one token per step for
// `generated` steps; one query per branch.
std::unique_ptr<Scenario> few_shot_scenario(std::int64_t prompt, std::int32_t branches, std::int64_t generated);

// Record `record` of a Medusa workload on a `prompt_tokens` prompt (0: estimate
// it as a quarter of the record's prompt characters). Step s verifies a fresh
// token tree whose root is the last accepted token, then the prefix grows by
// the recorded accept length. Every token of the token tree queries.
std::unique_ptr<Scenario> speculative_scenario(const MedusaWorkload& workload, std::size_t record,
                                               std::int64_t prompt_tokens = 0);

// A reasoning tree, iteration by iteration; every decoding node queries.
std::unique_ptr<Scenario> reasoning_scenario(const ReasoningTree& tree);

// A serving engine's decode loop on a seeded random forest. Requests arrive
// (some under one of `prefixes` shared system-prompt nodes, created with their
// first request and removed with their last), each with its own prompt node
// and one branch; every step each live branch decodes a token, branches fork
// (a leaf becomes the parent of two new ones) and are pruned (with ancestors
// the pruning leaves childless), and a request finishes after its decode steps
// or is evicted, oldest first, when the step's tokens would pass
// `live_tokens`: its nodes are removed and their pages freed for the next
// arrivals. Queries come and go: most live branches query, and some requests
// query one of their nodes with `upto`. Live tokens never pass `live_tokens`
// and nodes are bounded, so the KV pool and the plans stop growing after a
// warm-up; the scenario has no end.
struct ServingOptions {
  std::uint64_t seed = 1;
  std::int64_t live_tokens = 8192;  // most tokens live at once
  std::int32_t requests = 8;        // most requests at once
  std::int32_t branches = 4;        // most growing branches per request
  std::int32_t prefixes = 2;        // shared system prompts
  std::int64_t prefix_tokens = 512; // a shared prompt's tokens: a quarter of this up to this
  std::int64_t prompt_tokens = 256; // a request's own prompt: 1 up to this
  std::int64_t decode_steps = 512;  // a request's decode steps: 1 up to this
  double arrival = 0.1;             // chance a request arrives in a step (one always does into an empty tree)
  double shared = 0.6;              // chance an arrival sits under a shared prompt
  double fork = 0.03, prune = 0.03; // chances per request and step
  double query = 0.8;               // chance a live branch queries in a step
  double upto = 0.2;                // chance per request and step of a query with `upto`
};
// Throws InvalidArgument naming an option out of range (live_tokens must hold
// a request's arrival: prefix_tokens + prompt_tokens + branches).
std::unique_ptr<Scenario> serving_scenario(const ServingOptions& options);

// Replays the first `steps` steps with a private KV cache and returns the tree
// (and queries) of the last one.
Tree replay(Scenario& scenario, std::int64_t steps, const HeadConfig& heads, std::int32_t page_size = 16);

}  // namespace treeattn

#include "treeattn/scenarios.hpp"

#include <algorithm>
#include <map>
#include <numeric>

#include <nlohmann/json.hpp>

#include "fail.hpp"
#include "read_file.hpp"
#include "treeattn/workloads.hpp"

namespace treeattn {
namespace {

using nlohmann::json;

json parse_workload(const std::string& path) {
  try {
    return json::parse(read_file(path));
  } catch (const json::exception& e) {
    fail(ErrorCategory::Io, "{}: malformed JSON: {}", path, e.what());
  }
}

class FewShot final : public Scenario {
 public:
  FewShot(std::int64_t prompt, std::int32_t branches, std::int64_t generated)
      : prompt_(prompt), branches_(branches), generated_(generated) {}
  std::string name() const override { return fmt::format("fewshot P={} b={} g={}", prompt_, branches_, generated_); }
  std::int64_t steps() const override { return generated_; }

  std::int64_t advance(SequenceTree& tree, std::vector<TreeQuery>& queries) override {
    if (leaves_.empty()) {
      const std::int64_t root = tree.add_node(kNoParent);
      tree.append(root, prompt_);
      for (std::int32_t b = 0; b < branches_; ++b) leaves_.push_back(tree.add_node(root));
    }
    queries.clear();
    for (std::int64_t leaf : leaves_) {
      tree.append(leaf, 1);
      queries.push_back(TreeQuery{leaf, kWholeNode});
    }
    return branches_;
  }

 private:
  std::int64_t prompt_;
  std::int32_t branches_;
  std::int64_t generated_;
  std::vector<std::int64_t> leaves_;
};

class Speculative final : public Scenario {
 public:
  Speculative(const MedusaWorkload& w, std::size_t record, std::int64_t prompt_tokens)
      : paths_(w.paths), tree_size_(w.tree_size), accept_(w.records.at(record).accept_lengths), record_(record),
        prompt_(prompt_tokens > 0 ? prompt_tokens : std::max<std::int64_t>(1, w.records[record].prompt_chars / 4)) {}
  std::string name() const override {
    return fmt::format("speculative t={} record={} prompt={}", tree_size_, record_, prompt_);
  }
  std::int64_t steps() const override { return std::int64_t(accept_.size()); }

  std::int64_t advance(SequenceTree& tree, std::vector<TreeQuery>& queries) override {
    if (prefix_ < 0) {
      prefix_ = tree.add_node(kNoParent);
      tree.append(prefix_, prompt_ - 1);  // the prompt's last token roots the first token tree
    } else {
      tree.remove(draft_root_);
      tree.append(prefix_, accept_[std::size_t(step_ - 1)]);  // the accepted path joins the prefix
    }
    // The token tree: its root (the last accepted token) and one node per path.
    draft_root_ = tree.add_node(prefix_);
    tree.append(draft_root_, 1);
    queries.assign(1, TreeQuery{draft_root_, kWholeNode});
    std::map<std::vector<std::int32_t>, std::int64_t> node_of;
    for (const auto& path : paths_) {
      const std::vector<std::int32_t> parent_path(path.begin(), path.end() - 1);
      const std::int64_t parent = parent_path.empty() ? draft_root_ : node_of.at(parent_path);
      const std::int64_t node = tree.add_node(parent);
      tree.append(node, 1);
      node_of[path] = node;
      queries.push_back(TreeQuery{node, kWholeNode});
    }
    return accept_[std::size_t(step_++)];
  }

 private:
  std::vector<std::vector<std::int32_t>> paths_;
  std::int32_t tree_size_;
  std::vector<std::int32_t> accept_;
  std::size_t record_;
  std::int64_t prompt_;
  std::int64_t prefix_ = -1, draft_root_ = -1;
  std::int64_t step_ = 0;
};

class Reasoning final : public Scenario {
 public:
  explicit Reasoning(const ReasoningTree& t) : nodes_(t.nodes) {
    for (const ReasoningNode& n : nodes_) last_ = std::max(last_, n.end);
  }
  std::string name() const override { return fmt::format("reasoning nodes={} iterations={}", nodes_.size(), last_); }
  std::int64_t steps() const override { return last_; }

  std::int64_t advance(SequenceTree& tree, std::vector<TreeQuery>& queries) override {
    if (iteration_ == 0) {  // prefill: the root holds its prompt (iterations start..0)
      const ReasoningNode& root = nodes_[0];
      live_[0] = tree.add_node(kNoParent);
      tree.append(live_[0], std::max<std::int64_t>(0, std::min<std::int64_t>(root.end, 0) - root.start + 1));
      if (root.end <= 0) ended_.push_back(0);
    }
    // Nodes that finished last iteration fork into their children or are
    // pruned; only then does this iteration decode, so every query of a step
    // refers to a node of that step's tree.
    for (std::int64_t id : ended_) {
      if (nodes_[std::size_t(id)].children.empty()) prune(tree, id);
      else open_children(tree, id);
    }
    ended_.clear();
    const std::int64_t i = ++iteration_;
    queries.clear();
    for (const auto& [id, node] : live_) {
      const ReasoningNode& r = nodes_[std::size_t(id)];
      if (r.start <= i && i <= r.end) {
        tree.append(node, 1);
        queries.push_back(TreeQuery{node, kWholeNode});
        if (r.end == i) ended_.push_back(id);
      }
    }
    return std::int64_t(queries.size());
  }

 private:
  // Creates the children of `id`, which finished decoding. A child with no
  // tokens to decode is finished already: its own children open at once, and
  // without any it is never created.
  void open_children(SequenceTree& tree, std::int64_t id) {
    for (std::int64_t child : nodes_[std::size_t(id)].children) {
      const ReasoningNode& c = nodes_[std::size_t(child)];
      if (c.value > 0 || !c.children.empty()) {
        live_[child] = tree.add_node(live_.at(id));
        if (c.value <= 0) open_children(tree, child);
      }
    }
    if (tree.child_count(live_.at(id)) == 0) prune(tree, id);
  }

  // Removes a finished node that has nothing left below it, then any ancestor
  // that this leaves finished and childless.
  void prune(SequenceTree& tree, std::int64_t id) {
    while (true) {
      const std::int64_t node = live_.at(id);
      const std::int64_t parent = tree.parent(node);
      tree.remove(node);
      live_.erase(id);
      if (parent == kNoParent || tree.child_count(parent) > 0) return;
      const auto up = std::find_if(live_.begin(), live_.end(), [&](const auto& e) { return e.second == parent; });
      if (nodes_[std::size_t(up->first)].end > iteration_) return;  // still decoding
      id = up->first;
    }
  }

  std::vector<ReasoningNode> nodes_;
  std::int64_t last_ = 0;
  std::int64_t iteration_ = 0;
  std::map<std::int64_t, std::int64_t> live_;  // reasoning id -> sequence tree node
  std::vector<std::int64_t> ended_;            // reasoning ids that finished last iteration
};


class Serving final : public Scenario {
 public:
  explicit Serving(const ServingOptions& o) : o_(o), rng_(o.seed), prefixes_(std::size_t(o.prefixes)) {}
  std::string name() const override {
    return fmt::format("serving seed={} tokens<={} requests<={}", o_.seed, o_.live_tokens, o_.requests);
  }
  std::int64_t steps() const override { return kEndless; }

  std::int64_t advance(SequenceTree& tree, std::vector<TreeQuery>& queries) override {
    for (std::size_t r = requests_.size(); r-- > 0;) {
      if (requests_[r].steps_left == 0) finish(tree, r);
    }
    for (Request& request : requests_) {
      if (request.branches.size() > 1 && rng_.chance(o_.prune)) prune(tree, request);
      if (std::int32_t(request.branches.size()) < o_.branches && rng_.chance(o_.fork)) fork(tree, request);
    }
    // The step's growth (a token per branch) must fit: the oldest requests make room.
    while (!requests_.empty() && tree.tokens() + growth() > o_.live_tokens) finish(tree, 0);
    if (requests_.empty() || (std::int32_t(requests_.size()) < o_.requests && rng_.chance(o_.arrival))) arrive(tree);
    for (Request& request : requests_) {
      for (std::int64_t branch : request.branches) tree.append(branch, 1);
      --request.steps_left;
    }
    choose_queries(tree, queries);
    return growth();
  }

 private:
  struct Request {
    std::int64_t prompt = 0;              // its own prompt's node
    std::int32_t prefix = -1;             // the shared prompt it sits under, or -1 (a root)
    std::vector<std::int64_t> branches;   // the growing leaves
    std::int64_t steps_left = 0;
  };
  struct Prefix {
    std::int64_t node = -1;  // -1 while no request uses it
    std::int32_t users = 0;
  };

  std::int64_t growth() const {
    std::int64_t branches = 0;
    for (const Request& r : requests_) branches += std::int64_t(r.branches.size());
    return branches;
  }

  // A new request, if its prompts and the step's growth fit (into an empty tree they always do).
  void arrive(SequenceTree& tree) {
    const std::int32_t prefix = rng_.chance(o_.shared) ? std::int32_t(rng_.uniform(0, o_.prefixes - 1)) : -1;
    const bool new_prefix = prefix >= 0 && prefixes_[std::size_t(prefix)].node < 0;
    const std::int64_t prefix_tokens = new_prefix ? rng_.uniform(std::max<std::int64_t>(1, o_.prefix_tokens / 4), o_.prefix_tokens) : 0;
    const std::int64_t prompt_tokens = rng_.uniform(1, o_.prompt_tokens);
    if (tree.tokens() + prefix_tokens + prompt_tokens + growth() + 1 > o_.live_tokens) return;
    if (new_prefix) {
      prefixes_[std::size_t(prefix)].node = tree.add_node(kNoParent);
      tree.append(prefixes_[std::size_t(prefix)].node, prefix_tokens);
    }
    Request request;
    request.prefix = prefix;
    request.prompt = tree.add_node(prefix >= 0 ? prefixes_[std::size_t(prefix)].node : kNoParent);
    tree.append(request.prompt, prompt_tokens);
    request.branches.push_back(tree.add_node(request.prompt));
    request.steps_left = rng_.uniform(1, o_.decode_steps);
    if (prefix >= 0) ++prefixes_[std::size_t(prefix)].users;
    requests_.push_back(std::move(request));
  }

  // Removes request `r`'s nodes, and its shared prompt when no other request uses it.
  void finish(SequenceTree& tree, std::size_t r) {
    const Request& request = requests_[r];
    tree.remove(request.prompt);
    if (request.prefix >= 0) {
      Prefix& prefix = prefixes_[std::size_t(request.prefix)];
      if (--prefix.users == 0) {
        tree.remove(prefix.node);
        prefix.node = -1;
      }
    }
    requests_.erase(requests_.begin() + std::ptrdiff_t(r));
  }

  // A branch that has decoded a token stops and becomes the parent of two new ones.
  void fork(SequenceTree& tree, Request& request) {
    const std::size_t b = std::size_t(rng_.uniform(0, std::int64_t(request.branches.size()) - 1));
    const std::int64_t leaf = request.branches[b];
    if (tree.length(leaf) == 0) return;
    request.branches[b] = tree.add_node(leaf);
    request.branches.push_back(tree.add_node(leaf));
  }

  // Removes a branch, then the ancestors this leaves childless (never the request's prompt:
  // another branch still lies below it).
  void prune(SequenceTree& tree, Request& request) {
    const std::size_t b = std::size_t(rng_.uniform(0, std::int64_t(request.branches.size()) - 1));
    std::int64_t node = request.branches[b];
    request.branches.erase(request.branches.begin() + std::ptrdiff_t(b));
    while (true) {
      const std::int64_t parent = tree.parent(node);
      tree.remove(node);
      if (parent == request.prompt || tree.child_count(parent) > 0) return;
      node = parent;
    }
  }

  // Most branches query; some requests query one of their nodes up to a token of it.
  void choose_queries(const SequenceTree& tree, std::vector<TreeQuery>& queries) {
    queries.clear();
    for (const Request& request : requests_) {
      for (std::int64_t branch : request.branches) {
        if (rng_.chance(o_.query)) queries.push_back(TreeQuery{branch, kWholeNode});
      }
      if (rng_.chance(o_.upto)) {
        const std::int64_t pick = rng_.uniform(0, std::int64_t(request.branches.size()));
        const std::int64_t node = pick == 0 ? request.prompt : request.branches[std::size_t(pick - 1)];
        queries.push_back(TreeQuery{node, rng_.uniform(1, tree.length(node))});
      }
    }
    if (queries.empty()) queries.push_back(TreeQuery{requests_.front().branches.front(), kWholeNode});
  }

  ServingOptions o_;
  Rng rng_;
  std::vector<Request> requests_;  // oldest first
  std::vector<Prefix> prefixes_;
};

}  // namespace

MedusaWorkload load_medusa(const std::string& path) {
  const json doc = parse_workload(path);
  MedusaWorkload w;
  try {
    w.tree_size = doc.at("Token_Tree_size").get<std::int32_t>();
    for (const json& p : doc.at("Tree_Structure")) w.paths.push_back(p.get<std::vector<std::int32_t>>());
    for (const json& r : doc.at("Records")) {
      MedusaWorkload::Record record;
      const std::string prompt = r.at("prompt").get<std::string>();
      record.prompt_chars = std::count_if(prompt.begin(), prompt.end(),  // UTF-8 code points
                                          [](char c) { return (static_cast<unsigned char>(c) & 0xc0) != 0x80; });
      record.accept_lengths = r.at("Accept_length").get<std::vector<std::int32_t>>();
      w.records.push_back(std::move(record));
    }
  } catch (const json::exception& e) {
    fail(ErrorCategory::Io, "{}: not a Medusa workload: {}", path, e.what());
  }
  std::sort(w.paths.begin(), w.paths.end(), [](const auto& a, const auto& b) {
    return a.size() != b.size() ? a.size() < b.size() : a < b;  // parents before children
  });
  for (const auto& p : w.paths) {
    if (p.empty()) fail(ErrorCategory::Io, "{}: Tree_Structure holds an empty path", path);
    if (p.size() > 1 && !std::binary_search(w.paths.begin(), w.paths.end(), std::vector<std::int32_t>(p.begin(), p.end() - 1),
                                            [](const auto& a, const auto& b) {
                                              return a.size() != b.size() ? a.size() < b.size() : a < b;
                                            })) {
      fail(ErrorCategory::Io, "{}: Tree_Structure path of length {} has no parent path", path, p.size());
    }
  }
  if (std::int32_t(w.paths.size()) + 1 != w.tree_size) {
    fail(ErrorCategory::Io, "{}: {} paths do not make a token tree of {} tokens", path, w.paths.size(), w.tree_size);
  }
  return w;
}

std::vector<ReasoningTree> load_reasoning(const std::string& path) {
  const json doc = parse_workload(path);
  std::vector<ReasoningTree> trees;
  try {
    for (const json& t : doc) {
      ReasoningTree tree;
      tree.incompleted = t.at("incompleted").get<bool>();
      const json& data = t.at("data");
      tree.nodes.resize(data.size());
      for (auto it = data.begin(); it != data.end(); ++it) {
        ReasoningNode n;
        n.id = it.value().at("id").get<std::int64_t>();
        n.value = it.value().at("value").get<std::int64_t>();
        n.start = it.value().at("start").get<std::int64_t>();
        n.end = it.value().at("end").get<std::int64_t>();
        n.children = it.value().at("children").get<std::vector<std::int64_t>>();
        if (n.id < 0 || n.id >= std::int64_t(data.size()) || std::to_string(n.id) != it.key()) {
          fail(ErrorCategory::Io, "{}: trees[{}]: node key '{}' holds id {}", path, trees.size(), it.key(), n.id);
        }
        for (std::int64_t c : n.children) {
          if (c <= 0 || c >= std::int64_t(data.size())) {
            fail(ErrorCategory::Io, "{}: trees[{}]: node {} has child {} outside the tree", path, trees.size(), n.id, c);
          }
        }
        tree.nodes[std::size_t(n.id)] = std::move(n);
      }
      trees.push_back(std::move(tree));
    }
  } catch (const json::exception& e) {
    fail(ErrorCategory::Io, "{}: not a reasoning workload: {}", path, e.what());
  }
  return trees;
}

std::unique_ptr<Scenario> few_shot_scenario(std::int64_t prompt, std::int32_t branches, std::int64_t generated) {
  if (prompt < 1 || branches < 1 || generated < 1) {
    fail(ErrorCategory::InvalidArgument, "few-shot: need prompt ({}), branches ({}) and generated ({}) >= 1", prompt,
         branches, generated);
  }
  return std::make_unique<FewShot>(prompt, branches, generated);
}

std::unique_ptr<Scenario> speculative_scenario(const MedusaWorkload& workload, std::size_t record,
                                               std::int64_t prompt_tokens) {
  if (record >= workload.records.size()) {
    fail(ErrorCategory::InvalidArgument, "speculative: record {} of {}", record, workload.records.size());
  }
  return std::make_unique<Speculative>(workload, record, prompt_tokens);
}

std::unique_ptr<Scenario> reasoning_scenario(const ReasoningTree& tree) {
  if (tree.nodes.empty()) fail(ErrorCategory::InvalidArgument, "reasoning: the tree has no nodes");
  return std::make_unique<Reasoning>(tree);
}

std::unique_ptr<Scenario> serving_scenario(const ServingOptions& o) {
  if (o.requests < 1 || o.branches < 1 || o.prefixes < 1 || o.prefix_tokens < 1 || o.prompt_tokens < 1 ||
      o.decode_steps < 1) {
    fail(ErrorCategory::InvalidArgument,
         "serving: need requests ({}), branches ({}), prefixes ({}), prefix_tokens ({}), prompt_tokens ({}) and "
         "decode_steps ({}) >= 1",
         o.requests, o.branches, o.prefixes, o.prefix_tokens, o.prompt_tokens, o.decode_steps);
  }
  const std::int64_t arrival = o.prefix_tokens + o.prompt_tokens + o.branches;
  if (o.live_tokens < arrival) {
    fail(ErrorCategory::InvalidArgument,
         "serving: live_tokens {} cannot hold a request's arrival and growth (prefix_tokens + prompt_tokens + "
         "branches = {})",
         o.live_tokens, arrival);
  }
  return std::make_unique<Serving>(o);
}

Tree replay(Scenario& scenario, std::int64_t steps, const HeadConfig& heads, std::int32_t page_size) {
  if (steps < 1 || steps > scenario.steps()) {
    fail(ErrorCategory::InvalidArgument, "{}: step {} is outside [1, {}]", scenario.name(), steps, scenario.steps());
  }
  PagedKvCache cache(page_size, 0);  // only counted here, never backed by memory
  SequenceTree tree(cache);
  std::vector<TreeQuery> queries;
  for (std::int64_t s = 0; s < steps; ++s) scenario.advance(tree, queries);
  return tree.to_tree(heads, queries);
}

}  // namespace treeattn

#pragma once
// Seeded, reproducible inputs: random forests (planner tests, benchmarks) and
// random Q/K/V arrays. The generator is a fixed splitmix64 stream, so the same
// seed gives the same tree and data on every platform and compiler.

#include <cstdint>
#include <string>
#include <vector>

#include "treeattn/tensor.hpp"
#include "treeattn/tree.hpp"

namespace treeattn {

class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(seed) {}
  std::uint64_t next() noexcept;
  // Jumps over n outputs (splitmix64's state advances by a constant per output).
  void skip(std::uint64_t n) noexcept { state_ += n * 0x9e3779b97f4a7c15ull; }
  // Uniform integer in [lo, hi] (inclusive).
  std::int64_t uniform(std::int64_t lo, std::int64_t hi) noexcept;
  // Uniform float in [0, 1).
  double unit() noexcept;
  bool chance(double p) noexcept { return unit() < p; }

 private:
  std::uint64_t state_;
};

struct RandomForestOptions {
  std::uint64_t seed = 1;
  HeadConfig heads{4, 2, 64, 0.0f};
  std::int32_t nodes = 32;
  std::int32_t roots = 1;               // independent requests (trees of the forest)
  std::int32_t queries = 16;
  std::int32_t min_tokens = 1, max_tokens = 64;  // per node
  double chain_bias = 0.3;     // chance a node hangs below the previous one (deeper trees)
  double leaf_queries = 0.8;   // chance a query sits on a leaf rather than any node
  double upto_fraction = 0.2;  // chance a query sees only a prefix of its node
  double listed_fraction = 0.5;  // chance a node lists its slots instead of a range
  bool sparse_ids = false;     // ids far from 0..n-1 (exercises the hashed id index)
};

// A forest whose tokens occupy distinct KV slots 0..total-1 (shuffled between
// nodes), so a slot identifies one (node, token) pair.
Tree random_forest(const RandomForestOptions& options);

// Few-shot prompting (docs/cli.md, Workloads): a `prompt`-token root and `branches`
// children of `generated` tokens each, one query per branch.
Tree few_shot_tree(const HeadConfig& heads, std::int64_t prompt, std::int32_t branches, std::int64_t generated);

// FastTree's kernel shapes: level k has nodes[k] nodes of context[k] tokens,
// spread evenly under the level above (nodes[0] roots); one query per leaf.
// Throws InvalidArgument when a level does not divide evenly.
Tree level_tree(const HeadConfig& heads, const std::vector<std::int64_t>& nodes,
                const std::vector<std::int64_t>& context);

// Model head shapes for realism (docs/cli.md, Workloads).
struct ModelShape {
  std::string name;
  HeadConfig heads;
  int layers;
};
const std::vector<ModelShape>& model_shapes();
// Throws InvalidArgument naming the known models.
const ModelShape& find_model(const std::string& name);

// Total tokens of a tree (the KV-pool rows random_forest uses).
std::int64_t total_tokens(const Tree& tree);

// Uniform values in [-amplitude, amplitude], rounded to `dtype`: element i is
// the seed's i-th output, so large arrays are filled by several threads and
// equal the sequential stream.
HostArray random_array(DType dtype, std::vector<std::int64_t> shape, std::uint64_t seed,
                       float amplitude = 1.0f);

}  // namespace treeattn

// treeattn random-inputs: seeded Q/K/V arrays that fit a tree file, for demos,
// benchmarks and bug reports.

#include <memory>

#include <fmt/format.h>

#include "cli_support.hpp"
#include "commands.hpp"
#include "treeattn/tools.hpp"
#include "treeattn/treeattn.hpp"

namespace treeattn::cli {
namespace {

struct RandomInputsOptions {
  std::string tree, out_dir = ".";
  std::string dtype = "f16";
  std::uint64_t seed = 1;
  float amplitude = 1.0f;
};

void run_random_inputs(const RandomInputsOptions& o) {
  const Tree tree = load_tree_json(o.tree);
  const Plan plan = treeattn::plan(tree);  // validates the tree and finds the highest slot
  const DType dtype = o.dtype == "f16" ? DType::f16 : o.dtype == "bf16" ? DType::bf16 : DType::f32;
  const std::int64_t slots = std::max<std::int64_t>(plan.min_kv_slots, 1);
  const HeadConfig& h = plan.heads;
  HostArray q = random_array(dtype, {plan.num_queries, h.heads_q, h.head_dim}, o.seed, o.amplitude);
  HostArray k = random_array(dtype, {slots, h.heads_kv, h.head_dim}, o.seed + 1, o.amplitude);
  HostArray v = random_array(dtype, {slots, h.heads_kv, h.head_dim}, o.seed + 2, o.amplitude);
  PendingOutputs outputs;
  outputs.write_npy(o.out_dir + "/q.npy", q.view());
  outputs.write_npy(o.out_dir + "/k.npy", k.view());
  outputs.write_npy(o.out_dir + "/v.npy", v.view());
  outputs.commit();
  fmt::print("wrote {0}/q.npy {1}, {0}/k.npy and {0}/v.npy {2}\n", o.out_dir, describe(q.view()), describe(k.view()));
}

}  // namespace

Command add_random_inputs_command(CLI::App& app) {
  auto o = std::make_shared<RandomInputsOptions>();
  CLI::App* sub = app.add_subcommand(
      "random-inputs",
      "Write seeded random q.npy, k.npy and v.npy that fit a tree file (uniform in [-amplitude, amplitude]).\n"
      "Example: treeattn random-inputs --tree examples/fewshot.json --out-dir /tmp/ex");
  sub->add_option("--tree", o->tree, "Tree JSON")->required();
  sub->add_option("--out-dir", o->out_dir, "Existing directory for q.npy, k.npy, v.npy")
      ->check(CLI::ExistingDirectory)
      ->capture_default_str();
  sub->add_option("--dtype", o->dtype, "Element type")->check(CLI::IsMember({"f16", "bf16", "f32"}))->capture_default_str();
  sub->add_option("--seed", o->seed, "Random seed")->capture_default_str();
  sub->add_option("--amplitude", o->amplitude, "Values are uniform in [-amplitude, amplitude]")
      ->check(positive())
      ->capture_default_str();
  return {sub, [o] { run_random_inputs(*o); }};
}

}  // namespace treeattn::cli

// treeattn demo: replays a tree-decoding run step by step (demo_loop.hpp) and
// reports it (demo_report.hpp). Here: its options and what they resolve to.

#include <algorithm>
#include <memory>

#include <fmt/format.h>

#include "cli_support.hpp"
#include "commands.hpp"
#include "demo_dry_replay.hpp"
#include "demo_loop.hpp"
#include "demo_options.hpp"
#include "demo_report.hpp"

namespace treeattn::cli {
namespace {

DemoSetup resolve_options(const DemoOptions& o) {
  DemoSetup s;
  s.model = &find_model(o.model);
  s.layers = o.layers > 0 ? o.layers : s.model->layers;
  s.named = std::move(make_scenarios(o.kind, o.workloads).front());
  if (o.steps == 0 && s.named.scenario->steps() == kEndless) {
    throw Error(ErrorCategory::InvalidArgument, fmt::format("{} has no end: give --steps", s.named.name));
  }
  s.steps = o.steps > 0 ? std::min(o.steps, s.named.scenario->steps()) : s.named.scenario->steps();
  s.svg_step = o.svg_step > 0 ? o.svg_step : s.steps;
  if (o.dump_step > s.steps || o.svg_step > s.steps) {
    throw Error(ErrorCategory::InvalidArgument, fmt::format("--svg-step/--dump-step beyond the {} steps run", s.steps));
  }
  if (o.dump_step > 0 && o.dump_dir.empty()) throw Error(ErrorCategory::InvalidArgument, "--dump-step needs --dump-dir");
  return s;
}

void run_demo(const DemoOptions& o) {
  DemoSetup setup = resolve_options(o);
  DemoLoop loop(o, setup, peak_sizes(o, setup.steps));
  loop.run_steps();
  print_summary(o, setup, loop);
  if (!o.json.empty()) write_json(o, setup, loop);
}

}  // namespace

Command add_demo_command(CLI::App& app) {
  auto o = std::make_shared<DemoOptions>();
  CLI::App* sub = app.add_subcommand(
      "demo",
      "Replay tree decoding step by step: a branch controller grows, forks and prunes the tree, a paged KV cache\n"
      "allocates and frees pages, and every step runs attention for every layer through the engine (synthetic\n"
      "Q/K/V). List options (--branches, --tree-size, --reasoning) use their first value.\n"
      "Examples: treeattn demo --workload fewshot --branches 20 --generated 100 --layers 2\n"
      "          treeattn demo --workload reasoning --reasoning keywordToT --layers 1 --svg tot.svg --svg-step 300\n"
      "          treeattn demo --workload serving --seed 1 --steps 100000 --layers 2 --check-every 1000 --json soak.json");
  sub->add_option("--workload", o->kind, "fewshot, speculative, reasoning or serving (endless: give --steps)")
      ->check(CLI::IsMember({"fewshot", "speculative", "reasoning", "serving"}))
      ->capture_default_str();
  sub->add_option("--model", o->model, "Model head shape")->check(CLI::IsMember(model_names()))->capture_default_str();
  sub->add_option("--layers", o->layers, "Attention layers per step (0: the model's)")->check(CLI::Range(0, 1000))->capture_default_str();
  sub->add_option("--steps", o->steps, "Decode steps to run (0: the whole workload)")->check(nonnegative())->capture_default_str();
  o->plan.add_to(*sub);
  sub->add_option("--backend", o->backend, "auto picks CUDA, then Vulkan, then the CPU")
      ->check(CLI::IsMember(backend_names()))
      ->capture_default_str();
  o->backend_flags.add_to(*sub);
  o->attention.add_to(*sub, "The KV cache in this fp8 kind (scale 1; the KV bytes count 1 per element)");
  sub->add_flag("--verbose", o->verbose,
                "Say on stderr which device each backend runs, and its kernels: variant, registers, occupancy");
  sub->add_option("--page-size", o->page_size, "Tokens per KV cache page")->check(CLI::Range(1, 4096))->capture_default_str();
  sub->add_option("--svg", o->svg, "Draw the tree and its plan at --svg-step as SVG");
  sub->add_option("--svg-step", o->svg_step, "Step to draw (0: the last)")->check(nonnegative());
  sub->add_option("--dump-step", o->dump_step, "Write this step's tree.json, q/k/v.npy and layer-0 o/lse.npy")
      ->check(nonnegative());
  sub->add_option("--dump-dir", o->dump_dir, "Existing directory for --dump-step")->check(CLI::ExistingDirectory);
  sub->add_option("--json", o->json, "Also write the summary as JSON");
  sub->add_option("--check-every", o->check_every,
                  "Soak: every Nth step, layer 0's O and LSE must equal the CPU backend's run of the step within "
                  "--check-tolerance, else the demo fails naming the step; host and device memory are sampled there")
      ->check(nonnegative());
  sub->add_option("--check-tolerance", o->check_tolerance, "Soak: largest absolute error allowed on O and LSE")
      ->check(nonnegative())
      ->capture_default_str();
  sub->add_flag("--bitwise-updates", o->bitwise_updates,
                std::string(kBitwiseUpdatesHelp) + "; a --dump-step is then reproduced bit for bit by treeattn run");
  o->workloads.add_to(*sub);
  sub->add_option("--live-tokens", o->workloads.serving.live_tokens, "serving: most tokens live at once (bounds the KV pool)")
      ->check(positive())
      ->capture_default_str();
  sub->add_option("--requests", o->workloads.serving.requests, "serving: most requests at once")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  return {sub, [o] { run_demo(*o); }};
}

}  // namespace treeattn::cli

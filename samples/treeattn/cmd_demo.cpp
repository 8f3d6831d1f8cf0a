// treeattn demo: replays a tree-decoding run step by step. A branch controller
// (the workload's Scenario) grows, forks and prunes a sequence tree whose KV
// lives in a paged cache; every step plans the live tree once and runs
// attention for every layer of the model through the engine, on synthetic
// Q/K/V. Ends with a summary; can draw the plan at one step and dump one step's
// inputs and outputs for `treeattn run`.

#include <unistd.h>

#include <chrono>
#include <map>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_support.hpp"
#include "commands.hpp"
#include "plan_svg.hpp"
#include "treeattn/tools.hpp"
#include "treeattn/treeattn.hpp"
#include "workload_options.hpp"

namespace treeattn::cli {
namespace {

struct DemoOptions {
  WorkloadOptions workloads;
  std::string kind = "fewshot";
  std::string model = "llama3-8b";
  int layers = 0;  // 0: the model's
  std::int64_t steps = 0;  // 0: the whole scenario
  PlanFlags plan;
  std::string backend = "auto";
  BackendFlags backend_flags;
  bool verbose = false;
  int page_size = 16;
  std::string svg;
  std::int64_t svg_step = 0;  // 0: the last step
  std::int64_t dump_step = 0;
  std::string dump_dir;
  std::string json;
};

// Synthetic K/V: a fixed function of (node, token, head, channel), so the same
// logical token has the same K and V wherever the cache put it.
float synthetic(std::uint64_t node, std::uint64_t token, std::uint64_t lane, std::uint64_t which) {
  Rng rng((node * 0x9e3779b97f4a7c15ull) ^ (token << 20) ^ (lane << 4) ^ which);
  return float(2.0 * rng.unit() - 1.0);
}

class ProgressBar {
 public:
  explicit ProgressBar(std::int64_t total) : total_(total), tty_(isatty(2) != 0) {}
  void update(std::int64_t done, const std::string& detail) {
    const auto now = std::chrono::steady_clock::now();
    const bool last = done == total_;
    if (tty_) {
      if (!last && now - shown_ < std::chrono::milliseconds(100)) return;
      const int filled = int(30 * done / std::max<std::int64_t>(total_, 1));
      fmt::print(stderr, "\r[{}{}] step {}/{}  {}", std::string(std::size_t(filled), '#'),
                 std::string(std::size_t(30 - filled), '.'), done, total_, detail);
      if (last) fmt::print(stderr, "\n");
    } else if (last || done * 10 / std::max<std::int64_t>(total_, 1) != reported_) {
      reported_ = done * 10 / std::max<std::int64_t>(total_, 1);
      fmt::print(stderr, "step {}/{}  {}\n", done, total_, detail);
    }
    shown_ = now;
  }

 private:
  std::int64_t total_;
  bool tty_;
  std::int64_t reported_ = -1;
  std::chrono::steady_clock::time_point shown_{};
};

void run_demo(const DemoOptions& o) {
  const ModelShape& model = find_model(o.model);
  const HeadConfig& heads = model.heads;
  const int layers = o.layers > 0 ? o.layers : model.layers;
  NamedScenario named = std::move(make_scenarios(o.kind, o.workloads).front());
  Scenario& scenario = *named.scenario;
  const std::int64_t steps = o.steps > 0 ? std::min(o.steps, scenario.steps()) : scenario.steps();
  const std::int64_t svg_step = o.svg_step > 0 ? o.svg_step : steps;
  if (o.dump_step > steps || o.svg_step > steps) {
    throw Error(ErrorCategory::InvalidArgument, fmt::format("--svg-step/--dump-step beyond the {} steps run", steps));
  }
  if (o.dump_step > 0 && o.dump_dir.empty()) throw Error(ErrorCategory::InvalidArgument, "--dump-step needs --dump-dir");

  // A dry run of the controller sizes the KV cache: the pool holds the peak.
  std::int64_t peak_pages = 0;
  {
    NamedScenario dry = std::move(make_scenarios(o.kind, o.workloads).front());
    PagedKvCache counter(o.page_size, 0);
    SequenceTree tree(counter);
    std::vector<TreeQuery> queries;
    for (std::int64_t s = 0; s < steps; ++s) dry.scenario->advance(tree, queries);
    peak_pages = counter.peak_pages_in_use();
  }
  PagedKvCache cache(o.page_size, peak_pages);
  SequenceTree live(cache);
  HostArray k(DType::f16, {cache.slots(), heads.heads_kv, heads.head_dim});
  HostArray v(DType::f16, {cache.slots(), heads.heads_kv, heads.head_dim});
  BackendOptions backend_options = o.backend_flags.options;
  backend_options.verbose = o.verbose;
  std::unique_ptr<Backend> backend = make_backend(parse_backend(o.backend), backend_options);
  fmt::print(stderr, "demo: {} on {} ({} layers, heads {}/{}/{}), backend {}, strategy {}, KV cache {} pages of {} tokens\n",
             named.name, model.name, layers, heads.heads_q, heads.heads_kv, heads.head_dim, backend->name(),
             o.plan.strategy, peak_pages, o.page_size);

  std::map<std::int64_t, std::int64_t> written;  // node -> tokens whose K/V rows are filled
  std::vector<TreeQuery> queries;
  const PlanOptions options = o.plan.options(cache.slots(), backend->cost_model());
  Planner planner(o.plan.plan_threads);  // one for the whole replay, as a serving loop keeps one
  ProgressBar progress(steps);
  std::int64_t generated = 0, unique_bytes = 0, sequence_bytes = 0, max_nodes = 0, max_queries = 0;
  double plan_us = 0.0, run_us = 0.0;
  for (std::int64_t step = 1; step <= steps; ++step) {
    generated += scenario.advance(live, queries);
    const Tree tree = live.to_tree(heads, queries);

    // New tokens get their K/V rows; pruned nodes simply stop being referenced.
    std::map<std::int64_t, std::int64_t> now;
    for (const TreeNode& node : tree.nodes()) {
      const std::int64_t from = written.count(node.id) ? written[node.id] : 0;
      for (std::int64_t t = from; t < node.length; ++t) {
        const std::size_t row = std::size_t(live.slot(node.id, t)) * std::size_t(heads.heads_kv * heads.head_dim);
        for (std::size_t e = 0; e < std::size_t(heads.heads_kv * heads.head_dim); ++e) {
          store_from_float(k.bytes.data(), DType::f16, row + e, synthetic(std::uint64_t(node.id), std::uint64_t(t), e, 1));
          store_from_float(v.bytes.data(), DType::f16, row + e, synthetic(std::uint64_t(node.id), std::uint64_t(t), e, 2));
        }
      }
      now[node.id] = node.length;
    }
    written = std::move(now);

    const auto t0 = std::chrono::steady_clock::now();
    const Plan plan = planner.plan(tree, options);
    const auto t1 = std::chrono::steady_clock::now();
    const std::int64_t nq = plan.num_queries;
    HostArray q = random_array(DType::f16, {nq, heads.heads_q, heads.head_dim}, std::uint64_t(step));
    HostArray out(DType::f32, {nq, heads.heads_q, heads.head_dim}), lse(DType::f32, {nq, heads.heads_q});
    for (int layer = 0; layer < layers; ++layer) {
      backend->run(plan, AttentionArgs{q.view(), k.view(), v.view(), out.view(), lse.view()});
    }
    const auto t2 = std::chrono::steady_clock::now();
    plan_us += std::chrono::duration<double, std::micro>(t1 - t0).count();
    run_us += std::chrono::duration<double, std::micro>(t2 - t1).count();

    const PlanStats st = compute_stats(plan);
    unique_bytes += st.kv_bytes(st.tokens, 2) * layers;
    sequence_bytes += st.kv_bytes(st.sequence_read_tokens, 2) * layers;
    max_nodes = std::max<std::int64_t>(max_nodes, std::int64_t(tree.node_count()));
    max_queries = std::max(max_queries, nq);

    if (step == svg_step && !o.svg.empty()) {
      PendingOutputs outputs;
      outputs.write_text(o.svg, plan_svg(tree, plan, fmt::format("{} on {}, step {}", named.name, model.name, step)));
      outputs.commit();
    }
    if (step == o.dump_step) {
      PendingOutputs outputs;
      outputs.write_text(o.dump_dir + "/tree.json", tree_to_json(tree));
      outputs.write_npy(o.dump_dir + "/q.npy", q.view());
      outputs.write_npy(o.dump_dir + "/k.npy", k.view());
      outputs.write_npy(o.dump_dir + "/v.npy", v.view());
      outputs.write_npy(o.dump_dir + "/o.npy", out.view());
      outputs.write_npy(o.dump_dir + "/lse.npy", lse.view());
      outputs.commit();
    }
    progress.update(step, fmt::format("{} nodes, {} queries, {} tokens, {:.1f} ms/step", tree.node_count(), nq,
                                      live.tokens(), (plan_us + run_us) / 1e3 / double(step)));
  }

  const double per_step_ms = (plan_us + run_us) / 1e3 / double(steps);
  fmt::print("demo: {} on {}, backend {}, strategy {}\n", named.name, model.name, backend->name(), o.plan.strategy);
  fmt::print("  steps {}, tokens generated {}, live nodes at most {}, queries per step at most {}\n", steps, generated,
             max_nodes, max_queries);
  fmt::print("  attention per step {:.2f} ms for {} layer{} (planning once: {:.3f} ms of it)\n", per_step_ms, layers,
             layers == 1 ? "" : "s", plan_us / 1e3 / double(steps));
  fmt::print("  KV read: {} unique tree KV vs {} for sequence-based decoding: {} saved ({:.2f}x less)\n",
             format_bytes(double(unique_bytes)), format_bytes(double(sequence_bytes)),
             format_bytes(double(sequence_bytes - unique_bytes)), double(sequence_bytes) / double(std::max<std::int64_t>(unique_bytes, 1)));
  fmt::print("  KV cache: {} pages of {} tokens in use at peak, {} at the end\n", cache.peak_pages_in_use(),
             o.page_size, cache.pages_in_use());
  if (!o.json.empty()) {
    const nlohmann::json summary = {{"workload", named.name}, {"model", model.name}, {"backend", backend->name()},
                                    {"strategy", o.plan.strategy}, {"layers", layers}, {"steps", steps},
                                    {"tokens_generated", generated}, {"attention_ms_per_step", per_step_ms},
                                    {"plan_ms_per_step", plan_us / 1e3 / double(steps)},
                                    {"unique_kv_bytes", unique_bytes}, {"sequence_kv_bytes", sequence_bytes},
                                    {"peak_pages", cache.peak_pages_in_use()}, {"page_size", o.page_size}};
    PendingOutputs outputs;
    outputs.write_text(o.json, summary.dump(2) + "\n");
    outputs.commit();
  }
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
      "          treeattn demo --workload reasoning --reasoning keywordToT --layers 1 --svg tot.svg --svg-step 300");
  sub->add_option("--workload", o->kind, "fewshot, speculative or reasoning")
      ->check(CLI::IsMember({"fewshot", "speculative", "reasoning"}))
      ->capture_default_str();
  sub->add_option("--model", o->model, "Model head shape")->check(CLI::IsMember(model_names()))->capture_default_str();
  sub->add_option("--layers", o->layers, "Attention layers per step (0: the model's)")->check(CLI::Range(0, 1000))->capture_default_str();
  sub->add_option("--steps", o->steps, "Decode steps to run (0: the whole workload)")->check(CLI::NonNegativeNumber)->capture_default_str();
  o->plan.add_to(*sub);
  sub->add_option("--backend", o->backend, "auto picks CUDA, then Vulkan, then the CPU")
      ->check(CLI::IsMember(backend_names()))
      ->capture_default_str();
  o->backend_flags.add_to(*sub);
  sub->add_flag("--verbose", o->verbose,
                "Say on stderr which device each backend runs, and its kernels: variant, registers, occupancy");
  sub->add_option("--page-size", o->page_size, "Tokens per KV cache page")->check(CLI::Range(1, 4096))->capture_default_str();
  sub->add_option("--svg", o->svg, "Draw the tree and its plan at --svg-step as SVG");
  sub->add_option("--svg-step", o->svg_step, "Step to draw (0: the last)")->check(CLI::NonNegativeNumber);
  sub->add_option("--dump-step", o->dump_step, "Write this step's tree.json, q/k/v.npy and layer-0 o/lse.npy")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--dump-dir", o->dump_dir, "Existing directory for --dump-step")->check(CLI::ExistingDirectory);
  sub->add_option("--json", o->json, "Also write the summary as JSON");
  o->workloads.add_to(*sub);
  return {sub, [o] { run_demo(*o); }};
}

}  // namespace treeattn::cli

// treeattn demo: replays a tree-decoding run step by step. A branch controller
// (the workload's Scenario) grows, forks and prunes a sequence tree whose KV
// lives in a paged cache; every step hands the tree's changes to an
// IncrementalPlanner and runs attention for every layer of the model on
// synthetic Q/K/V (on CUDA through the device path, the next step planned
// while the GPU runs this one). Reports per step the planning, upload and
// attention times; can draw the plan at one step and dump one step's inputs
// and outputs for `treeattn run`.

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_support.hpp"
#include "commands.hpp"
#include "demo_runner.hpp"
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
  bool bitwise_updates = false;
};

// Synthetic K/V: a fixed function of (slot, head, channel): a replay writes the
// same data for every strategy and backend.
float synthetic(std::uint64_t slot, std::uint64_t lane, std::uint64_t which) {
  Rng rng((slot * 0x9e3779b97f4a7c15ull) ^ (lane << 4) ^ which);
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

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One decode step's host and device times (microseconds).
struct StepRecord {
  std::int64_t nodes = 0, queries = 0, tokens = 0;
  double plan_update_us = 0.0;  // the IncrementalPlanner's update (the plan the step runs)
  double plan_us = 0.0;         // a from-scratch plan of the same tree, for comparison
  double upload_us = 0.0;       // the plan's upload, on the host
  double gpu_wait_us = 0.0;     // the host two steps ahead, waiting for the GPU (not in host_us)
  double host_us = 0.0;         // treeattn's host part: the changes handed over, the update, upload and queueing
                                // (waiting for the GPU left out)
  double attention_us = 0.0;    // every layer's attention (GPU time on the device path)
  bool reanalysed = false, chosen = false, held_layout = false;
  std::int64_t replaced_nodes = 0;  // nodes that came in place of ones of the same shape
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

  // A dry run of the controller sizes the KV cache (the pool holds the peak) and Q.
  std::int64_t peak_pages = 0, peak_queries = 1;
  {
    NamedScenario dry = std::move(make_scenarios(o.kind, o.workloads).front());
    PagedKvCache counter(o.page_size, 0);
    SequenceTree tree(counter);
    std::vector<TreeQuery> queries;
    for (std::int64_t s = 0; s < steps; ++s) {
      dry.scenario->advance(tree, queries);
      peak_queries = std::max(peak_queries, std::int64_t(queries.size()));
    }
    peak_pages = counter.peak_pages_in_use();
  }
  PagedKvCache cache(o.page_size, peak_pages);
  SequenceTree live(cache);
  HostArray k(DType::f16, {cache.slots(), heads.heads_kv, heads.head_dim});
  HostArray v(DType::f16, {cache.slots(), heads.heads_kv, heads.head_dim});
  BackendOptions backend_options = o.backend_flags.options;
  backend_options.verbose = o.verbose;
  std::unique_ptr<Backend> backend = make_backend(parse_backend(o.backend), backend_options);
  std::unique_ptr<StepRunner> runner = make_step_runner(*backend, backend_options, heads, k, v, peak_queries);
  fmt::print(stderr, "demo: {} on {} ({} layers, heads {}/{}/{}), backend {} ({}), strategy {}, KV cache {} pages of {} tokens\n",
             named.name, model.name, layers, heads.heads_q, heads.heads_kv, heads.head_dim, backend->name(),
             runner->name(), o.plan.strategy, peak_pages, o.page_size);

  std::vector<TreeQuery> queries;
  const PlanOptions options = o.plan.options(cache.slots(), backend->cost_model());
  // The plan each step runs comes from an IncrementalPlanner fed the tree's
  // changes; a from-scratch Planner plans the same tree beside it, timed for comparison.
  IncrementalPlanner incremental(heads, options, incremental_options(o.bitwise_updates, o.plan.plan_threads));
  Planner planner(o.plan.plan_threads);
  ProgressBar progress(steps);
  std::vector<StepRecord> records;
  std::size_t timed = 0;  // records whose attention time is in
  std::int64_t generated = 0, unique_bytes = 0, sequence_bytes = 0;
  std::vector<std::int64_t> new_slots;
  auto collect = [&](bool wait) {
    for (double us : runner->finished(wait)) records[timed++].attention_us = us;
  };
  auto since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t).count();
  };
  for (std::int64_t step = 1; step <= steps; ++step) {
    StepRecord record;
    generated += scenario.advance(live, queries);
    const auto sync_start = std::chrono::steady_clock::now();
    new_slots.clear();
    live.sync(incremental, queries, &new_slots);
    record.host_us = since(sync_start);
    const Tree& tree = incremental.tree();

    // The tokens handed over get their K/V rows; pruned nodes simply stop being referenced.
    for (const std::int64_t slot : new_slots) {
      const std::size_t row = std::size_t(slot) * std::size_t(heads.heads_kv * heads.head_dim);
      for (std::size_t e = 0; e < std::size_t(heads.heads_kv * heads.head_dim); ++e) {
        store_from_float(k.bytes.data(), DType::f16, row + e, synthetic(std::uint64_t(slot), e, 1));
        store_from_float(v.bytes.data(), DType::f16, row + e, synthetic(std::uint64_t(slot), e, 2));
      }
    }
    runner->kv_written(new_slots);

    const auto t0 = std::chrono::steady_clock::now();
    const Plan& plan = incremental.update();
    record.plan_update_us = since(t0);
    record.reanalysed = incremental.last_update().reanalysed;
    record.replaced_nodes = incremental.last_update().replaced_nodes;
    record.chosen = incremental.last_update().chosen;
    record.held_layout = incremental.last_update().held_layout;
    const std::int64_t nq = plan.num_queries;
    const HostArray q = random_array(DType::f16, {nq, heads.heads_q, heads.head_dim}, std::uint64_t(step));
    const auto t1 = std::chrono::steady_clock::now();
    const StepRunner::HostTimes run = runner->run(plan, q, layers);
    record.upload_us = run.upload_us;
    record.gpu_wait_us = run.waited_us;
    record.host_us += record.plan_update_us + since(t1) - run.waited_us;
    records.push_back(record);

    // Beside the step (the GPU may still be running it): the from-scratch plan, statistics, files.
    const auto s0 = std::chrono::steady_clock::now();
    const Plan scratch = planner.plan(tree, options);
    records.back().plan_us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - s0).count();
    const PlanStats st = compute_stats(plan);
    unique_bytes += st.kv_bytes(st.tokens, 2) * layers;
    sequence_bytes += st.kv_bytes(st.sequence_read_tokens, 2) * layers;
    records.back().nodes = std::int64_t(tree.node_count());
    records.back().queries = nq;
    records.back().tokens = live.tokens();

    if (step == svg_step && !o.svg.empty()) {
      PendingOutputs outputs;
      outputs.write_text(o.svg, plan_svg(tree, plan, fmt::format("{} on {}, step {}", named.name, model.name, step)));
      outputs.commit();
    }
    if (step == o.dump_step) {
      HostArray out, lse;
      runner->outputs(out, lse);
      PendingOutputs outputs;
      outputs.write_text(o.dump_dir + "/tree.json", tree_to_json(tree));
      outputs.write_npy(o.dump_dir + "/q.npy", const_cast<HostArray&>(q).view());
      outputs.write_npy(o.dump_dir + "/k.npy", k.view());
      outputs.write_npy(o.dump_dir + "/v.npy", v.view());
      outputs.write_npy(o.dump_dir + "/o.npy", out.view());
      outputs.write_npy(o.dump_dir + "/lse.npy", lse.view());
      outputs.commit();
    }
    collect(false);
    progress.update(step, fmt::format("{} nodes, {} queries, {} tokens, plan update {:.0f} us", tree.node_count(), nq,
                                      live.tokens(), record.plan_update_us));
  }
  collect(true);

  auto column = [&](double StepRecord::*field) {
    std::vector<double> values;
    for (const StepRecord& r : records) values.push_back(r.*field);
    return values;
  };
  auto mean = [](const std::vector<double>& values) {
    double sum = 0.0;
    for (double x : values) sum += x;
    return values.empty() ? 0.0 : sum / double(values.size());
  };
  const std::vector<double> update_us = column(&StepRecord::plan_update_us), plan_us = column(&StepRecord::plan_us),
                            upload_us = column(&StepRecord::upload_us), host_us = column(&StepRecord::host_us),
                            attention_us = column(&StepRecord::attention_us), gpu_wait_us = column(&StepRecord::gpu_wait_us);
  std::int64_t max_nodes = 0, max_queries = 0, appended_only = 0, replaced = 0, chosen = 0, held = 0;
  for (const StepRecord& r : records) {
    max_nodes = std::max(max_nodes, r.nodes);
    max_queries = std::max(max_queries, r.queries);
    appended_only += !r.reanalysed && r.replaced_nodes == 0 ? 1 : 0;
    replaced += !r.reanalysed && r.replaced_nodes > 0 ? 1 : 0;
    chosen += r.chosen ? 1 : 0;
    held += r.held_layout ? 1 : 0;
  }
  fmt::print("demo: {} on {}, backend {} ({}), strategy {}\n", named.name, model.name, backend->name(), runner->name(),
             o.plan.strategy);
  fmt::print("  steps {}, tokens generated {}, live nodes at most {}, queries per step at most {}\n", steps, generated,
             max_nodes, max_queries);
  fmt::print("  attention per step {:.3f} ms for {} layer{} (median; {})\n", median(attention_us) / 1e3, layers,
             layers == 1 ? "" : "s", runner->overlaps() ? "GPU time" : "wall time of the backend's calls");
  fmt::print("  planning per step (median): {:.1f} us updated incrementally ({} of {} steps by appends alone, {} by "
             "same-shape replacements, {} on a held layout, the cost model's choices made {} time{}), {:.1f} us from "
             "scratch\n",
             median(update_us), appended_only, steps, replaced, held, chosen, chosen == 1 ? "" : "s", median(plan_us));
  if (runner->overlaps()) {
    fmt::print("  treeattn on the host per step (median; the changes handed over, the update, the upload, the "
               "layers queued): {:.1f} us, the upload {:.1f} us of it, while the GPU runs the step before: {} (then "
               "{:.1f} us waiting for the GPU, two steps ahead)\n",
               median(host_us), median(upload_us),
               median(host_us) < median(attention_us) ? "hidden behind it" : "longer than it", median(gpu_wait_us));
  }
  fmt::print("  KV read: {} unique tree KV vs {} for sequence-based decoding: {} saved ({:.2f}x less)\n",
             format_bytes(double(unique_bytes)), format_bytes(double(sequence_bytes)),
             format_bytes(double(sequence_bytes - unique_bytes)), double(sequence_bytes) / double(std::max<std::int64_t>(unique_bytes, 1)));
  fmt::print("  KV cache: {} pages of {} tokens in use at peak, {} at the end\n", cache.peak_pages_in_use(),
             o.page_size, cache.pages_in_use());
  if (!o.json.empty()) {
    nlohmann::json per_step = nlohmann::json::array();
    for (std::size_t i = 0; i < records.size(); ++i) {
      const StepRecord& r = records[i];
      per_step.push_back({{"step", i + 1}, {"nodes", r.nodes}, {"queries", r.queries}, {"tokens", r.tokens},
                          {"plan_update_us", r.plan_update_us}, {"plan_us", r.plan_us}, {"upload_us", r.upload_us},
                          {"gpu_wait_us", r.gpu_wait_us}, {"host_us", r.host_us}, {"attention_us", r.attention_us}, {"reanalysed", r.reanalysed},
                          {"replaced_nodes", r.replaced_nodes}, {"chosen", r.chosen}, {"held_layout", r.held_layout}});
    }
    const nlohmann::json summary = {{"workload", named.name},
                                    {"model", model.name},
                                    {"backend", backend->name()},
                                    {"runner", runner->name()},
                                    {"strategy", o.plan.strategy},
                                    {"block_tokens_option", o.plan.block_tokens},
                                    {"layers", layers},
                                    {"steps", steps},
                                    {"tokens_generated", generated},
                                    {"attention_ms_per_step", mean(attention_us) / 1e3},
                                    {"plan_ms_per_step", mean(update_us) / 1e3},
                                    {"plan_update_median_us", median(update_us)},
                                    {"plan_median_us", median(plan_us)},
                                    {"upload_median_us", median(upload_us)},
                                    {"host_step_median_us", median(host_us)},
                                    {"gpu_wait_median_us", median(gpu_wait_us)},
                                    {"attention_median_us", median(attention_us)},
                                    {"attention_overlaps_host", runner->overlaps()},
                                    {"steps_by_appends", appended_only},
                                    {"steps_by_replacement", replaced},
                                    {"choices_made", chosen},
                                    {"steps_on_held_layout", held},
                                    {"bitwise_updates", o.bitwise_updates},
                                    {"unique_kv_bytes", unique_bytes},
                                    {"sequence_kv_bytes", sequence_bytes},
                                    {"peak_pages", cache.peak_pages_in_use()},
                                    {"page_size", o.page_size},
                                    {"per_step", per_step}};
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
  sub->add_flag("--bitwise-updates", o->bitwise_updates,
                std::string(kBitwiseUpdatesHelp) + "; a --dump-step is then reproduced bit for bit by treeattn run");
  o->workloads.add_to(*sub);
  return {sub, [o] { run_demo(*o); }};
}

}  // namespace treeattn::cli

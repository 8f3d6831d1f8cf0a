// treeattn demo: replays a tree-decoding run step by step. A branch controller
// (the workload's Scenario) grows, forks and prunes a sequence tree whose KV
// lives in a paged cache; every step hands the tree's changes to an
// IncrementalPlanner and runs attention for every layer of the model on
// synthetic Q/K/V (on CUDA and Vulkan through the device path, the next step
// planned while the GPU runs this one). Reports per step the planning, upload
// and attention times; can draw the plan at one step and dump one step's
// inputs and outputs for `treeattn run`. A soak (--check-every) checks every
// Nth step's outputs against the CPU backend and samples memory there; a run
// of any length keeps an evenly spaced sample of its steps, not all of them.

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_support.hpp"
#include "commands.hpp"
#include "attention_flags.hpp"
#include "demo_runner.hpp"
#include "demo_soak.hpp"
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
  AttentionFlags attention;
  bool verbose = false;
  int page_size = 16;
  std::string svg;
  std::int64_t svg_step = 0;  // 0: the last step
  std::int64_t dump_step = 0;
  std::string dump_dir;
  std::string json;
  bool bitwise_updates = false;
  std::int64_t check_every = 0;    // 0: no checks
  double check_tolerance = 2e-3;   // the conformance suite's for f16 inputs (docs/testing.md)
};

// Synthetic K/V: a fixed function of (slot, head, channel): a replay writes the
// same data for every strategy and backend.
float synthetic(std::uint64_t slot, std::uint64_t lane, std::uint64_t which) {
  Rng rng((slot * 0x9e3779b97f4a7c15ull) ^ (lane << 4) ^ which);
  return float(2.0 * rng.unit() - 1.0);
}

// On a terminal a bar redrawn at most ten times a second; in a log a line per
// tenth of the run, and at least one a minute, so a long soak shows it lives.
class ProgressBar {
 public:
  explicit ProgressBar(std::int64_t total) : total_(total), tty_(isatty(2) != 0) {}
  // `detail` is called only when a line is shown.
  template <typename Detail>
  void update(std::int64_t done, Detail&& detail) {
    const auto now = std::chrono::steady_clock::now();
    const bool last = done == total_;
    const std::int64_t tenth = done * 10 / std::max<std::int64_t>(total_, 1);
    if (tty_ ? !last && now - shown_ < std::chrono::milliseconds(100)
             : !last && tenth == reported_ && now - shown_ < std::chrono::minutes(1)) {
      return;
    }
    // The pace once a second has passed: the first steps (a prefill, a capture) say little of it.
    const double seconds = std::chrono::duration<double>(now - start_).count();
    const double rate = double(done) / std::max(seconds, 1e-9);
    const std::string pace =
        seconds < 1.0 ? "" : fmt::format(" ({:.0f} steps/s, {:.0f} s left)", rate, double(total_ - done) / rate);
    if (tty_) {
      const int filled = int(30 * done / std::max<std::int64_t>(total_, 1));
      fmt::print(stderr, "\r[{}{}] step {}/{}{}  {}\x1b[K", std::string(std::size_t(filled), '#'),
                 std::string(std::size_t(30 - filled), '.'), done, total_, pace, detail());
      if (last) fmt::print(stderr, "\n");
    } else {
      fmt::print(stderr, "step {}/{}{}  {}\n", done, total_, pace, detail());
    }
    reported_ = tenth;
    shown_ = now;
  }

 private:
  std::int64_t total_;
  bool tty_;
  std::int64_t reported_ = -1;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now(), shown_ = start_;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// One decode step's host and device times (microseconds).
struct StepRecord {
  std::int64_t step = 0, nodes = 0, queries = 0, tokens = 0;
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

// Counts and sums over every step of a run (its rows are only sampled).
struct StepCounts {
  std::int64_t steps = 0, max_nodes = 0, max_queries = 0, appended_only = 0, replaced = 0, chosen = 0, held = 0;
  double attention_us = 0.0, update_us = 0.0;

  void add(const StepRecord& r) {
    ++steps;
    max_nodes = std::max(max_nodes, r.nodes);
    max_queries = std::max(max_queries, r.queries);
    appended_only += !r.reanalysed && r.replaced_nodes == 0 ? 1 : 0;
    replaced += !r.reanalysed && r.replaced_nodes > 0 ? 1 : 0;
    chosen += r.chosen ? 1 : 0;
    held += r.held_layout ? 1 : 0;
    attention_us += r.attention_us;
    update_us += r.plan_update_us;
  }
};

// Rows kept of a run's steps: all of a short run's, an evenly spaced sample of a long one's.
constexpr std::size_t kStepRows = 4096;

// What the options resolve to: the model, the scenario, and the steps to run.
struct DemoSetup {
  const ModelShape* model = nullptr;
  int layers = 0;
  NamedScenario named;
  std::int64_t steps = 0, svg_step = 0;
};

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

// A dry run of the controller sizes the KV cache (the pool holds the peak) and Q.
struct PeakSizes {
  std::int64_t pages = 0, queries = 1;
};

PeakSizes dry_run(const DemoOptions& o, std::int64_t steps) {
  NamedScenario dry = std::move(make_scenarios(o.kind, o.workloads).front());
  PagedKvCache counter(o.page_size, 0);
  SequenceTree tree(counter);
  std::vector<TreeQuery> queries;
  PeakSizes peak;
  for (std::int64_t s = 0; s < steps; ++s) {
    dry.scenario->advance(tree, queries);
    peak.queries = std::max(peak.queries, std::int64_t(queries.size()));
  }
  peak.pages = counter.peak_pages_in_use();
  return peak;
}

// The tokens handed over get their K/V rows; pruned nodes simply stop being referenced.
void write_kv_rows(HostArray& k, HostArray& v, const HeadConfig& heads, const std::vector<std::int64_t>& slots) {
  const std::size_t row_elements = std::size_t(heads.heads_kv * heads.head_dim);
  for (const std::int64_t slot : slots) {
    const std::size_t row = std::size_t(slot) * row_elements;
    for (std::size_t e = 0; e < row_elements; ++e) {
      store_from_float(k.bytes.data(), k.dtype, row + e, synthetic(std::uint64_t(slot), e, 1));
      store_from_float(v.bytes.data(), v.dtype, row + e, synthetic(std::uint64_t(slot), e, 2));
    }
  }
}

double since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t).count();
}

// The replay: the live tree in its paged KV cache, the runner of each step's
// layers, the planners, and what each step recorded.
class DemoLoop {
 public:
  DemoLoop(const DemoOptions& o, DemoSetup& setup, const PeakSizes& peak)
      : o_(o),
        setup_(setup),
        heads_(setup.model->heads),
        cache_(o.page_size, peak.pages),
        live_(cache_),
        k_(o.attention.fp8().value_or(DType::f16), {cache_.slots(), heads_.heads_kv, heads_.head_dim}),
        v_(k_.dtype, {cache_.slots(), heads_.heads_kv, heads_.head_dim}),
        sinks_(o.attention.read_sinks()),
        variants_(o.attention.options(sinks_)),
        backend_(backend_for(o, heads_, variants_, k_.dtype)),
        runner_(make_step_runner(*backend_, backend_options(o), heads_, k_, v_, peak.queries, variants_)),
        options_(o.plan.options(cache_.slots(), backend_->cost_model())),
        // The plan each step runs comes from an IncrementalPlanner fed the tree's
        // changes; a from-scratch Planner plans the same tree beside it, timed for comparison.
        incremental_(heads_, options_, incremental_options(o.bitwise_updates, o.plan.plan_threads)),
        planner_(o.plan.plan_threads),
        progress_(setup.steps),
        soak_(o.check_every > 0 ? std::make_unique<SoakChecks>(o.check_every, o.check_tolerance, setup.steps, variants_) : nullptr) {
    const std::string variants = o.attention.describe();
    fmt::print(stderr, "demo: {} on {} ({} layers, heads {}/{}/{}{}), backend {} ({}), strategy {}, KV cache {} pages of {} tokens\n",
               setup.named.name, setup.model->name, setup.layers, heads_.heads_q, heads_.heads_kv, heads_.head_dim,
               variants.empty() ? "" : ", " + variants, backend_->name(), runner_->name(), o.plan.strategy, peak.pages,
               o.page_size);
  }

  // A runner that captures its steps as a graph gets the run's largest plan
  // ahead, from a dry replay planned as the run plans (the same changes,
  // options and pool size, so the same plans), and captures once.
  void size_workspace() {
    if (runner_->graph_captures().count < 0) return;
    const auto t0 = std::chrono::steady_clock::now();
    NamedScenario dry = std::move(make_scenarios(o_.kind, o_.workloads).front());
    PagedKvCache cache(o_.page_size, cache_.capacity_pages());
    SequenceTree tree(cache);
    IncrementalPlanner planner(heads_, options_, incremental_options(o_.bitwise_updates, o_.plan.plan_threads));
    std::vector<TreeQuery> queries;
    cuda::WorkspaceLimits largest;
    for (std::int64_t step = 1; step <= setup_.steps; ++step) {
      dry.scenario->advance(tree, queries);
      tree.sync(planner, queries);
      const cuda::WorkspaceLimits need = cuda::WorkspaceLimits::of(planner.update());
      largest = step == 1 ? need : largest.include(need);
    }
    runner_->size_for(largest);
    fmt::print(stderr, "demo: workspace sized for the run's largest plan ({} queries, {} partials, {} tokens; dry "
               "replay {:.1f} s)\n", largest.queries, largest.partials, largest.tokens, since(t0) / 1e6);
  }

  void run_steps() {
    size_workspace();
    for (std::int64_t step = 1; step <= setup_.steps; ++step) run_step(step);
    collect(true);
  }

  const Sampled<StepRecord>& rows() const { return rows_; }
  const StepCounts& counts() const { return counts_; }
  const SoakChecks* soak() const { return soak_.get(); }
  const Backend& backend() const { return *backend_; }
  const StepRunner& runner() const { return *runner_; }
  const PagedKvCache& cache() const { return cache_; }
  // Tokens generated, and the KV bytes every layer's attention read (unique tree KV) or would read sequence by sequence.
  struct Totals {
    std::int64_t generated = 0, unique_bytes = 0, sequence_bytes = 0;
  };
  const Totals& totals() const { return totals_; }

 private:
  static BackendOptions backend_options(const DemoOptions& o) {
    BackendOptions b = o.backend_flags.options;
    b.verbose = o.verbose;
    return b;
  }

  // --backend's, where "auto" is the first backend that runs the attention variants asked for.
  static std::unique_ptr<Backend> backend_for(const DemoOptions& o, const HeadConfig& heads, const AttentionOptions& variants,
                                              DType kv) {
    const BackendKind kind = parse_backend(o.backend);
    std::unique_ptr<Backend> backend = make_backend(kind, backend_options(o));
    if (kind == BackendKind::automatic && !unsupported_variant(heads, variants, kv, backend->variants()).empty()) {
      backend = make_backend(BackendKind::cpu, backend_options(o));
    }
    return backend;
  }

  // One decode step: the tree's changes handed over with the new tokens' K/V,
  // the plan updated and the layers queued; beside them, the from-scratch plan,
  // the statistics and the files asked for.
  void run_step(std::int64_t step) {
    StepRecord record;
    record.step = step;
    totals_.generated += setup_.named.scenario->advance(live_, queries_);
    const auto sync_start = std::chrono::steady_clock::now();
    new_slots_.clear();
    live_.sync(incremental_, queries_, &new_slots_);
    record.host_us = since(sync_start);
    write_kv_rows(k_, v_, heads_, new_slots_);
    runner_->kv_written(new_slots_);
    const Plan& plan = update_plan(record);
    const HostArray q =
        random_array(DType::f16, {plan.num_queries, heads_.heads_q, heads_.head_dim}, std::uint64_t(step));
    queue_layers(plan, q, record);
    running_.push_back(record);
    beside_the_step(step, plan, q);
    collect(false);
    progress_.update(step, [&] {
      std::string detail = fmt::format("{} nodes, {} queries, {} tokens, plan update {:.0f} us",
                                       incremental_.tree().node_count(), plan.num_queries, live_.tokens(),
                                       record.plan_update_us);
      if (soak_) {
        detail += fmt::format(", {} checks passed (max error {:.2g}), host RSS {}", soak_->checks(), soak_->max_error(),
                              format_bytes(double(host_rss_bytes())));
      }
      return detail;
    });
  }

  const Plan& update_plan(StepRecord& record) {
    const auto t0 = std::chrono::steady_clock::now();
    const Plan& plan = incremental_.update();
    record.plan_update_us = since(t0);
    const PlanUpdate& last = incremental_.last_update();
    record.reanalysed = last.reanalysed;
    record.replaced_nodes = last.replaced_nodes;
    record.chosen = last.chosen;
    record.held_layout = last.held_layout;
    return plan;
  }

  void queue_layers(const Plan& plan, const HostArray& q, StepRecord& record) {
    const auto t1 = std::chrono::steady_clock::now();
    const StepRunner::HostTimes run = runner_->run(plan, q, setup_.layers);
    record.upload_us = run.upload_us;
    record.gpu_wait_us = run.waited_us;
    record.host_us += record.plan_update_us + since(t1) - run.waited_us;
  }

  // Beside the step (the GPU may still be running it): the from-scratch plan, statistics, files.
  void beside_the_step(std::int64_t step, const Plan& plan, const HostArray& q) {
    const Tree& tree = incremental_.tree();
    const auto s0 = std::chrono::steady_clock::now();
    const Plan scratch = planner_.plan(tree, options_);
    StepRecord& record = running_.back();
    record.plan_us = since(s0);
    const PlanStats st = compute_stats(plan);
    totals_.unique_bytes += st.kv_bytes(st.tokens, dtype_size(k_.dtype)) * setup_.layers;
    totals_.sequence_bytes += st.kv_bytes(st.sequence_read_tokens, dtype_size(k_.dtype)) * setup_.layers;
    record.nodes = std::int64_t(tree.node_count());
    record.queries = plan.num_queries;
    record.tokens = live_.tokens();
    if (step == setup_.svg_step && !o_.svg.empty()) {
      PendingOutputs outputs;
      outputs.write_text(o_.svg, plan_svg(tree, plan, fmt::format("{} on {}, step {}", setup_.named.name,
                                                                  setup_.model->name, step)));
      outputs.commit();
    }
    if (step == o_.dump_step) dump_step(tree, q);
    if (soak_ && soak_->due(step)) soak_->check(step, plan, q, k_, v_, *runner_);
  }

  // The step's tree.json and Q/K/V as `treeattn run` reads them, and layer 0's O and LSE.
  void dump_step(const Tree& tree, const HostArray& q) {
    HostArray out, lse;
    runner_->outputs(out, lse);
    PendingOutputs outputs;
    outputs.write_text(o_.dump_dir + "/tree.json", tree_to_json(tree));
    outputs.write_npy(o_.dump_dir + "/q.npy", const_cast<HostArray&>(q).view());
    outputs.write_npy(o_.dump_dir + "/k.npy", k_.view());
    outputs.write_npy(o_.dump_dir + "/v.npy", v_.view());
    outputs.write_npy(o_.dump_dir + "/o.npy", out.view());
    outputs.write_npy(o_.dump_dir + "/lse.npy", lse.view());
    outputs.commit();
  }

  // The attention times of the steps the runner has finished (all with `wait`).
  void collect(bool wait) {
    for (double us : runner_->finished(wait)) {
      running_.front().attention_us = us;
      counts_.add(running_.front());
      rows_.add(running_.front());
      running_.pop_front();
    }
  }

  const DemoOptions& o_;
  DemoSetup& setup_;
  const HeadConfig& heads_;
  PagedKvCache cache_;
  SequenceTree live_;
  HostArray k_, v_, sinks_;
  const AttentionOptions variants_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<StepRunner> runner_;
  const PlanOptions options_;
  IncrementalPlanner incremental_;
  Planner planner_;
  ProgressBar progress_;
  std::unique_ptr<SoakChecks> soak_;
  std::deque<StepRecord> running_;  // steps whose attention time is not in yet
  Sampled<StepRecord> rows_{kStepRows};
  StepCounts counts_;
  Totals totals_;
  std::vector<TreeQuery> queries_;
  std::vector<std::int64_t> new_slots_;
};

// The sampled rows' columns the summary takes medians of, and the counts of every step.
struct DemoSummary {
  std::vector<double> update_us, plan_us, upload_us, host_us, attention_us, gpu_wait_us;
  StepCounts all;
};

DemoSummary summarize(const std::vector<StepRecord>& rows, const StepCounts& counts) {
  auto column = [&](double StepRecord::*field) {
    std::vector<double> values;
    for (const StepRecord& r : rows) values.push_back(r.*field);
    return values;
  };
  DemoSummary s;
  s.update_us = column(&StepRecord::plan_update_us);
  s.plan_us = column(&StepRecord::plan_us);
  s.upload_us = column(&StepRecord::upload_us);
  s.host_us = column(&StepRecord::host_us);
  s.attention_us = column(&StepRecord::attention_us);
  s.gpu_wait_us = column(&StepRecord::gpu_wait_us);
  s.all = counts;
  return s;
}

void print_summary(const DemoOptions& o, const DemoSetup& setup, const DemoLoop& loop, const DemoSummary& s) {
  const bool overlaps = loop.runner().overlaps();
  fmt::print("demo: {} on {}, backend {} ({}), strategy {}\n", setup.named.name, setup.model->name, loop.backend().name(),
             loop.runner().name(), o.plan.strategy);
  fmt::print("  steps {}, tokens generated {}, live nodes at most {}, queries per step at most {}\n", setup.steps,
             loop.totals().generated, s.all.max_nodes, s.all.max_queries);
  fmt::print("  attention per step {:.3f} ms for {} layer{} (median; {})\n", median(s.attention_us) / 1e3, setup.layers,
             setup.layers == 1 ? "" : "s", overlaps ? "GPU time" : "wall time of the backend's calls");
  fmt::print("  planning per step (median): {:.1f} us updated incrementally ({} of {} steps by appends alone, {} by "
             "same-shape replacements, {} on a held layout, the cost model's choices made {} time{}), {:.1f} us from "
             "scratch\n",
             median(s.update_us), s.all.appended_only, setup.steps, s.all.replaced, s.all.held, s.all.chosen,
             s.all.chosen == 1 ? "" : "s",
             median(s.plan_us));
  if (overlaps) {
    fmt::print("  treeattn on the host per step (median; the changes handed over, the update, the upload, the "
               "layers queued): {:.1f} us, the upload {:.1f} us of it, while the GPU runs the step before: {} (then "
               "{:.1f} us waiting for the GPU, two steps ahead)\n",
               median(s.host_us), median(s.upload_us),
               median(s.host_us) < median(s.attention_us) ? "hidden behind it" : "longer than it", median(s.gpu_wait_us));
  }
  fmt::print("  KV read: {} unique tree KV vs {} for sequence-based decoding: {} saved ({:.2f}x less)\n",
             format_bytes(double(loop.totals().unique_bytes)), format_bytes(double(loop.totals().sequence_bytes)),
             format_bytes(double(loop.totals().sequence_bytes - loop.totals().unique_bytes)),
             double(loop.totals().sequence_bytes) / double(std::max<std::int64_t>(loop.totals().unique_bytes, 1)));
  fmt::print("  KV cache: {} pages of {} tokens in use at peak, {} at the end\n", loop.cache().peak_pages_in_use(),
             o.page_size, loop.cache().pages_in_use());
  if (const SoakChecks* soak = loop.soak()) {
    const nlohmann::json j = soak->json(loop.runner());
    fmt::print("  soak: {} checks against the CPU backend passed, max error {:.3g} on O and {:.3g} on LSE (tolerance "
               "{:.3g})\n",
               soak->checks(), j["max_o_error"].get<double>(), j["max_lse_error"].get<double>(), o.check_tolerance);
    auto growth = [](const nlohmann::json& profile) {
      return profile.is_null() ? std::string("not sampled") : format_bytes(double(profile["growth"].get<std::int64_t>()));
    };
    fmt::print("  memory after warm-up (step {} on): host RSS grew {}", j["warmup_steps"].get<std::int64_t>(),
               growth(j["host_rss_after_warmup"]));
    if (!j["device_bytes_after_warmup"].is_null()) {
      fmt::print(", device memory grew {} ({})", growth(j["device_bytes_after_warmup"]),
                 j["device_bytes_source"].get<std::string>());
    }
    const StepRunner::Captures captures = loop.runner().graph_captures();
    if (captures.count >= 0) fmt::print("; CUDA graph captures {} (the last at step {})", captures.count, captures.last_step);
    fmt::print("\n");
  }
}

nlohmann::json per_step_json(const std::vector<StepRecord>& rows) {
  nlohmann::json per_step = nlohmann::json::array();
  for (const StepRecord& r : rows) {
    per_step.push_back({{"step", r.step}, {"nodes", r.nodes}, {"queries", r.queries}, {"tokens", r.tokens},
                        {"plan_update_us", r.plan_update_us}, {"plan_us", r.plan_us}, {"upload_us", r.upload_us},
                        {"gpu_wait_us", r.gpu_wait_us}, {"host_us", r.host_us}, {"attention_us", r.attention_us}, {"reanalysed", r.reanalysed},
                        {"replaced_nodes", r.replaced_nodes}, {"chosen", r.chosen}, {"held_layout", r.held_layout}});
  }
  return per_step;
}

void write_json(const DemoOptions& o, const DemoSetup& setup, const DemoLoop& loop, const DemoSummary& s) {
  nlohmann::json summary = {{"workload", setup.named.name},
                                  {"model", setup.model->name},
                                  {"backend", loop.backend().name()},
                                  {"runner", loop.runner().name()},
                                  {"strategy", o.plan.strategy},
                                  {"block_tokens_option", o.plan.block_tokens},
                                  {"window", o.plan.window},
                                  {"layers", setup.layers},
                                  {"steps", setup.steps},
                                  {"tokens_generated", loop.totals().generated},
                                  {"attention_ms_per_step", s.all.attention_us / double(s.all.steps) / 1e3},
                                  {"plan_ms_per_step", s.all.update_us / double(s.all.steps) / 1e3},
                                  {"plan_update_median_us", median(s.update_us)},
                                  {"plan_median_us", median(s.plan_us)},
                                  {"upload_median_us", median(s.upload_us)},
                                  {"host_step_median_us", median(s.host_us)},
                                  {"gpu_wait_median_us", median(s.gpu_wait_us)},
                                  {"attention_median_us", median(s.attention_us)},
                                  {"attention_overlaps_host", loop.runner().overlaps()},
                                  {"steps_by_appends", s.all.appended_only},
                                  {"steps_by_replacement", s.all.replaced},
                                  {"choices_made", s.all.chosen},
                                  {"steps_on_held_layout", s.all.held},
                                  {"bitwise_updates", o.bitwise_updates},
                                  {"unique_kv_bytes", loop.totals().unique_bytes},
                                  {"sequence_kv_bytes", loop.totals().sequence_bytes},
                                  {"peak_pages", loop.cache().peak_pages_in_use()},
                                  {"page_size", o.page_size},
                                  {"kv_pool_pages", loop.cache().capacity_pages()},
                                  {"per_step_stride", loop.rows().stride()},
                                  {"per_step", per_step_json(loop.rows().kept())}};
  if (loop.soak() != nullptr) summary["soak"] = loop.soak()->json(loop.runner());
  PendingOutputs outputs;
  outputs.write_text(o.json, summary.dump(2) + "\n");
  outputs.commit();
}

void run_demo(const DemoOptions& o) {
  DemoSetup setup = resolve_options(o);
  DemoLoop loop(o, setup, dry_run(o, setup.steps));
  loop.run_steps();
  const DemoSummary summary = summarize(loop.rows().kept(), loop.counts());
  print_summary(o, setup, loop, summary);
  if (!o.json.empty()) write_json(o, setup, loop, summary);
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
  sub->add_option("--steps", o->steps, "Decode steps to run (0: the whole workload)")->check(CLI::NonNegativeNumber)->capture_default_str();
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
  sub->add_option("--svg-step", o->svg_step, "Step to draw (0: the last)")->check(CLI::NonNegativeNumber);
  sub->add_option("--dump-step", o->dump_step, "Write this step's tree.json, q/k/v.npy and layer-0 o/lse.npy")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--dump-dir", o->dump_dir, "Existing directory for --dump-step")->check(CLI::ExistingDirectory);
  sub->add_option("--json", o->json, "Also write the summary as JSON");
  sub->add_option("--check-every", o->check_every,
                  "Soak: every Nth step, layer 0's O and LSE must equal the CPU backend's run of the step within "
                  "--check-tolerance, else the demo fails naming the step; host and device memory are sampled there")
      ->check(CLI::NonNegativeNumber);
  sub->add_option("--check-tolerance", o->check_tolerance, "Soak: largest absolute error allowed on O and LSE")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  sub->add_flag("--bitwise-updates", o->bitwise_updates,
                std::string(kBitwiseUpdatesHelp) + "; a --dump-step is then reproduced bit for bit by treeattn run");
  o->workloads.add_to(*sub);
  sub->add_option("--live-tokens", o->workloads.serving.live_tokens, "serving: most tokens live at once (bounds the KV pool)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  sub->add_option("--requests", o->workloads.serving.requests, "serving: most requests at once")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  return {sub, [o] { run_demo(*o); }};
}

}  // namespace treeattn::cli

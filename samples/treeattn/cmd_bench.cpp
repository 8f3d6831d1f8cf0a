// treeattn bench: workloads x model shapes x strategies x backends. Plan
// time and run time are measured separately; every row carries the IO model
// (unique tree KV bytes, what a Q-guided kernel reads, the reduction) and the
// effective bandwidth on unique KV bytes as a fraction of a roofline.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "attention_flags.hpp"
#include "cli_support.hpp"
#include "commands.hpp"
#include "treeattn/tools.hpp"
#include "treeattn/treeattn.hpp"
#include "workload_options.hpp"

namespace treeattn::cli {
namespace {

struct BenchOptions {
  WorkloadOptions workloads;
  std::vector<std::string> kinds = {"fewshot", "speculative", "reasoning", "levels"};
  std::vector<std::string> models = {"llama3-8b"};
  std::vector<std::string> heads;  // extra head shapes HQ/HKV/D, beside the models
  std::vector<std::string> strategies = {"flatten", "sequence"};
  std::vector<std::string> backends = {"auto"};
  std::vector<std::string> block_tokens = {"auto"};  // each a count or "auto"
  std::vector<std::string> costs = {""};  // cost-model variants, each KEY=VALUE,...
  int window = 0;  // PlanOptions::window
  int repeat = 20;
  int plan_threads = 1;
  bool bitwise_updates = false;
  int run_repeat = 3;
  int layers = 1;
  std::string dtype = "f16";  // of the timed runs' Q, K, V and O: f16 or bf16
  BackendFlags backend_flags;
  AttentionFlags attention;  // fp8 K and V (--kv-dtype), soft-cap, sinks
  bool verbose = false;
  double peak_gbps = 0.0;
  std::string json;
};

struct Timing {
  double min_us, median_us;
};

template <typename F>
Timing time_it(int repeat, F&& body) {
  std::vector<double> us;
  for (int r = 0; r < repeat; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    body();
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(us.begin(), us.end());
  return {us.front(), us[us.size() / 2]};
}

// A backend to time, and the roofline its rows are measured against.
struct TimedBackend {
  std::unique_ptr<Backend> backend;
  double peak_gbps;
};

std::vector<TimedBackend> make_backends(const BenchOptions& o) {
  std::vector<TimedBackend> backends;
  for (const std::string& name : o.backends) {
    if (name == "none") continue;
    BackendOptions backend_options = o.backend_flags.options;
    backend_options.verbose = o.verbose;
    TimedBackend t{make_backend(parse_backend(name), backend_options), o.peak_gbps};
    if (t.peak_gbps <= 0.0) t.peak_gbps = t.backend->peak_gbps();
    fmt::print(stderr, "bench: backend {}, roofline {:.1f} GB/s\n", t.backend->name(), t.peak_gbps);
    backends.push_back(std::move(t));
  }
  return backends;
}

// A workload's tree under one model's head shape.
struct Workload {
  NamedTree named;
  ModelShape model;
};

std::vector<Workload> make_workloads(const BenchOptions& o) {
  std::vector<ModelShape> shapes;
  for (const std::string& m : o.models) shapes.push_back(find_model(m));
  for (const std::string& h : o.heads) {
    ModelShape shape{"heads " + h, {}, 1};
    const int fields = std::sscanf(h.c_str(), "%d/%d/%d/%d", &shape.heads.heads_q, &shape.heads.heads_kv,
                                   &shape.heads.head_dim, &shape.heads.head_dim_v);
    if (fields != 3 && fields != 4) {
      throw Error(ErrorCategory::InvalidArgument,
                  fmt::format("--heads '{}' is not HQ/HKV/D or HQ/HKV/D/DV, e.g. 16/1/128 or 128/128/192/128", h));
    }
    try {
      check_heads(shape.heads);  // before any row runs
    } catch (const Error& e) {
      throw Error(e.category(), fmt::format("--heads '{}': {}", h, e.what()));
    }
    shapes.push_back(shape);
  }
  std::vector<Workload> workloads;
  for (const ModelShape& model : shapes) {
    for (const std::string& kind : o.kinds) {
      for (NamedTree& t : make_trees(kind, o.workloads, model.heads)) workloads.push_back({std::move(t), model});
    }
  }
  return workloads;
}

// Each backend plans with its own device model, adjusted by a --cost's
// assignments; planning alone (`timed` null) uses the H100's.
CostModel cost_model_of(const TimedBackend* timed, const std::string& assignments) {
  CostModel model = timed != nullptr ? timed->backend->cost_model() : cost_model_for("h100");
  model.set(assignments);
  return model;
}

void print_header() {
  fmt::print("{:<34} {:<16} {:<10} {:>10} {:<7} {:>7} {:>9} {:>9} {:>7} {:>9} {:>9} {:>9} {:>10} {:>9} {:>7}\n", "workload",
             "model", "strategy", "block", "backend", "queries", "tokens", "unique_MB", "kv_io_x", "plan_us", "update_us",
             "upload_us", "run_us", "GB/s", "roof");
}

// Synthetic Q, K and V (and room for O) for a workload's tree, shared by its
// strategies and backends, with the calls' attention variants.
struct Inputs {
  HostArray q, k, v, out, sinks;
  AttentionOptions options;
};

Inputs synthetic_inputs(const Tree& tree, const std::string& dtype_name, const AttentionFlags& attention) {
  const HeadConfig& h = tree.heads;
  const DType dtype = dtype_name == "bf16" ? DType::bf16 : DType::f16;
  const DType kv = attention.fp8().value_or(dtype);
  const std::int64_t slots = std::max<std::int64_t>(1, treeattn::plan(tree).min_kv_slots);
  const std::int64_t nq = std::int64_t(tree.query_count());
  Inputs in;
  in.q = random_array(dtype, {nq, h.heads_q, h.head_dim}, 1);
  in.k = random_array(kv, {slots, h.heads_kv, h.head_dim}, 2);
  in.v = random_array(kv, {slots, h.heads_kv, h.value_dim()}, 3);
  in.out = HostArray(dtype, {nq, h.heads_q, h.value_dim()});
  in.sinks = attention.read_sinks();
  in.options = attention.options(in.sinks);
  return in;
}

Timing sorted_timing(std::vector<double>& us) {
  std::sort(us.begin(), us.end());
  return us.empty() ? Timing{0.0, 0.0} : Timing{us.front(), us[us.size() / 2]};
}

// The same tree kept by an IncrementalPlanner, then the workload's next
// decode steps, one per repetition: the changes handed over and the update
// timed (a step past the drift makes the model's choices again).
struct UpdateTiming {
  Timing time;
  std::size_t steps = 0;
  std::int64_t choices = 0, held = 0, block_tokens = 0;
};

UpdateTiming time_updates(const BenchOptions& o, NamedTree& named, const PlanOptions& options) {
  IncrementalPlanner updater(named.tree.heads, options, incremental_options(o.bitwise_updates, o.plan_threads));
  named.next->start(updater, named.tree);
  updater.update();
  std::vector<double> update_us;
  UpdateTiming t;
  for (int r = 0; r < o.repeat && named.next->next(); ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    named.next->hand_over(updater);
    updater.update();
    update_us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    t.choices += updater.last_update().chosen ? 1 : 0;
    t.held += updater.last_update().held_layout ? 1 : 0;
  }
  t.steps = update_us.size();
  t.time = sorted_timing(update_us);
  t.block_tokens = updater.block_tokens();
  return t;
}

// One row's case: a workload, a strategy, a block size and a cost model, on a backend or none.
struct BenchCase {
  Workload& workload;
  const std::string& strategy;
  const std::string& block_tokens;
  const CostModel& cost;
  TimedBackend* timed;
};

// The row's plan: its statistics, the cost model's estimate and the planning times.
nlohmann::json plan_row(const BenchOptions& o, const BenchCase& c, const Plan& plan, const Timing& plan_time,
                        const UpdateTiming& updates, int plan_threads) {
  const Tree& tree = c.workload.named.tree;
  const HeadConfig& h = tree.heads;
  const PlanStats st = compute_stats(plan);
  const CostEstimate est = estimate_cost(plan, c.cost.for_kv(o.attention.fp8().value_or(DType::f16)));
  const std::size_t kv_element = o.attention.kv_element_bytes(DType::f16);  // bf16 has f16's size
  const std::int64_t unique = st.kv_bytes(st.tokens, kv_element), sequence = st.kv_bytes(st.sequence_read_tokens, kv_element);
  return {{"workload", c.workload.named.name},  {"model", c.workload.model.name},
          {"strategy", c.strategy},             {"block_tokens_option", c.block_tokens},
          {"block_tokens", plan.block_tokens},  {"heads_q", h.heads_q},
          {"heads_kv", h.heads_kv},             {"head_dim", h.head_dim}, {"head_dim_v", h.value_dim()},
          {"nodes", tree.node_count()},         {"queries", tree.query_count()},
          {"tokens", st.tokens},                {"items", st.items},
          {"passes", st.passes},                {"partials", st.partials},
          {"cost_model", c.cost.to_string()},   {"model_us", est.time_us},
          {"launch_order", est.longest_first ? "longest_first" : "items"},
          {"model_item_order_us", est.item_order_us},
          {"large_passes", est.large_passes},   {"small_passes", est.small_passes},
          {"large_tiles", est.large_tiles},     {"small_tiles", est.small_tiles},
          {"partial_rows", est.partial_rows},   {"max_fanin", est.max_fanin},
          {"longest_pass_tiles", est.longest_pass_tiles}, {"longest_pass_large", est.longest_pass_large},
          {"unique_kv_bytes", unique},          {"plan_read_kv_bytes", st.kv_bytes(st.plan_read_tokens, kv_element)},
          {"sequence_kv_bytes", sequence},      {"kv_io_reduction", double(sequence) / double(unique)},
          {"plan_min_us", plan_time.min_us},    {"plan_median_us", plan_time.median_us},
          {"plan_update_min_us", updates.time.min_us}, {"plan_update_median_us", updates.time.median_us},
          {"plan_update_block_tokens", updates.block_tokens},
          {"plan_update_steps", updates.steps}, {"plan_update_choices", updates.choices},
          {"plan_update_held", updates.held},   {"bitwise_updates", o.bitwise_updates},
          {"plan_threads", plan_threads},       {"window", o.window}};
}

// The table's cells a backend fills ("-" without one).
struct RunCells {
  std::string upload = "-", run = "-", gbps = "-", roof = "-";
};

void print_row(const BenchCase& c, const nlohmann::json& row, const std::string& block_cell, const RunCells& cells) {
  const std::int64_t unique = row["unique_kv_bytes"].get<std::int64_t>();
  fmt::print("{:<34} {:<16} {:<10} {:>10} {:<7} {:>7} {:>9} {:>9.1f} {:>7.2f} {:>9.0f} {:>9.1f} {:>9} {:>10} {:>9} {:>7}\n",
             c.workload.named.name, c.workload.model.name, c.strategy, block_cell,
             c.timed != nullptr ? c.timed->backend->name() : "none", c.workload.named.tree.query_count(),
             row["tokens"].get<std::int64_t>(), double(unique) / 1e6, row["kv_io_reduction"].get<double>(),
             row["plan_median_us"].get<double>(), row["plan_update_median_us"].get<double>(), cells.upload, cells.run,
             cells.gbps, cells.roof);
  std::fflush(stdout);
}

// The plan uploaded and its layers run on the case's backend: the row's run
// columns, and the cells of the table.
RunCells time_on_backend(const BenchOptions& o, const BenchCase& c, const Plan& plan, Inputs& in, nlohmann::json& row) {
  Backend& backend = *c.timed->backend;
  RunCells cells;
  std::vector<double> uploads = backend.time_uploads(plan, o.repeat);
  if (!uploads.empty()) {
    std::sort(uploads.begin(), uploads.end());
    row["upload_median_us"] = uploads[uploads.size() / 2];
    cells.upload = fmt::format("{:.1f}", uploads[uploads.size() / 2]);
  }
  AttentionArgs args{in.q.view(), in.k.view(), in.v.view(), in.out.view(), TensorRef{}};  // no LSE
  args.options = in.options;
  std::vector<double> us = backend.time_layers(plan, args, o.layers, o.run_repeat);
  const Timing run_time = sorted_timing(us);
  const double per_layer = run_time.median_us / o.layers;
  const double gbps = double(row["unique_kv_bytes"].get<std::int64_t>()) / (per_layer * 1e3);
  row["backend"] = backend.name();
  row["dtype"] = o.dtype;
  row["kv_dtype"] = o.attention.kv_dtype.empty() ? o.dtype : o.attention.kv_dtype;
  row["logit_softcap"] = o.attention.softcap;
  row["sinks"] = !o.attention.sinks_path.empty();
  row["layers"] = o.layers;
  if (std::string(backend.name()) == "cuda") row["graph_headroom"] = o.backend_flags.options.cuda_graph_headroom;
  row["run_median_us"] = per_layer;
  row["run_min_us"] = run_time.min_us / o.layers;
  row["effective_gbps"] = gbps;
  if (c.timed->peak_gbps > 0.0) {
    row["peak_gbps"] = c.timed->peak_gbps;
    row["roofline_fraction"] = gbps / c.timed->peak_gbps;
    cells.roof = fmt::format("{:.1f}%", 100.0 * gbps / c.timed->peak_gbps);
  }
  cells.run = fmt::format("{:.0f}", per_layer);
  cells.gbps = fmt::format("{:.2f}", gbps);
  return cells;
}

// One row: the case planned (timed), its updates timed, and its layers run where it has a backend.
nlohmann::json bench_case(const BenchOptions& o, const BenchCase& c, Planner& planner, Inputs& in) {
  NamedTree& named = c.workload.named;
  PlanOptions options;
  options.strategy = parse_strategy(c.strategy);
  options.block_tokens = parse_block_tokens(c.block_tokens);
  options.window = o.window;
  options.cost = c.cost;
  options = o.attention.planned_for(options);
  Plan plan;
  const Timing plan_time = time_it(o.repeat, [&] { plan = planner.plan(named.tree, options); });
  const UpdateTiming updates = time_updates(o, named, options);
  nlohmann::json row = plan_row(o, c, plan, plan_time, updates, planner.threads());
  // The block size the plan runs, and that auto chose it; greedy's is its longest block.
  const std::string block_cell = options.block_tokens == kAutoBlockTokens ? fmt::format("auto:{}", plan.block_tokens)
                                                                          : std::to_string(plan.block_tokens);
  const RunCells cells = c.timed != nullptr ? time_on_backend(o, c, plan, in, row) : RunCells{};
  print_row(c, row, block_cell, cells);
  return row;
}

void run_bench(const BenchOptions& o) {
  Planner planner(o.plan_threads);
  std::vector<TimedBackend> backends = make_backends(o);
  std::vector<Workload> workloads = make_workloads(o);
  std::vector<TimedBackend*> planners;  // null: plan only (--backend none)
  for (TimedBackend& timed : backends) planners.push_back(&timed);
  if (planners.empty()) planners.push_back(nullptr);
  for (const TimedBackend* timed : planners) {  // every --cost checked before any work
    for (const std::string& assignments : o.costs) (void)cost_model_of(timed, assignments);
  }
  print_header();
  const std::size_t total =
      workloads.size() * o.strategies.size() * o.block_tokens.size() * o.costs.size() * planners.size();
  std::size_t done = 0;
  nlohmann::json rows = nlohmann::json::array();
  for (Workload& w : workloads) {
    Inputs in = backends.empty() ? Inputs{} : synthetic_inputs(w.named.tree, o.dtype, o.attention);
    for (const std::string& strategy : o.strategies) for (const std::string& block_tokens : o.block_tokens)
    for (const std::string& assignments : o.costs) for (TimedBackend* timed : planners) {
      const CostModel cost = cost_model_of(timed, assignments);
      fmt::print(stderr, "[{}/{}] {} {} {} block tokens {} {}{}\n", ++done, total, w.named.name, w.model.name, strategy,
                 block_tokens, timed != nullptr ? timed->backend->name() : "none",
                 o.costs.size() > 1 ? " " + cost.to_string() : "");
      rows.push_back(bench_case(o, BenchCase{w, strategy, block_tokens, cost, timed}, planner, in));
    }
  }
  if (!o.json.empty()) {
    PendingOutputs outputs;
    outputs.write_text(o.json, rows.dump(2) + "\n");
    outputs.commit();
  }
}

}  // namespace

Command add_bench_command(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* sub = app.add_subcommand(
      "bench",
      "Benchmark workloads x model shapes x strategies x backends: plan time, run time per layer (median of\n"
      "--run-repeat runs of --layers back-to-back calls), unique tree KV bytes, the bytes a Q-guided kernel reads\n"
      "(KV-IO reduction), effective bandwidth on unique KV bytes and its fraction of the roofline.\n"
      "Workloads: fewshot (prompt + branches), speculative (Medusa token trees on a growing prefix),\n"
      "reasoning (tree-of-thought replays), levels (FastTree kernel shapes), random (seeded forest).\n"
      "Examples: treeattn bench --workload fewshot --branches 20 --strategy flatten,sequence,node\n"
      "          treeattn bench --workload random --backend none --strategy flatten --repeat 100 --json plan.json");
  sub->add_option("--workload", o->kinds, "Workload kinds (comma-separated)")
      ->delimiter(',')
      ->check(CLI::IsMember(workload_kinds()))
      ->capture_default_str();
  sub->add_option("--model", o->models, "Model head shapes (comma-separated)")
      ->delimiter(',')
      ->check(CLI::IsMember(model_names()))
      ->capture_default_str();
  sub->add_option("--heads", o->heads, "Further head shapes HQ/HKV/D or HQ/HKV/D/DV (DV: head_dim_v) beside the models (comma-separated), "
                  "e.g. 16/1/128 or 128/128/192/128")
      ->delimiter(',');
  sub->add_option("--strategy", o->strategies, "Strategies (comma-separated)")
      ->delimiter(',')
      ->check(CLI::IsMember(strategy_names()))
      ->capture_default_str();
  sub->add_option("--backend", o->backends, "Backends to time, comma-separated (none: planning only)")
      ->delimiter(',')
      ->check(CLI::IsMember({"none", "auto", "cpu", "vulkan", "cuda"}))
      ->capture_default_str();
  sub->add_option("--block-tokens", o->block_tokens,
                  std::string(kBlockTokensHelp) + ". Comma-separated to sweep: every strategy runs once per value")
      ->delimiter(',')
      ->check(block_tokens_validator())
      ->capture_default_str();
  sub->add_option("--cost", o->costs,
                  std::string(kCostHelp) + ". Give --cost several times to sweep: every strategy runs once per model");
  sub->add_option("--window", o->window, kWindowHelp)->check(nonnegative())->capture_default_str();
  sub->add_option("--repeat", o->repeat, "Plan repetitions")->check(CLI::Range(1, 100000))->capture_default_str();
  sub->add_option("--plan-threads", o->plan_threads, kPlanThreadsHelp)->check(nonnegative())->capture_default_str();
  sub->add_flag("--bitwise-updates", o->bitwise_updates, kBitwiseUpdatesHelp);
  sub->add_option("--run-repeat", o->run_repeat, "Run repetitions")->check(CLI::Range(1, 100000))->capture_default_str();
  sub->add_option("--layers", o->layers, "Back-to-back calls per run (a model's layers)")->check(CLI::Range(1, 1000))->capture_default_str();
  sub->add_option("--dtype", o->dtype,
                  "Element type of the timed runs' Q, K, V and O: f16 or bf16 (2 bytes either way, so the KV bytes "
                  "and the roofline are the same)")
      ->check(CLI::IsMember({"f16", "bf16"}))
      ->capture_default_str();
  o->backend_flags.add_to(*sub);
  o->attention.add_to(*sub, "K and V of the timed runs in this fp8 kind (scale 1; the KV bytes count 1 per element)");
  sub->add_option("--graph-headroom", o->backend_flags.options.cuda_graph_headroom,
                  "CUDA: time the graph-stable device path, a Workspace whose limits are each plan's times this "
                  "factor (e.g. 1.5: grids fixed for plans half again as large, as a serving engine's captured graph "
                  "has them); 0: a workspace sized to each plan")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            try {
              const double h = std::stod(text);
              if (h == 0.0 || (h >= 1.0 && h <= 1000.0)) return {};
            } catch (const std::exception&) {
            }
            return "must be 0 or a factor from 1 to 1000, got " + text;
          },
          "0|FACTOR>=1"));
  sub->add_flag("--verbose", o->verbose,
                "Say on stderr which device each backend runs, and its kernels: variant, registers, occupancy");
  sub->add_option("--peak-gbps", o->peak_gbps,
                  "Roofline bandwidth in GB/s (default: the backend's: the device's HBM peak, or the measured host "
                  "read bandwidth for the CPU)")
      ->check(nonnegative());
  sub->add_option("--json", o->json, "Also write the rows as JSON to this file");
  o->workloads.add_to(*sub);
  return {sub, [o] { run_bench(*o); }};
}

}  // namespace treeattn::cli

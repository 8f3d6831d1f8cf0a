#include "demo_loop.hpp"

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "plan_svg.hpp"

namespace treeattn::cli {
namespace {

// Synthetic K/V: a fixed function of (slot, head, channel): a replay writes the
// same data for every strategy and backend.
float synthetic(std::uint64_t slot, std::uint64_t lane, std::uint64_t which) {
  Rng rng((slot * 0x9e3779b97f4a7c15ull) ^ (lane << 4) ^ which);
  return float(2.0 * rng.unit() - 1.0);
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

}  // namespace

void StepCounts::add(const StepRecord& r) {
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

DemoLoop::DemoLoop(const DemoOptions& o, DemoSetup& setup, const PeakSizes& peak)
    : o_(o),
      setup_(setup),
      heads_(setup.model->heads),
      cache_(o.page_size, peak.pages),
      live_(cache_),
      k_(o.attention.fp8().value_or(DType::f16), {cache_.slots(), heads_.heads_kv, heads_.head_dim}),
      v_(k_.dtype, {cache_.slots(), heads_.heads_kv, heads_.head_dim}),
      sinks_(o.attention.read_sinks()),
      variants_(o.attention.options(sinks_)),
      backend_(make_backend(parse_backend(o.backend), backend_options(o))),
      runner_(make_step_runner(*backend_, backend_options(o), heads_, k_, v_, peak.queries, variants_)),
      options_(o.attention.planned_for(o.plan.options(cache_.slots(), backend_->cost_model()))),
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

BackendOptions DemoLoop::backend_options(const DemoOptions& o) {
  BackendOptions b = o.backend_flags.options;
  b.verbose = o.verbose;
  return b;
}

void DemoLoop::size_runner() {
  if (!runner_->reserves_ahead()) return;
  const auto t0 = std::chrono::steady_clock::now();
  cli::reserve_ahead(o_, setup_.steps, heads_, options_, cache_.capacity_pages(), *runner_);
  fmt::print(stderr, "demo: {} sized for the run's {} steps ahead (dry replay {:.1f} s)\n", runner_->name(),
             setup_.steps, since(t0) / 1e6);
}

void DemoLoop::run_steps() {
  size_runner();
  for (std::int64_t step = 1; step <= setup_.steps; ++step) run_step(step);
  collect(true);
}

// One decode step: the tree's changes handed over with the new tokens' K/V,
// the plan updated and the layers queued; beside them, the from-scratch plan,
// the statistics and the files asked for.
void DemoLoop::run_step(std::int64_t step) {
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

const Plan& DemoLoop::update_plan(StepRecord& record) {
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

void DemoLoop::queue_layers(const Plan& plan, const HostArray& q, StepRecord& record) {
  const auto t1 = std::chrono::steady_clock::now();
  const StepRunner::HostTimes run = runner_->run(plan, q, setup_.layers);
  record.upload_us = run.upload_us;
  record.gpu_wait_us = run.waited_us;
  record.host_us += record.plan_update_us + since(t1) - run.waited_us;
}

// Beside the step (the GPU may still be running it): the from-scratch plan, statistics, files.
void DemoLoop::beside_the_step(std::int64_t step, const Plan& plan, const HostArray& q) {
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
void DemoLoop::dump_step(const Tree& tree, const HostArray& q) {
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
void DemoLoop::collect(bool wait) {
  for (double us : runner_->finished(wait)) {
    running_.front().attention_us = us;
    counts_.add(running_.front());
    rows_.add(running_.front());
    running_.pop_front();
  }
}

}  // namespace treeattn::cli

#include "demo_report.hpp"

#include <algorithm>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_support.hpp"

namespace treeattn::cli {
namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The medians of the kept rows' columns, and the counts of every step.
struct DemoSummary {
  double update_us, plan_us, upload_us, host_us, attention_us, gpu_wait_us;
  StepCounts all;
};

DemoSummary summarize(const DemoLoop& loop) {
  auto median_of = [&](double StepRecord::*field) {
    std::vector<double> values;
    for (const StepRecord& r : loop.rows().kept()) values.push_back(r.*field);
    return median(std::move(values));
  };
  return {median_of(&StepRecord::plan_update_us), median_of(&StepRecord::plan_us), median_of(&StepRecord::upload_us),
          median_of(&StepRecord::host_us),        median_of(&StepRecord::attention_us),
          median_of(&StepRecord::gpu_wait_us),    loop.counts()};
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

void print_soak(const DemoOptions& o, const DemoLoop& loop, const SoakChecks& soak) {
  const nlohmann::json j = soak.json(loop.runner());
  fmt::print("  soak: {} checks against the CPU backend passed, max error {:.3g} on O and {:.3g} on LSE (tolerance "
             "{:.3g})\n",
             soak.checks(), j["max_o_error"].get<double>(), j["max_lse_error"].get<double>(), o.check_tolerance);
  auto growth = [](const nlohmann::json& profile) {
    return profile.is_null() ? std::string("not sampled") : format_bytes(double(profile["growth"].get<std::int64_t>()));
  };
  fmt::print("  memory after warm-up (step {} on): host RSS grew {}", j["warmup_steps"].get<std::int64_t>(),
             growth(j["host_rss_after_warmup"]));
  const nlohmann::json& heap = j["host_heap_after_warmup"];
  if (!heap.is_null() && heap["first"].get<std::int64_t>() >= 0) {
    fmt::print(", heap in use {} at the first sample, {} at the last (at most {})",
               format_bytes(double(heap["first"].get<std::int64_t>())), format_bytes(double(heap["last"].get<std::int64_t>())),
               format_bytes(double(heap["most"].get<std::int64_t>())));
  }
  if (!j["device_bytes_after_warmup"].is_null()) {
    fmt::print(", device memory grew {} ({})", growth(j["device_bytes_after_warmup"]),
               j["device_bytes_source"].get<std::string>());
  }
  const StepRunner::Captures captures = loop.runner().graph_captures();
  if (captures.count >= 0) fmt::print("; CUDA graph captures {} (the last at step {})", captures.count, captures.last_step);
  fmt::print("\n");
}

}  // namespace

void print_summary(const DemoOptions& o, const DemoSetup& setup, const DemoLoop& loop) {
  const DemoSummary s = summarize(loop);
  const bool overlaps = loop.runner().overlaps();
  fmt::print("demo: {} on {}, backend {} ({}), strategy {}\n", setup.named.name, setup.model->name, loop.backend().name(),
             loop.runner().name(), o.plan.strategy);
  fmt::print("  steps {}, tokens generated {}, live nodes at most {}, queries per step at most {}\n", setup.steps,
             loop.totals().generated, s.all.max_nodes, s.all.max_queries);
  fmt::print("  attention per step {:.3f} ms for {} layer{} (median; {})\n", s.attention_us / 1e3, setup.layers,
             setup.layers == 1 ? "" : "s", overlaps ? "GPU time" : "wall time of the backend's calls");
  fmt::print("  planning per step (median): {:.1f} us updated incrementally ({} of {} steps by appends alone, {} by "
             "same-shape replacements, {} on a held layout, the cost model's choices made {} time{}), {:.1f} us from "
             "scratch\n",
             s.update_us, s.all.appended_only, setup.steps, s.all.replaced, s.all.held, s.all.chosen,
             s.all.chosen == 1 ? "" : "s", s.plan_us);
  if (overlaps) {
    fmt::print("  treeattn on the host per step (median; the changes handed over, the update, the upload, the "
               "layers queued): {:.1f} us, the upload {:.1f} us of it, while the GPU runs the step before: {} (then "
               "{:.1f} us waiting for the GPU, two steps ahead)\n",
               s.host_us, s.upload_us, s.host_us < s.attention_us ? "hidden behind it" : "longer than it", s.gpu_wait_us);
  }
  fmt::print("  KV read: {} unique tree KV vs {} for sequence-based decoding: {} saved ({:.2f}x less)\n",
             format_bytes(double(loop.totals().unique_bytes)), format_bytes(double(loop.totals().sequence_bytes)),
             format_bytes(double(loop.totals().sequence_bytes - loop.totals().unique_bytes)),
             double(loop.totals().sequence_bytes) / double(std::max<std::int64_t>(loop.totals().unique_bytes, 1)));
  fmt::print("  KV cache: {} pages of {} tokens in use at peak, {} at the end\n", loop.cache().peak_pages_in_use(),
             o.page_size, loop.cache().pages_in_use());
  if (const SoakChecks* soak = loop.soak()) print_soak(o, loop, *soak);
}

void write_json(const DemoOptions& o, const DemoSetup& setup, const DemoLoop& loop) {
  const DemoSummary s = summarize(loop);
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
                            {"plan_update_median_us", s.update_us},
                            {"plan_median_us", s.plan_us},
                            {"upload_median_us", s.upload_us},
                            {"host_step_median_us", s.host_us},
                            {"gpu_wait_median_us", s.gpu_wait_us},
                            {"attention_median_us", s.attention_us},
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

}  // namespace treeattn::cli

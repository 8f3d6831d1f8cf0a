#include "calibrate.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "calibration.hpp"
#include "treeattn/error.hpp"
#include "context_state.hpp"
#include "vk_sequence.hpp"
#include "workspace_state.hpp"

namespace treeattn::vulkan {
namespace {

constexpr int kLayers = 4;   // calls timed back to back, each on its own KV (no cache carry-over)
constexpr int kRepeats = 3;  // the fastest of these

}  // namespace

CostModel calibrated_cost_model(const Context& context, std::uint32_t compute_units, const CostModel& base,
                                const std::string& source, const LogSink& log) {
  const auto began = std::chrono::steady_clock::now();
  const Device& dev = *state_of(context).device;
  const DeviceCaps& caps = dev.caps();
  if (!dev.owned() || dev.queue() == VK_NULL_HANDLE) {
    throw Error(ErrorCategory::Backend, "the application's device: treeattn submits nothing to its queues");
  }
  if (!caps.timestamps) throw Error(ErrorCategory::Backend, fmt::format("Vulkan device {} has no compute timestamps", caps.name));
  const std::vector<Plan> plans = calibration_plans(std::int32_t(compute_units));
  const std::int64_t slots = calibration_kv_slots(plans);
  std::int64_t queries = 0;
  for (const Plan& p : plans) queries = std::max<std::int64_t>(queries, p.num_queries);
  const HeadConfig& heads = plans.front().heads;
  const std::size_t kv_bytes = std::size_t(slots) * std::size_t(heads.heads_kv) * std::size_t(heads.head_dim) * 2;
  const std::size_t q_bytes = std::size_t(queries) * std::size_t(heads.heads_q) * std::size_t(heads.head_dim) * 2;
  if (kv_bytes > std::min(caps.max_allocation_bytes, caps.max_buffer_bytes)) {
    throw Error(ErrorCategory::Backend, fmt::format("Vulkan device {}: the calibration's {} KV bytes exceed one allocation ({})",
                                                    caps.name, kv_bytes, std::min(caps.max_allocation_bytes, caps.max_buffer_bytes)));
  }
  Buffer q(dev, q_bytes, Buffer::Kind::device_local), o(dev, q_bytes, Buffer::Kind::device_local);
  std::vector<Buffer> kv;  // layer l's K, then its V
  for (int b = 0; b < 2 * kLayers; ++b) kv.emplace_back(dev, kv_bytes, Buffer::Kind::device_local);
  CommandSequence sequence(dev, 2);
  sequence.begin();
  sequence.fill(q, 0);
  for (const Buffer& b : kv) sequence.fill(b, 0);
  sequence.barrier();
  sequence.end();
  sequence.submit_and_wait();

  // The first upload builds the stage-1 and merge pipelines, which the context
  // runs from then on anyway: timed apart from the calibration's own cost.
  Workspace workspace(context, DType::f16);
  const auto pipelines_began = std::chrono::steady_clock::now();
  sequence.begin();
  workspace.upload(plans.front(), sequence.handle());
  sequence.end();
  sequence.submit_and_wait();
  const double pipelines_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - pipelines_began).count();
  std::vector<double> us;
  for (const Plan& plan : plans) {
    sequence.begin();
    workspace.upload(plan, sequence.handle());
    sequence.end();
    sequence.submit_and_wait();
    sequence.begin();
    sequence.timestamp(0);
    for (int l = 0; l < kLayers; ++l) {
      LayerTensors t;
      t.q = q.address();
      t.o = o.address();
      t.k_chunks = {kv[std::size_t(2 * l)].address()};
      t.v_chunks = {kv[std::size_t(2 * l + 1)].address()};
      t.chunk_slots = std::uint32_t(slots);
      t.out = DType::f16;
      state_of(workspace).record(sequence.handle(), t);
    }
    sequence.timestamp(1);
    sequence.end();
    sequence.submit_and_wait();  // untimed: the first submission of a plan
    double best = 0.0;
    for (int r = 0; r < kRepeats; ++r) {
      sequence.submit_and_wait();
      const double call_us = sequence.elapsed_ns(0, 1) / 1e3 / kLayers;
      best = r == 0 ? call_us : std::min(best, call_us);
    }
    us.push_back(best);
  }
  const CalibrationFit fit = fit_cost_model(plans, us, std::int32_t(compute_units), base);
  log_to(log, LogLevel::info, "treeattn: calibration on " + caps.name + ":\n" + describe_fit(plans, us, fit, base));
  CostModel model = fit.model;
  const double total_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began).count();
  model.source = fmt::format("{}: {:.0f} work groups a unit, fit error {:.1f} %, {:.0f} ms (and {:.0f} ms building the "
                             "context's pipelines)",
                             source, model.slots / model.sms, 100.0 * fit.rms_error, total_ms - pipelines_ms, pipelines_ms);
  return model;
}

}  // namespace treeattn::vulkan

// The calibration's fit (plans -> predicted counts -> coefficients) and the
// per-device model cache, on the host: timings generated from a known model.

#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "calibration.hpp"
#include "device_models.hpp"
#include "treeattn/error.hpp"

using namespace treeattn;

namespace {

// What a device of `truth` would time for each plan, plus `overhead_us` a call.
std::vector<double> synthetic_times(const std::vector<Plan>& plans, const CostModel& truth, double overhead_us) {
  std::vector<double> us;
  for (const Plan& p : plans) us.push_back(estimate_cost(p, truth).time_us + overhead_us);
  return us;
}

CostModel device(double per_sm, double solo, double pass, double large, double small, double partial) {
  CostModel m = scaled_cost_model(cost_model_for("h100"), 16, per_sm, "truth");
  m.solo_speedup = solo;
  m.pass_ns = pass;
  m.tile_ns_large = large;
  m.tile_ns_small = small;
  m.partial_ns = partial;
  return m;
}

}  // namespace

TEST_CASE("calibration plans: each plan's passes are all alike, the sweep fills 1-8 per unit") {
  const std::vector<Plan> plans = calibration_plans(16);
  REQUIRE(plans.size() == 11);
  const CostModel model = cost_model_for("h100");
  for (const Plan& p : plans) {
    const CostEstimate e = estimate_cost(p, model);
    CHECK(((e.large_passes > 0) != (e.small_passes > 0)));  // one kind of pass a plan
  }
  CHECK(estimate_cost(plans[0], model).large_passes == 64);
  CHECK(estimate_cost(plans[2], model).small_passes == 64);
  CHECK(estimate_cost(plans[4], model).max_fanin == 8);
  CHECK(estimate_cost(plans[0], model).partial_rows == 0);  // one block a query: written directly, no merge
  const int per_unit[] = {1, 2, 3, 4, 6, 8};
  for (int k = 0; k < 6; ++k) CHECK(estimate_cost(plans[std::size_t(5 + k)], model).large_passes == 16 * per_unit[k]);
  CHECK(calibration_kv_slots(plans) == 8 * 16 * 512);
}

TEST_CASE("the fit recovers the costs, the slots and the solo speedup of the model that made the timings") {
  const std::vector<Plan> plans = calibration_plans(16);
  for (const CostModel& truth : {device(3, 2.0, 1200, 2800, 3300, 120), device(2, 1.25, 2500, 4000, 3900, 60),
                                 device(1, 1.0, 900, 1500, 2500, 300)}) {
    CAPTURE(truth.to_string());
    const CalibrationFit fit = fit_cost_model(plans, synthetic_times(plans, truth, 4.0), 16, cost_model_for("h100"));
    CHECK(fit.model.slots == truth.slots);
    CHECK(fit.model.sms == 16);
    CHECK(fit.model.solo_speedup == truth.solo_speedup);
    CHECK(fit.model.pass_ns == doctest::Approx(truth.pass_ns).epsilon(1e-6));
    CHECK(fit.model.tile_ns_large == doctest::Approx(truth.tile_ns_large).epsilon(1e-6));
    CHECK(fit.model.tile_ns_small == doctest::Approx(truth.tile_ns_small).epsilon(1e-6));
    CHECK(fit.model.partial_ns == doctest::Approx(truth.partial_ns).epsilon(1e-6));
    CHECK(fit.overhead_us == doctest::Approx(4.0).epsilon(1e-6));
    CHECK(fit.rms_error < 1e-9);
  }
}

TEST_CASE("the fit clamps a cost the timings put out of range, and refuses bad timings") {
  const std::vector<Plan> plans = calibration_plans(16);
  const CostModel base = cost_model_for("h100");
  const CalibrationFit fit = fit_cost_model(plans, synthetic_times(plans, device(3, 2.0, 1, 2800, 3300, 120), 0.0), 16, base);
  CHECK(fit.model.pass_ns == doctest::Approx(base.pass_ns / 10));
  std::vector<double> us = synthetic_times(plans, base, 0.0);
  us[3] = 0.0;
  CHECK_THROWS_AS(fit_cost_model(plans, us, 16, base), Error);
  us.pop_back();
  CHECK_THROWS_AS(fit_cost_model(plans, us, 16, base), Error);
  CHECK_THROWS_AS(calibration_plans(0), Error);
}

TEST_CASE("device models: calibrated once per key in a process, read back from the file, a fallback on failure") {
  const std::string path = (std::filesystem::temp_directory_path() / "treeattn_test_device_models.json").string();
  std::remove(path.c_str());
  int calibrations = 0;
  const auto calibrate = [&] {
    ++calibrations;
    CostModel m = cost_model_for("h100");
    m.pass_ns = 1234;
    m.source = "calibrated on a test device";
    return m;
  };
  const auto fallback = [](const std::string& why) { return scaled_cost_model(cost_model_for("h100"), 8, 3, "fallback: " + why); };
  DeviceModelRequest request{"test:calibrate-once", path, {}, false};
  CHECK(device_model(request, calibrate, fallback).pass_ns == 1234);
  CHECK(device_model(request, calibrate, fallback).source == "calibrated on a test device");
  CHECK(calibrations == 1);

  // The file holds what was calibrated: a key this process has not seen reads it.
  std::ifstream in(path);
  REQUIRE(in);
  std::string text((std::istreambuf_iterator<char>(in)), {});
  in.close();
  const std::string renamed = "test:from-file";
  text.replace(text.find("test:calibrate-once"), std::string("test:calibrate-once").size(), renamed);
  std::ofstream(path) << text;
  const CostModel read = device_model(DeviceModelRequest{renamed, path, {}, false}, calibrate, fallback);
  CHECK(calibrations == 1);
  CHECK(read.pass_ns == 1234);
  CHECK(read.source == "calibrated on a test device (cached)");

  const auto failing = [&]() -> CostModel {
    ++calibrations;
    throw Error(ErrorCategory::Backend, "no timestamps");
  };
  DeviceModelRequest failed{"test:fails", path, {}, false};
  CHECK(device_model(failed, failing, fallback).source == "fallback: no timestamps");
  CHECK(device_model(failed, failing, fallback).slots == 24);
  CHECK(calibrations == 2);
  std::remove(path.c_str());
}

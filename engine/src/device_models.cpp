#include "device_models.hpp"

#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "treeattn/error.hpp"

namespace treeattn {
namespace {

constexpr int kFileVersion = 1;

// The file's models, or an empty set when it is missing; a file that cannot
// be parsed is reported and treated as empty (it is rewritten).
nlohmann::json read_models(const DeviceModelRequest& r) {
  std::ifstream in(r.cache_path);
  if (!in) return nlohmann::json::object();
  try {
    const nlohmann::json file = nlohmann::json::parse(in);
    if (file.value("version", 0) == kFileVersion && file.contains("models") && file["models"].is_object()) {
      return file["models"];
    }
  } catch (const nlohmann::json::exception&) {
  }
  log_to(r.log, LogLevel::warning,
         fmt::format("treeattn: ignoring the device model cache {}: not a version {} model file", r.cache_path,
                     kFileVersion));
  return nlohmann::json::object();
}

// The file's model for the key, if it has one that parses.
bool cached_model(const DeviceModelRequest& r, CostModel& model) {
  const nlohmann::json models = read_models(r);
  const auto entry = models.find(r.key);
  if (entry == models.end() || !entry->is_object()) return false;
  try {
    CostModel m;
    m.set(entry->value("coefficients", std::string()));
    m.source = entry->value("source", std::string()) + " (cached)";
    model = m;
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

void store_model(const DeviceModelRequest& r, const CostModel& model) {
  nlohmann::json models = read_models(r);
  models[r.key] = {{"source", model.source}, {"coefficients", model.to_string()}};
  std::error_code ignored;
  const std::filesystem::path path(r.cache_path);
  if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path(), ignored);
  std::ofstream out(r.cache_path);
  out << nlohmann::json{{"version", kFileVersion}, {"models", models}}.dump(2) << "\n";
  if (!out) {
    log_to(r.log, LogLevel::warning, fmt::format("treeattn: cannot write the device model cache {}", r.cache_path));
  }
}

}  // namespace

CostModel device_model(const DeviceModelRequest& request, const std::function<CostModel()>& calibrate,
                       const std::function<CostModel(const std::string& why)>& fallback) {
  // One lock for the lookups and the calibration: a second context on the
  // device waits for the first one's model instead of timing beside it.
  static std::mutex mutex;
  static std::map<std::string, CostModel> models;
  std::lock_guard<std::mutex> lock(mutex);
  if (const auto kept = models.find(request.key); kept != models.end()) return kept->second;
  CostModel model;
  if (!request.cache_path.empty() && cached_model(request, model)) {
    models.emplace(request.key, model);
  } else {
    try {
      model = calibrate();
      if (!request.cache_path.empty()) store_model(request, model);
    } catch (const Error& e) {
      model = fallback(e.what());
    }
    models.emplace(request.key, model);
  }
  if (request.verbose) {
    log_to(request.log, LogLevel::info, fmt::format("treeattn: cost model: {}: {}", model.source, model.to_string()));
  }
  return model;
}

}  // namespace treeattn

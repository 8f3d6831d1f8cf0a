#include "cli_support.hpp"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>

#include <fmt/format.h>

#include <cstdlib>
#include <unistd.h>

#include "backend.hpp"
#include "treeattn/error.hpp"
#include "treeattn/npy.hpp"
#include "treeattn/workloads.hpp"

namespace treeattn::cli {

PendingOutputs::~PendingOutputs() {
  for (const auto& file : files_) std::remove(file.first.c_str());
}

std::string PendingOutputs::temporary_for(const std::string& path) {
  for (const auto& file : files_) {
    if (file.second == path) throw Error(ErrorCategory::InvalidArgument, fmt::format("{} is named as two outputs", path));
  }
  std::string temporary = fmt::format("{}.tmp{}", path, ::getpid());
  files_.emplace_back(temporary, path);
  return temporary;
}

void PendingOutputs::write_npy(const std::string& path, const TensorRef& t) {
  treeattn::write_npy(temporary_for(path), t);
}

void PendingOutputs::write_text(const std::string& path, const std::string& text) {
  const std::string temporary = temporary_for(path);
  std::ofstream out(temporary, std::ios::binary);
  out << text;
  out.close();
  if (!out) throw Error(ErrorCategory::Io, fmt::format("{}: cannot write", path));
}

void PendingOutputs::commit() {
  for (const auto& [temporary, path] : files_) {
    if (std::rename(temporary.c_str(), path.c_str()) != 0) {
      throw Error(ErrorCategory::Io, fmt::format("{}: cannot move the result into place", path));
    }
  }
  files_.clear();
}

std::vector<std::string> strategy_names() {
  std::vector<std::string> names;
  for (Strategy s : all_strategies()) names.emplace_back(to_string(s));
  return names;
}

std::vector<std::string> backend_names() { return {"auto", "cpu", "vulkan", "cuda"}; }

std::vector<std::string> model_names() {
  std::vector<std::string> names;
  for (const ModelShape& m : model_shapes()) names.push_back(m.name);
  return names;
}

BackendFlags::BackendFlags() {
  options.log = [](LogLevel, const std::string& message) { std::fprintf(stderr, "%s\n", message.c_str()); };
  if (const char* path = std::getenv("TREEATTN_VK_PIPELINE_CACHE"); path != nullptr) options.vk_pipeline_cache = path;
  const char* validation = std::getenv("TREEATTN_VK_VALIDATION");
  options.vk_validation = validation != nullptr && *validation != '\0' && std::string(validation) != "0";
  if (const char* device = std::getenv("TREEATTN_VK_DEVICE"); device != nullptr && *device != '\0') {
    char* end = nullptr;
    const long index = std::strtol(device, &end, 10);
    if (*end == '\0' && index >= 0 && index <= std::numeric_limits<int>::max()) {
      options.vk_device = int(index);
    } else {
      bad_vk_device = device;
    }
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    options.model_cache = std::string(home) + "/.cache/treeattn/device_models.json";
  }
}

void BackendFlags::add_to(CLI::App& sub) {
  sub.parse_complete_callback([this] {
    if (!bad_vk_device.empty()) {
      throw CLI::ValidationError("TREEATTN_VK_DEVICE", "'" + bad_vk_device + "' is not a device index (0, 1, ...)");
    }
  });
  sub.add_option("--threads", options.threads, "CPU backend threads (0: one per hardware thread)")
      ->check(nonnegative());
  sub.add_option("--device", options.device,
                 "GPU index: CUDA device (default 0), or Vulkan device (`treeattn devices` lists them; default: "
                 "$TREEATTN_VK_DEVICE, else the first discrete GPU)")
      ->check(nonnegative());
  sub.add_option("--vk-variant", options.vk_variant,
                 "Vulkan stage-1 shaders: auto (cooperative matrices where the device has them), scalar, coopmat "
                 "(softmax in registers where the matrices keep mma's fragment layout, probed; else through shared "
                 "memory) or coopmat-shared (the shared-memory softmax anyway)")
      ->check(CLI::IsMember({"auto", "scalar", "coopmat", "coopmat-shared"}))
      ->capture_default_str();
  sub.add_flag_callback(
      "--no-model-cache", [this] { options.model_cache.clear(); },
      "Neither read nor write ~/.cache/treeattn/device_models.json, where the cost models calibrated on GPUs "
      "without a fitted one are kept (a device is then calibrated again in each process)");
}

void PlanFlags::add_to(CLI::App& sub) {
  sub.add_option("--strategy", strategy,
                 "How KV is grouped with queries: flatten (DeFT-Flatten: depth-first, even blocks), "
                 "node (one group per node), node_chunk (nodes cut into even chunks), "
                 "sequence (Q-guided baseline: every query reads its whole path), "
                 "cascade (one group per tree level), greedy (FastTree: a cost model concatenates parent KV into "
                 "child groups where that saves partial results, and splits long groups to fill the GPU)")
      ->check(CLI::IsMember(strategy_names()))
      ->capture_default_str();
  sub.add_option("--block-tokens", block_tokens, kBlockTokensHelp)
      ->check(block_tokens_validator())
      ->capture_default_str();
  sub.add_option("--query-tile", query_tile, "Max queries per work item (bits of a segment mask)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  sub.add_option("--window", window, kWindowHelp)->check(nonnegative())->capture_default_str();
  sub.add_option("--cost", cost, kCostHelp);
  sub.add_option("--plan-threads", plan_threads, kPlanThreadsHelp)->check(nonnegative())->capture_default_str();
}

std::int32_t parse_block_tokens(const std::string& text) {
  if (text == "auto") return kAutoBlockTokens;
  std::size_t used = 0;
  long value = 0;
  try {
    value = std::stol(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || value < 1 || value > kMaxBlockTokens) {
    throw Error(ErrorCategory::InvalidArgument,
                fmt::format("block tokens '{}' is neither a count in [1, {}] nor auto", text, kMaxBlockTokens));
  }
  return std::int32_t(value);
}

namespace {

CLI::Validator at_least_zero(bool zero_allowed, const char* name) {
  return CLI::Validator(
      [zero_allowed](std::string& text) {
        double value = 0.0;
        if (!CLI::detail::lexical_cast(text, value)) return "Value " + text + " is not a number";
        if (!std::isfinite(value)) return "Value " + text + " must be finite";
        if (zero_allowed ? value >= 0.0 : value > 0.0) return std::string();
        return "Value " + text + (zero_allowed ? " must be 0 or more" : " must be more than 0");
      },
      name);
}

}  // namespace

CLI::Validator nonnegative() { return at_least_zero(true, "NONNEGATIVE"); }
CLI::Validator positive() { return at_least_zero(false, "POSITIVE"); }

CLI::Validator block_tokens_validator() {
  return CLI::Validator(
      [](std::string& text) {
        try {
          (void)parse_block_tokens(text);
          return std::string();
        } catch (const Error& e) {
          return std::string(e.what());
        }
      },
      "N|auto");
}

const char* const kBlockTokensHelp =
    "Max KV tokens per block (work item), or auto: the backend's cost model plans each tree at sizes from its "
    "auto_block_min up to auto_block_max in quarter octaves (256, 320, 384, ... 2048 for CUDA), places each plan's "
    "CTAs on the SMs, and keeps the plan it predicts fastest (long shared prompts get long blocks, small trees short "
    "ones, and a tree whose CTAs nearly fill the SMs a size that fills them evenly); greedy: the size small groups "
    "are packed up to, its long groups are cut by the cost model";

const char* const kWindowHelp =
    "Sliding window: each query sees the last N tokens of its path, its own included (transformers' "
    "sliding_window); tokens outside every window are not read. 0: none";

const char* const kCostHelp =
    "Cost-model coefficients KEY=VALUE,... over the H100 defaults: pass_ns, tile_ns_large, tile_ns_small "
    "(a pass, a 64-token KV tile in a 64-row or 16-row pass), partial_ns (a partial row), slots (CTAs in flight), sms (the SMs they are spread over), "
    "solo_speedup (a pass alone on an SM against its share of a full one, where a plan's CTAs are placed on the SMs), "
    "split_solo_speedup (the same in the analytic step time by which greedy cuts long groups), refill_spread (1: slots "
    "that free together are refilled one CTA per SM a round, 0: each SM's in turn), switch_gain (greedy keeps flatten's "
    "layout unless its own is predicted this many times faster), merge_ns (the merge kernel's fixed cost, which only a "
    "plan without partials saves: greedy weighs one item per query against it), fanin_ns (per partial of the query "
    "with the most: the merge's chain of dependent loads), reorder_gain (a plan launches its blocks longest pass first "
    "when the placement predicts that order this many times faster; 0: never), fp8_small_tile_factor and "
    "fp8_solo_speedup (with --kv-dtype: tile_ns_small's factor, and the solo_speedup in place of the f16 one, 0 keeping "
    "it), min_split_tokens, auto_block_min and auto_block_max (the range --block-tokens auto tries). They choose each "
    "item's tile rows and the greedy strategy's groups";

const char* const kPlanThreadsHelp =
    "Threads that time the block-size candidates of --block-tokens auto in parallel (0: one per hardware thread); "
    "the plan is the same on any number, only the planning time changes";

const char* const kBitwiseUpdatesHelp =
    "Make every incremental update bitwise a from-scratch plan of the same tree: no flatten blocks or greedy edge "
    "decisions held between updates (those cover every query's tokens exactly, but round differently from a "
    "from-scratch plan's blocks)";

IncrementalOptions incremental_options(bool bitwise, int plan_threads) {
  IncrementalOptions incremental;
  incremental.hold_flatten_blocks = !bitwise;
  incremental.hold_greedy_groups = !bitwise;
  incremental.threads = plan_threads;
  return incremental;
}

PlanOptions PlanFlags::options(std::int64_t kv_slots, const CostModel& base) const {
  PlanOptions o;
  o.strategy = parse_strategy(strategy);
  o.block_tokens = parse_block_tokens(block_tokens);
  o.query_tile = query_tile;
  o.window = window;
  o.kv_slots = kv_slots;
  o.cost = base;
  o.cost.set(cost);
  return o;
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "kB", "MB", "GB", "TB"};
  int u = 0;
  while (bytes >= 1000.0 && u < 4) {
    bytes /= 1000.0;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.1f} {}", bytes, units[u]);
}

}  // namespace treeattn::cli

#pragma once
// Helpers shared by the subcommands.

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "backend.hpp"
#include "treeattn/incremental_planner.hpp"
#include "treeattn/planner.hpp"
#include "treeattn/tensor.hpp"

namespace treeattn::cli {

// Output files written under temporary names and renamed into place only by
// commit(), so a failed command never leaves a partial or stale-looking output.
// Anything not committed is removed in the destructor.
class PendingOutputs {
 public:
  PendingOutputs() = default;
  PendingOutputs(const PendingOutputs&) = delete;
  PendingOutputs& operator=(const PendingOutputs&) = delete;
  ~PendingOutputs();

  void write_npy(const std::string& path, const TensorRef& t);
  void write_text(const std::string& path, const std::string& text);
  void commit();

 private:
  std::string temporary_for(const std::string& path);
  std::vector<std::pair<std::string, std::string>> files_;  // (temporary, final)
};

// The choices of --strategy, --backend and --model, for CLI11's IsMember checks.
std::vector<std::string> strategy_names();
std::vector<std::string> backend_names();
std::vector<std::string> model_names();

// --strategy, --block-tokens, --query-tile, --window, --cost and --plan-threads, shared by the commands that plan.
struct PlanFlags {
  std::string strategy = "flatten";
  std::string block_tokens = "auto";  // a count or "auto" (parse_block_tokens)
  int query_tile = kMaxQueryTile;
  int window = 0;    // PlanOptions::window (0: none)
  std::string cost;  // cost-model coefficients, KEY=VALUE,...
  int plan_threads = 1;  // the Planner's threads (0: one per hardware thread)

  void add_to(CLI::App& sub);
  // `base`: the device's cost model, which --cost adjusts.
  PlanOptions options(std::int64_t kv_slots = 0, const CostModel& base = cost_model_for("h100")) const;
};

// --threads (CPU), --device and --vk-variant (Vulkan), shared by the commands
// that run a backend. --verbose is the command's own and is copied in.
struct BackendFlags {
  BackendOptions options;

  // The CLI's messages go to stderr; TREEATTN_VK_PIPELINE_CACHE names the
  // Vulkan pipeline cache file, TREEATTN_VK_DEVICE the Vulkan device where
  // --device is not given, TREEATTN_VK_VALIDATION=1 turns the Khronos
  // validation layer on, and calibrated cost models are kept in
  // $HOME/.cache/treeattn/device_models.json (--no-model-cache: not kept).
  // The library itself reads none of these.
  BackendFlags();

  // Adds the flags; a TREEATTN_VK_DEVICE that is not an index fails the parse.
  void add_to(CLI::App& sub);

 private:
  std::string bad_vk_device;  // TREEATTN_VK_DEVICE's text when it is not a device index
};

// Numbers of 0 or more (NONNEGATIVE in the help) and more than 0 (POSITIVE):
// CLI11's NonNegativeNumber and PositiveNumber would print their upper bound,
// DBL_MAX, in 309 digits.
CLI::Validator nonnegative();
CLI::Validator positive();

// --block-tokens: a count in [1, 65536], or "auto" (kAutoBlockTokens); throws
// InvalidArgument naming the text. The validator is the same check for CLI11.
std::int32_t parse_block_tokens(const std::string& text);
CLI::Validator block_tokens_validator();

// The help texts of --block-tokens, --cost and --plan-threads (plan, run, demo, bench).
extern const char* const kBlockTokensHelp;
extern const char* const kWindowHelp;
extern const char* const kCostHelp;
extern const char* const kPlanThreadsHelp;

// --bitwise-updates (demo, bench): an IncrementalPlanner's options with
// `bitwise` (no layout held: every update is a from-scratch plan's, bit for
// bit) and the planner's threads.
extern const char* const kBitwiseUpdatesHelp;
IncrementalOptions incremental_options(bool bitwise, int plan_threads);

// "16.6 MB", "512 B": decimal units, as bandwidths are quoted.
std::string format_bytes(double bytes);

}  // namespace treeattn::cli

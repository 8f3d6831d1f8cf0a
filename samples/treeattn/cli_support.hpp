#pragma once
// Helpers shared by the subcommands.

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "treeattn/plan.hpp"
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

// The choices of --strategy and --backend, for CLI11's IsMember checks.
std::vector<std::string> strategy_names();
std::vector<std::string> backend_names();

// Registers --strategy, --block-tokens and --query-tile on a subcommand.
void add_plan_options(CLI::App& sub, std::string& strategy, int& block_tokens, int& query_tile);

// "16.6 MB", "512 B": decimal units, as bandwidths are quoted.
std::string format_bytes(double bytes);

}  // namespace treeattn::cli

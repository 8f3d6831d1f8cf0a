#pragma once
// Each subcommand registers its options on the app and returns the action to
// run once parsing succeeded. Actions throw treeattn::Error on failure; main()
// turns that into one line on stderr and exit status 1.

#include <functional>

#include <CLI/CLI.hpp>

namespace treeattn::cli {

struct Command {
  CLI::App* app;
  std::function<void()> action;
};

Command add_run_command(CLI::App& app);
Command add_plan_command(CLI::App& app);
Command add_bench_command(CLI::App& app);
Command add_demo_command(CLI::App& app);
Command add_random_inputs_command(CLI::App& app);
Command add_devices_command(CLI::App& app);

}  // namespace treeattn::cli

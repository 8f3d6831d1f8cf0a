// treeattn: command-line front end of the tree-attention engine.

#include <iostream>
#include <string>
#include <vector>

#include "commands.hpp"
#include "treeattn/error.hpp"

int main(int argc, char** argv) {
  CLI::App app{
      "treeattn: decode-time attention over a tree of KV cache (DeFT-Flatten).\n"
      "Plan a tree once, then run attention for every query on the CPU, CUDA or Vulkan backend.\n"
      "Start with `treeattn random-inputs` and `treeattn run` on examples/fewshot.json.",
      "treeattn"};
  app.require_subcommand(1, 1);
  app.fallthrough(false);
  std::vector<treeattn::cli::Command> commands = {
      treeattn::cli::add_run_command(app),
      treeattn::cli::add_plan_command(app),
      treeattn::cli::add_bench_command(app),
      treeattn::cli::add_demo_command(app),
      treeattn::cli::add_random_inputs_command(app),
      treeattn::cli::add_devices_command(app),
  };

  // CLI11 would only say "a subcommand is required" for a mistyped command.
  if (argc > 1 && argv[1][0] != '-') {
    std::string names;
    bool known = false;
    for (const auto& command : commands) {
      known = known || command.app->get_name() == argv[1];
      names += (names.empty() ? "" : ", ") + command.app->get_name();
    }
    if (!known) {
      std::cerr << "treeattn: error: unknown command '" << argv[1] << "' (choose " << names << ")\n";
      return 1;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "treeattn: error: " << e.what() << " (see treeattn --help)\n";
    return 1;
  }

  for (const auto& command : commands) {
    if (!command.app->parsed()) continue;
    try {
      command.action();
      return 0;
    } catch (const treeattn::Error& e) {
      std::cerr << "treeattn " << command.app->get_name() << ": error: " << e.what() << "\n";
    } catch (const std::exception& e) {
      std::cerr << "treeattn " << command.app->get_name() << ": error: " << e.what() << "\n";
    }
    return 1;
  }
  return 1;
}

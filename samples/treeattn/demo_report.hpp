#pragma once
// What `treeattn demo` reports once its run is over: the summary on stdout
// (medians over the kept step rows, counts over every step, the soak's checks
// and memory) and, with --json, the same with the kept rows as JSON.

#include "demo_loop.hpp"
#include "demo_options.hpp"

namespace treeattn::cli {

void print_summary(const DemoOptions& o, const DemoSetup& setup, const DemoLoop& loop);
void write_json(const DemoOptions& o, const DemoSetup& setup, const DemoLoop& loop);

}  // namespace treeattn::cli

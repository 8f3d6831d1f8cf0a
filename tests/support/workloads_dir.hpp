#pragma once
// Where the DeFT workload files are: ctest sets TREEATTN_WORKLOADS_DIR to the
// repository's data/workloads/deft; a test run by hand from the root finds them there.

#include <cstdlib>
#include <string>

namespace treeattn::test {

inline std::string workloads_dir() {
  const char* dir = std::getenv("TREEATTN_WORKLOADS_DIR");
  return dir != nullptr ? dir : "data/workloads/deft";
}

}  // namespace treeattn::test

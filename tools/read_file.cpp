#include "read_file.hpp"

#include <fstream>
#include <sstream>

#include "fail.hpp"

namespace treeattn {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(ErrorCategory::Io, "{}: cannot open for reading", path);
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) fail(ErrorCategory::Io, "{}: read error", path);
  return buffer.str();
}

}  // namespace treeattn

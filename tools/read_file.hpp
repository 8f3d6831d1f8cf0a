#pragma once
// Internal: a whole file as bytes; throws Io naming the path.

#include <string>

namespace treeattn {

std::string read_file(const std::string& path);

}  // namespace treeattn

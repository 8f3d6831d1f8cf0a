#include "support/harness_options.hpp"

#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>

#include "treeattn/error.hpp"

namespace treeattn::test {

BackendOptions harness_options() {
  BackendOptions options;
  options.log = [](LogLevel, const std::string& message) { std::fprintf(stderr, "%s\n", message.c_str()); };
  if (const char* device = std::getenv("TREEATTN_VK_DEVICE"); device != nullptr && *device != '\0') {
    char* end = nullptr;
    const long index = std::strtol(device, &end, 10);
    if (*end != '\0' || index < 0 || index > std::numeric_limits<int>::max()) {
      throw Error(ErrorCategory::InvalidArgument,
                  std::string("TREEATTN_VK_DEVICE='") + device + "' is not a device index (expected 0, 1, ...)");
    }
    options.vk_device = int(index);
  }
  const char* validation = std::getenv("TREEATTN_VK_VALIDATION");
  options.vk_validation = validation != nullptr && *validation != '\0' && std::string(validation) != "0";
  return options;
}

}  // namespace treeattn::test

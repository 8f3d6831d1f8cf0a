#pragma once
// Where the library's messages go: which device and kernel variant run (at
// verbose), what it ignored. The library writes nothing to stderr by itself;
// an application passes a sink (the CLI's writes to stderr).

#include <functional>
#include <string>

namespace treeattn {

enum class LogLevel { info, warning };
using LogSink = std::function<void(LogLevel level, const std::string& message)>;

// Sends `message` to `sink` when there is one.
inline void log_to(const LogSink& sink, LogLevel level, const std::string& message) {
  if (sink) sink(level, message);
}

}  // namespace treeattn

#pragma once
// The progress of a long run on stderr: on a terminal a bar redrawn at most
// ten times a second; in a log a line per tenth of the run, and at least one
// a minute, so a long soak shows it lives.

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>

#include <fmt/format.h>

namespace treeattn::cli {

class ProgressBar {
 public:
  explicit ProgressBar(std::int64_t total) : total_(total), tty_(isatty(2) != 0) {}
  // `done` of the total; `detail` is called only when a line is shown.
  template <typename Detail>
  void update(std::int64_t done, Detail&& detail) {
    const auto now = std::chrono::steady_clock::now();
    const bool last = done == total_;
    const std::int64_t tenth = done * 10 / std::max<std::int64_t>(total_, 1);
    if (tty_ ? !last && now - shown_ < std::chrono::milliseconds(100)
             : !last && tenth == reported_ && now - shown_ < std::chrono::minutes(1)) {
      return;
    }
    // The pace once a second has passed: the first steps (a prefill, a capture) say little of it.
    const double seconds = std::chrono::duration<double>(now - start_).count();
    const double rate = double(done) / std::max(seconds, 1e-9);
    const std::string pace =
        seconds < 1.0 ? "" : fmt::format(" ({:.0f} steps/s, {:.0f} s left)", rate, double(total_ - done) / rate);
    if (tty_) {
      const int filled = int(30 * done / std::max<std::int64_t>(total_, 1));
      fmt::print(stderr, "\r[{}{}] step {}/{}{}  {}\x1b[K", std::string(std::size_t(filled), '#'),
                 std::string(std::size_t(30 - filled), '.'), done, total_, pace, detail());
      if (last) fmt::print(stderr, "\n");
    } else {
      fmt::print(stderr, "step {}/{}{}  {}\n", done, total_, pace, detail());
    }
    reported_ = tenth;
    shown_ = now;
  }

 private:
  std::int64_t total_;
  bool tty_;
  std::int64_t reported_ = -1;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now(), shown_ = start_;
};

}  // namespace treeattn::cli

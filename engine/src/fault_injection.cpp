#include "fault_injection.hpp"

namespace treeattn::fault_injection {

std::atomic<unsigned> g_armed_sites{0};

namespace {
std::atomic<long> g_left{0};  // calls at the armed sites to let through before the failing one
std::atomic<bool> g_fired{false};
}  // namespace

void arm(unsigned sites, long skip) noexcept {
  g_left.store(skip);
  g_fired.store(false);
  g_armed_sites.store(sites);
}

void disarm() noexcept { g_armed_sites.store(0); }

bool fired() noexcept { return g_fired.load(); }

bool fails_armed(Site site) noexcept {
  if ((g_armed_sites.load() & site) == 0 || g_left.fetch_sub(1) != 0) return false;
  disarm();
  g_fired.store(true);
  return true;
}

}  // namespace treeattn::fault_injection

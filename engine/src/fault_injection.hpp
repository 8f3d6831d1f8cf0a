#pragma once
// Internal, for tests: fails the Nth device allocation, pinned host
// allocation or driver call, so that a test can sweep N over a decode step and
// prove that every failure surfaces as an error and leaves nothing behind.
// The backends ask `fails(site)` just before each such call and, when it says
// yes, take the driver's own failure code instead of making the call. Disarmed
// (always, outside the fault tests), a check is one relaxed atomic load.

#include <atomic>

namespace treeattn::fault_injection {

enum Site : unsigned {
  device_allocation = 1u << 0,  // cudaMalloc; vkAllocateMemory of device-local memory
  pinned_allocation = 1u << 1,  // cudaHostAlloc; vkAllocateMemory of host-visible memory
  driver_call = 1u << 2,        // every call through TREEATTN_CUDA_CHECK / TREEATTN_VK_CHECK
};

// The sites armed (0: none).
extern std::atomic<unsigned> g_armed_sites;

// Arms `sites` (a mask of Site): the calls there are let through until
// `skip` have been, the next one fails, and every site is disarmed.
void arm(unsigned sites, long skip) noexcept;
void disarm() noexcept;
// Whether the armed failure happened since the last arm().
bool fired() noexcept;

// fails()'s counting, reached only while some site is armed.
bool fails_armed(Site site) noexcept;
// Whether the call about to be made at `site` is the one to fail.
inline bool fails(Site site) noexcept {
  return (g_armed_sites.load(std::memory_order_relaxed) & site) != 0 && fails_armed(site);
}

}  // namespace treeattn::fault_injection

#pragma once
// Device memory and pinned host memory owned by move-only handles; each grows
// only when asked for more.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>

#include "cuda_check.hpp"

namespace treeattn::cuda {

// One handle for both kinds; `Memory` says how to allocate and free.
template <typename Memory>
class OwnedMemory {
 public:
  OwnedMemory() = default;
  explicit OwnedMemory(std::size_t bytes) { reserve(bytes); }
  ~OwnedMemory() { release(); }
  OwnedMemory(OwnedMemory&& other) noexcept : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  OwnedMemory& operator=(OwnedMemory&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  OwnedMemory(const OwnedMemory&) = delete;
  OwnedMemory& operator=(const OwnedMemory&) = delete;

  // Ensures at least `bytes` (contents are not kept when it grows).
  void reserve(std::size_t bytes) {
    if (bytes <= bytes_) return;
    release();
    TREEATTN_CUDA_CHECK(Memory::allocate(&data_, bytes));
    bytes_ = bytes;
  }
  void* data() const noexcept { return data_; }
  template <typename T>
  T* as() const noexcept { return static_cast<T*>(data_); }
  std::size_t bytes() const noexcept { return bytes_; }

 private:
  void release() noexcept {
    if (data_ != nullptr) Memory::free(data_);
    data_ = nullptr;
    bytes_ = 0;
  }
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

// A fault test's injected failure is the driver's own: cudaErrorMemoryAllocation, nothing allocated.
struct DeviceMemory {
  static cudaError_t allocate(void** data, std::size_t bytes) {
    if (fault_injection::fails(fault_injection::device_allocation)) return cudaErrorMemoryAllocation;
    return cudaMalloc(data, bytes);
  }
  static void free(void* data) { cudaFree(data); }
};

// Page-locked host memory mapped into the device's address space: kernels
// read and write it over the bus, with no copy of their own (cudaHostGetDevicePointer
// gives its device address).
struct MappedMemory {
  static cudaError_t allocate(void** data, std::size_t bytes) {
    if (fault_injection::fails(fault_injection::pinned_allocation)) return cudaErrorMemoryAllocation;
    return cudaHostAlloc(data, bytes, cudaHostAllocMapped);
  }
  static void free(void* data) { cudaFreeHost(data); }
};

using DeviceBuffer = OwnedMemory<DeviceMemory>;
using MappedBuffer = OwnedMemory<MappedMemory>;

}  // namespace treeattn::cuda

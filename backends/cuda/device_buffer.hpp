#pragma once
// Device memory and pinned host memory owned by move-only handles; each grows
// only when asked for more.

#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>

#include "cuda_check.hpp"

namespace treeattn::cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(std::size_t bytes) { reserve(bytes); }
  ~DeviceBuffer() { release(); }
  DeviceBuffer(DeviceBuffer&& other) noexcept : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // Ensures at least `bytes` (contents are not kept when it grows).
  void reserve(std::size_t bytes) {
    if (bytes <= bytes_) return;
    release();
    TREEATTN_CUDA_CHECK(cudaMalloc(&data_, bytes));
    bytes_ = bytes;
  }
  void* data() const noexcept { return data_; }
  template <typename T>
  T* as() const noexcept { return static_cast<T*>(data_); }
  std::size_t bytes() const noexcept { return bytes_; }

 private:
  void release() noexcept {
    if (data_ != nullptr) cudaFree(data_);
    data_ = nullptr;
    bytes_ = 0;
  }
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

// Page-locked host memory: what cudaMemcpyAsync copies from without staging
// it through the driver first (and so without waiting for the copy).
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer() { release(); }
  PinnedBuffer(PinnedBuffer&& other) noexcept : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  // Ensures at least `bytes` (contents are not kept when it grows).
  void reserve(std::size_t bytes) {
    if (bytes <= bytes_) return;
    release();
    TREEATTN_CUDA_CHECK(cudaHostAlloc(&data_, bytes, cudaHostAllocDefault));
    bytes_ = bytes;
  }
  unsigned char* data() const noexcept { return static_cast<unsigned char*>(data_); }
  std::size_t bytes() const noexcept { return bytes_; }

 private:
  void release() noexcept {
    if (data_ != nullptr) cudaFreeHost(data_);
    data_ = nullptr;
    bytes_ = 0;
  }
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

}  // namespace treeattn::cuda

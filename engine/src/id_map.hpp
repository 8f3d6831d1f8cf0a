#pragma once
// Internal: node id -> node index, for ids the caller chooses (any int64).
// One flat open-addressed table (no allocation per id, unlike a node-based
// hash map), sized for the ids it is built for; lookups of absent ids are cheap.

#include <algorithm>
#include <cstdint>
#include <vector>

namespace treeattn {

class IdMap {
 public:
  // Empty, with room for `count` ids without growing. The table it has is
  // kept unless more than four times too large: a tree rebuilt after a
  // removal usually takes back as many ids as it had.
  void reset(std::size_t count) {
    std::size_t capacity = 16;
    while (capacity < 2 * count) capacity *= 2;
    if (slots_.size() < capacity || slots_.size() > 4 * capacity) {
      slots_.assign(capacity, Slot{0, kEmpty});
    } else {
      std::fill(slots_.begin(), slots_.end(), Slot{0, kEmpty});
    }
    size_ = 0;
  }
  // Returns the index already held for `id`, or -1 after storing `index`.
  std::int32_t insert(std::int64_t id, std::int32_t index) {
    if (2 * (size_ + 1) > slots_.size()) grow();
    Slot& s = slots_[probe(id)];
    if (s.index != kEmpty) return s.index;
    s = Slot{id, index};
    ++size_;
    return -1;
  }
  std::int32_t find(std::int64_t id) const {
    if (slots_.empty()) return -1;
    const Slot& s = slots_[probe(id)];
    return s.index == kEmpty ? -1 : s.index;
  }
  std::size_t size() const noexcept { return size_; }

 private:
  static constexpr std::int32_t kEmpty = -1;
  struct Slot {
    std::int64_t id;
    std::int32_t index;
  };
  // The slot holding `id`, or the empty one where it would go (linear probing).
  // An id below the table's size starts at its own slot: the usual ids
  // 0..n-1 never collide with each other, and a walk over them in order
  // walks the table in order (a hashed start would miss the cache at each).
  std::size_t probe(std::int64_t id) const {
    const std::size_t mask = slots_.size() - 1;
    std::size_t i = std::uint64_t(id) <= mask ? std::size_t(id)
                                              : std::size_t((std::uint64_t(id) * 0x9e3779b97f4a7c15ull) >> 32) & mask;
    while (slots_[i].index != kEmpty && slots_[i].id != id) i = (i + 1) & mask;
    return i;
  }
  void grow() {
    std::vector<Slot> old = std::move(slots_);
    reset(old.empty() ? 8 : old.size());
    for (const Slot& s : old) {
      if (s.index != kEmpty) insert(s.id, s.index);
    }
  }

  std::vector<Slot> slots_;
  std::size_t size_ = 0;
};

}  // namespace treeattn

// validate(const Plan&) against mutated plans: a valid plan of a small random
// forest, then input-driven edits of its arrays and sizes (values, lengths,
// CSR orders, masks, the launch order, the scalars). validate() must refuse
// the plan with InvalidPlan or accept it; a plan it accepts runs on the CPU
// backend with tensors of the plan's shapes without a fault (ASan, UBSan).

#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "treeattn/context.hpp"
#include "treeattn/error.hpp"
#include "treeattn/planner.hpp"
#include "treeattn/workloads.hpp"

using namespace treeattn;

namespace {

constexpr std::int64_t kMaxRunElements = 1 << 20;  // larger claimed shapes are not run

std::int32_t pick_value(FuzzedDataProvider& in, std::size_t size) {
  switch (in.ConsumeIntegralInRange<int>(0, 9)) {
    case 0: return -1;
    case 1: return 0;
    case 2: return std::int32_t(size);
    case 3: return std::int32_t(std::uint32_t(size) + 1);
    case 4: return std::int32_t(std::uint32_t(size) - 1);
    case 5: return INT32_MAX;
    case 6: return INT32_MIN;
    default: return in.ConsumeIntegralInRange<std::int32_t>(-2, 70);
  }
}

// One edit of an int32 array: a value, a swap, an entry more or fewer.
void edit(FuzzedDataProvider& in, std::vector<std::int32_t>& a) {
  const std::size_t at = a.empty() ? 0 : in.ConsumeIntegralInRange<std::size_t>(0, a.size() - 1);
  switch (in.ConsumeIntegralInRange<int>(0, 4)) {
    case 0: if (!a.empty()) a[at] = pick_value(in, a.size()); break;
    case 1: if (!a.empty()) a[at] = std::int32_t(std::uint32_t(a[at]) + (in.ConsumeBool() ? 1u : ~0u)); break;
    case 2: if (!a.empty()) std::swap(a[at], a[in.ConsumeIntegralInRange<std::size_t>(0, a.size() - 1)]); break;
    case 3: a.insert(a.begin() + std::ptrdiff_t(at), pick_value(in, a.size())); break;
    default: if (!a.empty()) a.erase(a.begin() + std::ptrdiff_t(at)); break;
  }
}

void mutate(FuzzedDataProvider& in, Plan& p) {
  switch (in.ConsumeIntegralInRange<int>(0, 22)) {
    case 0: edit(in, p.token_slot); break;
    case 1: edit(in, p.segment_token_begin); break;
    case 2: edit(in, p.segment_token_end); break;
    case 3: edit(in, p.segment_node); break;
    case 4: edit(in, p.block_segment_begin); break;
    case 5: edit(in, p.item_block); break;
    case 6: edit(in, p.item_query_begin); break;
    case 7: edit(in, p.item_mask_begin); break;
    case 8: edit(in, p.item_tile_rows); break;
    case 9: edit(in, p.tile_query); break;
    case 10: edit(in, p.tile_partial); break;
    case 11: edit(in, p.merge_begin); break;
    case 12: edit(in, p.merge_partial); break;
    case 13: edit(in, p.launch_order); break;
    case 14:  // the launch order reversed (as a permutation it may break a block's order)
      if (p.launch_order.empty()) {
        for (std::int32_t i = p.num_items(); i-- > 0;) p.launch_order.push_back(i);
      } else {
        p.launch_order.clear();
      }
      break;
    case 15:
      if (!p.segment_mask.empty()) {
        p.segment_mask[in.ConsumeIntegralInRange<std::size_t>(0, p.segment_mask.size() - 1)] ^=
            std::uint64_t(1) << in.ConsumeIntegralInRange<int>(0, 63);
      }
      break;
    case 16:
      if (in.ConsumeBool()) p.segment_mask.push_back(in.ConsumeIntegral<std::uint64_t>());
      else if (!p.segment_mask.empty()) p.segment_mask.pop_back();
      break;
    case 17: p.num_queries = pick_value(in, std::size_t(p.num_queries)); break;
    case 18: p.num_partials = pick_value(in, std::size_t(p.num_partials)); break;
    case 19: p.block_tokens = pick_value(in, std::size_t(p.block_tokens)); break;
    case 20: p.query_tile = pick_value(in, std::size_t(p.query_tile)); break;
    case 21: p.min_kv_slots = pick_value(in, std::size_t(p.min_kv_slots)); break;
    default: {
      int* fields[] = {&p.heads.heads_q, &p.heads.heads_kv, &p.heads.head_dim};
      *fields[in.ConsumeIntegralInRange<int>(0, 2)] = pick_value(in, 64);
      break;
    }
  }
}

Context& cpu_context() {
  static Context context([] {
    ContextOptions options;
    options.backend = BackendKind::cpu;
    options.cpu.threads = 1;
    return options;
  }());
  return context;
}

// Runs `p` with zeroed tensors of its shapes (f16 Q, K, V; f32 O and LSE).
void run_on_cpu(const Plan& p) {
  const std::int64_t nq = p.num_queries, slots = p.min_kv_slots;
  const std::int64_t hq = p.heads.heads_q, hkv = p.heads.heads_kv, d = p.heads.head_dim;
  auto small = [](std::int64_t n) { return n >= 0 && n <= kMaxRunElements; };
  if (!small(nq) || !small(slots) || !small(hq) || !small(hkv) || !small(d) || nq * hq * d > kMaxRunElements ||
      slots * hkv * d > kMaxRunElements) {
    return;
  }
  HostArray q(DType::f16, {nq, hq, d}), k(DType::f16, {slots, hkv, d}), v(DType::f16, {slots, hkv, d});
  HostArray o(DType::f32, {nq, hq, d}), lse(DType::f32, {nq, hq});
  try {
    cpu_context().run(p, AttentionArgs{q.view(), k.view(), v.view(), o.view(), lse.view()});
  } catch (const Error&) {
    // A plan validate() accepts may still not fit these tensors (its heads edited): refused, not run.
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  RandomForestOptions forest;
  forest.seed = in.ConsumeIntegral<std::uint16_t>();
  forest.nodes = in.ConsumeIntegralInRange<std::int32_t>(1, 12);
  forest.roots = in.ConsumeIntegralInRange<std::int32_t>(1, 3);
  forest.queries = in.ConsumeIntegralInRange<std::int32_t>(1, 24);
  forest.max_tokens = in.ConsumeIntegralInRange<std::int32_t>(1, 24);
  PlanOptions options;
  options.strategy = all_strategies()[in.ConsumeIntegralInRange<std::size_t>(0, all_strategies().size() - 1)];
  const std::int32_t blocks[] = {kAutoBlockTokens, 1, 4, 16};
  options.block_tokens = blocks[in.ConsumeIntegralInRange<int>(0, 3)];
  options.query_tile = in.ConsumeIntegralInRange<std::int32_t>(1, 64);
  Plan p;
  try {
    p = plan(random_forest(forest), options);
  } catch (const Error&) {
    return -1;  // a forest these options do not fit (not what this target is for)
  }
  const int edits = in.ConsumeIntegralInRange<int>(1, 4);
  for (int e = 0; e < edits; ++e) mutate(in, p);
  p.id = new_plan_id();
  try {
    validate(p);
  } catch (const Error& e) {
    if (e.category() != ErrorCategory::InvalidPlan) __builtin_trap();
    return 0;
  }
  run_on_cpu(p);
  return 0;
}

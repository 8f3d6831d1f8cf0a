// The C API driven by call sequences decoded from the input: trees (listed,
// ranged and paged nodes, queries, out-of-range ids, slots, pages and upto),
// plans and planners with option structs of any struct_size and raw enum
// values, runs on a CPU context with tensors of wrong shapes, dtypes (fp8
// among them), strides and NULLs, and attention options (soft-cap, scales,
// sinks and per-head scales of any shape and dtype; trees of any head_dim_v). Every call returns a status in the enum, with a message exactly
// when it fails; nothing crashes or leaks (ASan, UBSan, LeakSanitizer).
// Tensors stay small: every buffer holds what its shape and strides claim,
// up to kMaxTensorBytes (a tensor claiming more gets no data: NULL).

#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "treeattn/treeattn.h"

namespace {

constexpr std::int64_t kMaxTensorBytes = 1 << 20;
constexpr int kMaxCalls = 64;

// Mostly small values; sometimes the edges of the type.
std::int64_t pick_int(FuzzedDataProvider& in, std::int64_t small) {
  switch (in.ConsumeIntegralInRange<int>(0, 15)) {
    case 0: return -1;
    case 1: return INT64_MAX;
    case 2: return INT64_MIN;
    case 3: return std::int64_t(INT32_MAX) + 1;
    case 4: return in.ConsumeIntegral<std::int64_t>();
    default: return in.ConsumeIntegralInRange<std::int64_t>(0, small);
  }
}

std::int32_t pick_int32(FuzzedDataProvider& in, std::int32_t small) {
  switch (in.ConsumeIntegralInRange<int>(0, 11)) {
    case 0: return -1;
    case 1: return INT32_MAX;
    case 2: return INT32_MIN;
    case 3: return in.ConsumeIntegral<std::int32_t>();
    default: return in.ConsumeIntegralInRange<std::int32_t>(0, small);
  }
}

// A value one below `v`, wrapping (C callers pass any int64).
std::int64_t below(std::int64_t v) { return std::int64_t(std::uint64_t(v) - 1); }

std::vector<std::int64_t> pick_list(FuzzedDataProvider& in, std::int64_t small) {
  std::vector<std::int64_t> values(in.ConsumeIntegralInRange<std::size_t>(0, 8));
  for (std::int64_t& v : values) v = pick_int(in, small);
  return values;
}

// A raw int in an enum field: C lets a caller store any.
template <typename Enum>
void store_raw(Enum& field, std::int32_t value) {
  static_assert(sizeof(Enum) == sizeof(std::int32_t), "C enums of this API are int-sized");
  std::memcpy(&field, &value, sizeof value);
}

struct Handles {
  FuzzedDataProvider& in;
  treeattn_context* context = nullptr;
  treeattn_tree* tree = nullptr;
  treeattn_plan* plan = nullptr;
  treeattn_planner* planner = nullptr;
  const treeattn_plan* step = nullptr;  // the planner's plan
  std::int32_t heads_q = 4, heads_kv = 2, head_dim = 64, head_dim_v = 64;
  std::vector<std::vector<unsigned char>> buffers;

  explicit Handles(FuzzedDataProvider& input) : in(input) {}
  ~Handles() {
    treeattn_planner_destroy(planner);
    treeattn_plan_destroy(plan);
    treeattn_tree_destroy(tree);
    treeattn_context_destroy(context);
  }

  // The API's promise: a status of the enum, a message exactly on failure.
  // INTERNAL (an exception other than treeattn's) and OUT_OF_MEMORY (these
  // inputs are small) are findings too.
  static void check(treeattn_status status) {
    const bool in_enum = status >= TREEATTN_OK && status < TREEATTN_ERROR_OUT_OF_MEMORY;
    if (in_enum && (status == TREEATTN_OK) == (treeattn_last_error()[0] == '\0')) return;
    std::fprintf(stderr, "fuzz_c_api: status %d, message '%s'\n", int(status), treeattn_last_error());
    __builtin_trap();
  }

  // NULL, the defaults, or a struct of any size with raw values in its fields.
  const treeattn_plan_options* plan_options(treeattn_plan_options& o) {
    treeattn_plan_options_init(&o);
    switch (in.ConsumeIntegralInRange<int>(0, 3)) {
      case 0: return nullptr;
      case 1: return &o;
      default: break;
    }
    if (in.ConsumeBool()) o.struct_size = std::size_t(pick_int(in, sizeof o + 8));
    store_raw(o.strategy, pick_int32(in, 6));
    o.block_tokens = pick_int32(in, 80);
    o.bitwise_updates = pick_int32(in, 1);
    return &o;
  }

  void create_context() {
    treeattn_context_options o;
    treeattn_context_options_init(&o);
    const treeattn_context_options* given = nullptr;
    if (in.ConsumeBool()) {
      if (in.ConsumeBool()) o.struct_size = std::size_t(pick_int(in, sizeof o + 8));
      store_raw(o.backend, pick_int32(in, 4));
      o.device = pick_int32(in, 2);
      o.threads = in.ConsumeIntegralInRange<std::int32_t>(-1, 2);
      given = &o;
    }
    treeattn_context* made = nullptr;
    check(treeattn_context_create(given, &made));
    if (made == nullptr) return;
    treeattn_context_destroy(context);
    context = made;
  }

  void create_tree() {
    const std::int32_t hq = pick_int32(in, 8), hkv = pick_int32(in, 4), hd = pick_int32(in, 256);
    const float scales[] = {0.0f, 0.125f, -1.0f, __builtin_nanf(""), __builtin_inff()};
    const float scale = scales[in.ConsumeIntegralInRange<int>(0, 4)];
    treeattn_tree** out = in.ConsumeIntegralInRange<int>(0, 15) == 0 ? nullptr : new treeattn_tree*(nullptr);
    std::int32_t hdv = 0;
    if (in.ConsumeBool()) {
      check(treeattn_tree_create(hq, hkv, hd, scale, out));
    } else {  // with head_dim_v, from options of any size
      treeattn_tree_options o;
      treeattn_tree_options_init(&o);
      if (in.ConsumeBool()) o.struct_size = std::size_t(pick_int(in, sizeof o + 8));
      o.heads_q = hq, o.heads_kv = hkv, o.head_dim = hd, o.scale = scale;
      o.head_dim_v = hdv = pick_int32(in, 256);
      check(treeattn_tree_create_with(in.ConsumeIntegralInRange<int>(0, 15) == 0 ? nullptr : &o, out));
    }
    treeattn_tree* made = out != nullptr ? *out : nullptr;
    delete out;
    if (made == nullptr) return;
    treeattn_tree_destroy(tree);
    tree = made;
    heads_q = hq, heads_kv = hkv, head_dim = hd, head_dim_v = hdv > 0 ? hdv : hd;
  }

  treeattn_tree* maybe_tree() { return in.ConsumeIntegralInRange<int>(0, 15) == 0 ? nullptr : tree; }
  treeattn_planner* maybe_planner() { return in.ConsumeIntegralInRange<int>(0, 15) == 0 ? nullptr : planner; }

  // A tensor of [rows, heads, columns] (or [rows, heads] for LSE, [rows] for an
  // options tensor) of a dtype up to `top_dtype`, with up to three faults.
  treeattn_tensor tensor(std::int64_t rows, std::int64_t heads, std::int64_t columns, bool lse,
                         std::int32_t top_dtype = TREEATTN_DTYPE_F32, int ndim = 3) {
    treeattn_tensor t{};
    t.ndim = lse ? 2 : ndim;
    t.shape[0] = rows;
    t.shape[1] = heads;
    t.shape[2] = columns;
    store_raw(t.dtype, lse ? TREEATTN_DTYPE_F32 : in.ConsumeIntegralInRange<std::int32_t>(0, top_dtype));
    for (int faults = in.ConsumeIntegralInRange<int>(0, 3) == 0 ? in.ConsumeIntegralInRange<int>(1, 3) : 0; faults > 0;
         --faults) {
      switch (in.ConsumeIntegralInRange<int>(0, 4)) {
        case 0: store_raw(t.dtype, pick_int32(in, 5)); break;
        case 1: t.ndim = pick_int32(in, 5); break;
        case 2: t.shape[in.ConsumeIntegralInRange<int>(0, 3)] = pick_int(in, 70); break;
        case 3: t.strides[in.ConsumeIntegralInRange<int>(0, 3)] = pick_int(in, 1 << 12); break;
        default:  // a padded row (wrapping: the shape may be faulty already)
          t.strides[0] = std::int64_t(std::uint64_t(t.shape[1]) * std::uint64_t(t.shape[2]) +
                                      in.ConsumeIntegralInRange<std::uint64_t>(0, 64));
          break;
      }
    }
    // The bytes the tensor claims, when they are few: its rows, `strides[0]` apart when strided.
    const int dims = t.ndim < 1 || t.ndim > 4 ? 0 : t.ndim;
    std::int64_t row = 1;
    for (int d = 1; d < dims; ++d) {
      if (t.shape[d] < 0 || t.shape[d] > kMaxTensorBytes || (t.shape[d] != 0 && row > kMaxTensorBytes / t.shape[d])) return t;
      row *= t.shape[d];
    }
    const std::int64_t pitch = t.strides[0] != 0 ? t.strides[0] : row;
    if (dims == 0 || t.shape[0] < 0 || t.shape[0] > kMaxTensorBytes || pitch < 0 || pitch > kMaxTensorBytes) return t;
    const std::int64_t elements = t.shape[0] == 0 ? 0 : (t.shape[0] - 1) * pitch + row;
    if (elements * 4 > kMaxTensorBytes || in.ConsumeIntegralInRange<int>(0, 31) == 0) return t;
    buffers.emplace_back(std::size_t(elements) * 4 + 1);  // +1: never empty, so data is never NULL
    t.data = buffers.back().data();
    return t;
  }

  // NULL, the defaults, or options of any size with edge values and option
  // tensors (of `storage`) that may be missing, short or of another dtype.
  const treeattn_attention_options* attention_options(treeattn_attention_options& o, treeattn_tensor (&storage)[3]) {
    treeattn_attention_options_init(&o);
    switch (in.ConsumeIntegralInRange<int>(0, 3)) {
      case 0: return nullptr;
      case 1: return &o;
      default: break;
    }
    if (in.ConsumeIntegralInRange<int>(0, 3) == 0) o.struct_size = std::size_t(pick_int(in, sizeof o + 8));
    const float values[] = {0.0f, 1.0f, 0.5f, 30.0f, -1.0f, __builtin_nanf(""), __builtin_inff()};
    o.logit_softcap = values[in.ConsumeIntegralInRange<int>(0, 6)];
    o.k_scale = values[in.ConsumeIntegralInRange<int>(0, 6)];
    o.v_scale = values[in.ConsumeIntegralInRange<int>(0, 6)];
    const treeattn_tensor** fields[] = {&o.sinks, &o.k_scales, &o.v_scales};
    const std::int64_t lengths[] = {heads_q, heads_kv, heads_kv};
    for (int i = 0; i < 3; ++i) {
      if (in.ConsumeBool()) continue;
      storage[i] = tensor(lengths[i], 1, 1, false, TREEATTN_DTYPE_F32, 1);
      *fields[i] = &storage[i];
    }
    return &o;
  }

  void run(const treeattn_plan* which) {
    const std::int64_t nq = treeattn_plan_num_queries(which);
    const std::int64_t slots = pick_int(in, 80);
    treeattn_tensor q = tensor(nq, heads_q, head_dim, false), k = tensor(slots, heads_kv, head_dim, false, TREEATTN_DTYPE_FP8_E5M2),
                    v = tensor(slots, heads_kv, head_dim_v, false, TREEATTN_DTYPE_FP8_E5M2),
                    o = tensor(nq, heads_q, head_dim_v, false), lse = tensor(nq, heads_q, 0, true);
    treeattn_tensor* maybe[] = {&q, &k, &v, &o, &lse};
    if (in.ConsumeIntegralInRange<int>(0, 7) == 0) maybe[in.ConsumeIntegralInRange<int>(0, 4)] = nullptr;
    treeattn_attention_options options;
    treeattn_tensor option_tensors[3];
    switch (in.ConsumeIntegralInRange<int>(0, 3)) {
      case 0:
        check(treeattn_run(in.ConsumeIntegralInRange<int>(0, 15) == 0 ? nullptr : context, which, maybe[0], maybe[1],
                           maybe[2], maybe[3], maybe[4]));
        break;
      case 1: check(treeattn_enqueue(context, which, maybe[0], maybe[1], maybe[2], maybe[3], maybe[4], nullptr)); break;
      case 2:
        check(treeattn_run_with(context, which, maybe[0], maybe[1], maybe[2], maybe[3], maybe[4],
                                attention_options(options, option_tensors)));
        break;
      default:
        check(treeattn_enqueue_with(context, which, maybe[0], maybe[1], maybe[2], maybe[3], maybe[4],
                                    attention_options(options, option_tensors), nullptr));
        break;
    }
    buffers.clear();
  }

  void call() {
    switch (in.ConsumeIntegralInRange<int>(0, 17)) {
      case 0: create_tree(); break;
      case 1: {
        const std::vector<std::int64_t> slots = pick_list(in, 80);
        const bool null = in.ConsumeIntegralInRange<int>(0, 15) == 0;
        check(treeattn_tree_add_node(maybe_tree(), pick_int(in, 8), below(pick_int(in, 8)), null ? nullptr : slots.data(),
                                     null ? pick_int(in, 4) : std::int64_t(slots.size())));
        break;
      }
      case 2:
        check(treeattn_tree_add_node_range(maybe_tree(), pick_int(in, 8), below(pick_int(in, 8)), pick_int(in, 80),
                                           pick_int(in, 40)));
        break;
      case 3: {
        const std::vector<std::int64_t> pages = pick_list(in, 8);
        check(treeattn_tree_add_node_pages(maybe_tree(), pick_int(in, 8), below(pick_int(in, 8)), pages.data(),
                                           std::int64_t(pages.size()), pick_int32(in, 16), pick_int32(in, 16)));
        break;
      }
      case 4: check(treeattn_tree_add_query(maybe_tree(), pick_int(in, 8), below(pick_int(in, 40)))); break;
      case 5: {
        treeattn_plan_options o;
        treeattn_plan* made = nullptr;
        check(treeattn_plan_create(context, maybe_tree(), plan_options(o), &made));
        if (made == nullptr) break;
        treeattn_plan_destroy(plan);
        plan = made;
        break;
      }
      case 6: {
        treeattn_plan_options o;
        treeattn_planner* made = nullptr;
        check(treeattn_planner_create(context, maybe_tree(), plan_options(o), &made));
        if (made == nullptr) break;
        treeattn_planner_destroy(planner);
        planner = made;
        step = nullptr;
        break;
      }
      case 7: {
        const std::vector<std::int64_t> slots = pick_list(in, 80);
        check(treeattn_planner_add_node(maybe_planner(), pick_int(in, 8), below(pick_int(in, 8)), slots.data(),
                                        std::int64_t(slots.size())));
        break;
      }
      case 8:
        check(treeattn_planner_add_node_range(maybe_planner(), pick_int(in, 8), below(pick_int(in, 8)), pick_int(in, 80),
                                              pick_int(in, 40)));
        break;
      case 9: {
        const std::vector<std::int64_t> pages = pick_list(in, 8);
        check(treeattn_planner_add_node_pages(maybe_planner(), pick_int(in, 8), below(pick_int(in, 8)), pages.data(),
                                              std::int64_t(pages.size()), pick_int32(in, 16), pick_int32(in, 16)));
        break;
      }
      case 10:
        check(treeattn_planner_append_range(maybe_planner(), pick_int(in, 8), pick_int(in, 80), pick_int(in, 8)));
        break;
      case 11: {
        const std::vector<std::int64_t> pages = pick_list(in, 8);
        check(treeattn_planner_append_pages(maybe_planner(), pick_int(in, 8), pick_int(in, 40), pages.data(),
                                            std::int64_t(pages.size())));
        break;
      }
      case 12: check(treeattn_planner_remove_node(maybe_planner(), pick_int(in, 8))); break;
      case 13: {
        const std::vector<std::int64_t> nodes = pick_list(in, 8);
        std::vector<std::int64_t> upto(nodes.size());
        for (std::int64_t& u : upto) u = below(pick_int(in, 40));
        const bool no_upto = in.ConsumeBool();
        check(treeattn_planner_set_queries(maybe_planner(), nodes.data(), no_upto ? nullptr : upto.data(),
                                           std::int64_t(nodes.size())));
        break;
      }
      case 14: {
        const treeattn_plan* made = nullptr;
        check(treeattn_planner_update(maybe_planner(), in.ConsumeIntegralInRange<int>(0, 15) == 0 ? nullptr : &made));
        if (planner != nullptr) step = made != nullptr ? made : step;  // a failed update leaves the step plan empty
        break;
      }
      case 15: run(in.ConsumeBool() ? plan : step); break;
      case 16: {
        const treeattn_plan* plans[] = {plan, step};
        check(treeattn_context_graph_stable(context, plans, in.ConsumeIntegralInRange<std::int64_t>(-1, 2), 1.0));
        check(treeattn_upload(context, in.ConsumeBool() ? plan : step, nullptr));
        break;
      }
      default: create_context(); break;
    }
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  Handles handles(in);
  treeattn_context_options cpu;
  treeattn_context_options_init(&cpu);
  cpu.backend = TREEATTN_BACKEND_CPU;
  cpu.threads = 1;
  Handles::check(treeattn_context_create(&cpu, &handles.context));
  Handles::check(treeattn_tree_create(handles.heads_q, handles.heads_kv, handles.head_dim, 0.0f, &handles.tree));
  for (int call = 0; call < kMaxCalls && in.remaining_bytes() > 0; ++call) handles.call();
  return 0;
}

// treeattn._core: the C++ API for Python (nanobind). Arrays arrive through
// DLPack (numpy, torch, cupy); python/treeattn/__init__.py allocates outputs
// with the caller's array library and finds the caller's CUDA stream.

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "treeattn/tools.hpp"
#include "treeattn/context.hpp"
#include "treeattn/treeattn.hpp"

namespace nb = nanobind;
using namespace treeattn;

namespace {

// Any DLPack array; tensor_of() takes those whose rows (first dimension) may be
// strided and whose other dimensions are dense, as the engine does.
using Array = nb::ndarray<>;

// A DLPack dtype as numpy names it: float64, int32, bfloat16, bool.
std::string dlpack_name(nb::dlpack::dtype t) {
  static constexpr const char* kCodes[] = {"int", "uint", "float", "opaque", "bfloat", "complex", "bool"};
  if (t.code >= std::size(kCodes)) return "DLPack code " + std::to_string(t.code) + " of " + std::to_string(t.bits) + " bits";
  if (t.code == std::uint8_t(nb::dlpack::dtype_code::Bool)) return "bool";
  return kCodes[t.code] + std::to_string(t.bits);
}

// `takes`: the dtypes the argument takes, for the error (the engine checks
// which of f16, bf16 and f32 fit the call). `bytes_as`: what uint8 elements
// hold (fp8 K and V: the package passes torch's float8 tensors as uint8 views,
// numpy has no fp8), or nothing.
DType dtype_of(const Array& a, const char* name, const char* takes, std::optional<DType> bytes_as) {
  const nb::dlpack::dtype t = a.dtype();
  if (t == nb::dtype<float>()) return DType::f32;
  if (t.code == std::uint8_t(nb::dlpack::dtype_code::Float) && t.bits == 16) return DType::f16;
  if (t.code == std::uint8_t(nb::dlpack::dtype_code::Bfloat) && t.bits == 16) return DType::bf16;
  if (t == nb::dtype<std::uint8_t>() && bytes_as) return *bytes_as;
  throw Error(ErrorCategory::InvalidArgument, std::string(name) + ": dtype must be " + takes + ", got " + dlpack_name(t));
}

TensorRef tensor_of(const Array& a, const char* name, const char* takes = "float16, bfloat16 or float32",
                    std::optional<DType> bytes_as = std::nullopt) {
  TensorRef t;
  t.data = a.data();
  t.dtype = dtype_of(a, name, takes, bytes_as);
  for (std::size_t d = 0; d < a.ndim(); ++d) t.shape.push_back(std::int64_t(a.shape(d)));
  std::int64_t dense = 1;  // elements of one row: each inner dimension must follow the next densely
  for (std::size_t d = a.ndim(); d-- > 1;) {
    if (a.shape(d) > 1 && a.stride(d) != dense) {
      throw Error(ErrorCategory::InvalidArgument,
                  std::string(name) + ": dimension " + std::to_string(d) + " has stride " + std::to_string(a.stride(d)) +
                      ", expected " + std::to_string(dense) + " (only the rows, the first dimension, may be strided)");
    }
    dense *= std::int64_t(a.shape(d));
  }
  if (a.ndim() > 0 && a.shape(0) > 1 && a.stride(0) != dense) {
    if (a.stride(0) < dense) {
      throw Error(ErrorCategory::InvalidArgument, std::string(name) + ": its rows are " + std::to_string(a.stride(0)) +
                                                      " elements apart, fewer than a row's " + std::to_string(dense));
    }
    t.row_stride = a.stride(0);
  }
  return t;
}

// K or V: f16, bf16 or f32, or uint8 fp8 bytes of kv_dtype's kind.
TensorRef kv_tensor_of(const Array& a, const char* name, std::optional<DType> kv_dtype) {
  if (a.dtype() == nb::dtype<std::uint8_t>() && !kv_dtype) {
    throw Error(ErrorCategory::InvalidArgument,
                std::string(name) + ": uint8 elements are fp8 bytes only with kv_dtype='fp8_e4m3' or 'fp8_e5m2'");
  }
  return tensor_of(a, name, "float16, bfloat16 or float32, or uint8 fp8 bytes", kv_dtype);
}

// A plan the Python side holds: its own copy (a planner's next update changes
// the planner's plan in place).
struct PlanHandle {
  Plan plan;
};

// A context, the CUDA device its device arrays must be on, and a lock: a
// Context serves one thread at a time, and Python threads may share one
// (context_for hands out one per device).
struct ContextHandle {
  Context context;
  int cuda_device = 0;
  std::mutex busy;
};

// "fp8_e4m3" or "fp8_e5m2" (the kv_dtype of fp8 bytes), or nothing.
std::optional<DType> kv_dtype_of(const std::optional<std::string>& name) {
  if (!name) return std::nullopt;
  for (DType d : {DType::fp8_e4m3, DType::fp8_e5m2}) {
    if (*name == to_string(d)) return d;
  }
  throw Error(ErrorCategory::InvalidArgument, "kv_dtype '" + *name + "' is not an fp8 kind ('fp8_e4m3' or 'fp8_e5m2')");
}

// The attention variants of one call (AttentionOptions); absent arrays: none.
struct Variants {
  float logit_softcap = 0.0f, k_scale = 1.0f, v_scale = 1.0f;
  std::optional<Array> sinks, k_scales, v_scales;
  std::optional<std::string> kv_dtype;
};

void attention(ContextHandle& ctx, const PlanHandle& plan, const Array& q, const Array& k, const Array& v, const Array& o,
               std::optional<Array> lse, std::uintptr_t stream, const Variants& variants) {
  const std::optional<DType> kv_dtype = kv_dtype_of(variants.kv_dtype);
  AttentionArgs args{tensor_of(q, "q"), kv_tensor_of(k, "k", kv_dtype), kv_tensor_of(v, "v", kv_dtype), tensor_of(o, "out"),
                     lse ? tensor_of(*lse, "lse", "float32") : TensorRef{}};
  for (const auto& [name, t] : {std::pair{"k", &args.k}, std::pair{"v", &args.v}}) {
    if (kv_dtype && t->dtype != *kv_dtype) {
      throw Error(ErrorCategory::InvalidArgument, std::string("kv_dtype='") + to_string(*kv_dtype) +
                                                      "' names uint8 fp8 bytes, but " + name + " is " + to_string(t->dtype));
    }
  }
  args.options.logit_softcap = variants.logit_softcap;
  args.options.k_scale = variants.k_scale;
  args.options.v_scale = variants.v_scale;
  const int device = q.device_type();
  for (const auto& [name, given, ref] : {std::tuple{"sinks", &variants.sinks, &args.options.sinks},
                                         std::tuple{"k_scales", &variants.k_scales, &args.options.k_scales},
                                         std::tuple{"v_scales", &variants.v_scales, &args.options.v_scales}}) {
    if (!*given) continue;
    *ref = tensor_of(**given, name, "float32");
    if ((*given)->device_type() != device) {
      throw Error(ErrorCategory::InvalidArgument, std::string(name) + " must be on q's device (DLPack device types differ)");
    }
  }
  for (const Array* a : {&k, &v, &o}) {
    if (a->device_type() != device) {
      throw Error(ErrorCategory::InvalidArgument, "q, k, v and out must be on one device (DLPack device types differ)");
    }
  }
  if (device == nb::device::cpu::value) {
    nb::gil_scoped_release release;
    const std::lock_guard<std::mutex> lock(ctx.busy);
    ctx.context.run(plan.plan, args);
    return;
  }
  if (device == nb::device::cuda::value && ctx.context.backend() == BackendKind::cuda) {
    if (q.device_id() != ctx.cuda_device) {
      throw Error(ErrorCategory::InvalidArgument, "arrays on CUDA device " + std::to_string(q.device_id()) +
                                                      ", the context runs on device " + std::to_string(ctx.cuda_device));
    }
    const std::lock_guard<std::mutex> lock(ctx.busy);
    ctx.context.enqueue(plan.plan, args, reinterpret_cast<CUstream_st*>(stream));
    return;
  }
  throw Error(ErrorCategory::InvalidArgument,
              "arrays on DLPack device type " + std::to_string(device) + ": a " + to_string(ctx.context.backend()) +
                  " context runs host arrays" + (ctx.context.backend() == BackendKind::cuda ? " and CUDA arrays" : ""));
}

PlanOptions plan_options(const std::string& strategy, std::optional<int> block_tokens, std::optional<int> window,
                         const std::optional<std::string>& kv_dtype) {
  PlanOptions options;
  options.strategy = parse_strategy(strategy);
  options.block_tokens = block_tokens.value_or(kAutoBlockTokens);
  options.window = window.value_or(0);  // a negative one is refused by the planner, by name
  options.kv_dtype = kv_dtype_of(kv_dtype).value_or(DType::f16);
  return options;
}

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "treeattn's C++ engine (use the treeattn package)";
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      switch (e.category()) {
        case ErrorCategory::InvalidTree:
        case ErrorCategory::InvalidArgument:
        case ErrorCategory::InvalidPlan: PyErr_SetString(PyExc_ValueError, e.what()); break;
        case ErrorCategory::Io: PyErr_SetString(PyExc_OSError, e.what()); break;
        case ErrorCategory::Backend: PyErr_SetString(PyExc_RuntimeError, e.what()); break;
        case ErrorCategory::OutOfMemory: PyErr_SetString(PyExc_MemoryError, e.what()); break;
      }
    }
  });

  nb::class_<Tree>(m, "Tree")
      .def("__init__",
           [](Tree* t, int heads_q, int heads_kv, int head_dim, std::optional<float> scale, std::optional<int> head_dim_v) {
             new (t) Tree(HeadConfig{heads_q, heads_kv, head_dim, scale.value_or(0.0f), head_dim_v.value_or(0)});
           },
           nb::arg("heads_q"), nb::arg("heads_kv"), nb::arg("head_dim"), nb::arg("scale") = nb::none(),
           nb::arg("head_dim_v") = nb::none())
      .def("add_node", &Tree::add_node, nb::arg("id"), nb::arg("parent"), nb::arg("slots"))
      .def("add_node_range", &Tree::add_node_range, nb::arg("id"), nb::arg("parent"), nb::arg("first_slot"),
           nb::arg("count"))
      .def("add_node_pages", &Tree::add_node_pages, nb::arg("id"), nb::arg("parent"), nb::arg("pages"),
           nb::arg("page_size"), nb::arg("last_page_tokens"))
      .def("add_query",
           [](Tree& t, std::int64_t node, std::optional<std::int64_t> upto) { t.add_query(node, upto.value_or(kWholeNode)); },
           nb::arg("node"), nb::arg("upto") = nb::none())
      .def_prop_ro("num_nodes", &Tree::node_count)
      .def_prop_ro("num_queries", &Tree::query_count)
      .def_prop_ro("heads", [](const Tree& t) { return nb::make_tuple(t.heads.heads_q, t.heads.heads_kv, t.heads.head_dim); })
      .def_prop_ro("head_dim_v", [](const Tree& t) { return t.heads.value_dim(); })
      .def_static(
          "from_json",
          [](nb::handle source) {
            // A dict (the parsed JSON), JSON text, or a path (str or os.PathLike).
            if (nb::isinstance<nb::dict>(source)) {
              return parse_tree_json(nb::cast<std::string>(nb::module_::import_("json").attr("dumps")(source)), "tree dict");
            }
            const std::string text = nb::cast<std::string>(nb::module_::import_("os").attr("fspath")(source));
            const std::size_t first = text.find_first_not_of(" \t\r\n");
            if (first != std::string::npos && text[first] == '{') return parse_tree_json(text, "tree JSON");
            return load_tree_json(text);
          },
          nb::arg("source"), "A tree from the CLI's tree JSON: a path, JSON text, or the parsed dict.")
      .def("to_json", &tree_to_json);

  nb::class_<PlanHandle>(m, "Plan", nb::is_weak_referenceable())
      .def_prop_ro("handle", [](const PlanHandle& p) { return p.plan.id; }, "a number naming the plan (the torch op takes it)")
      .def_prop_ro("num_queries", [](const PlanHandle& p) { return p.plan.num_queries; })
      .def_prop_ro("head_dim_v", [](const PlanHandle& p) { return p.plan.heads.value_dim(); }, "columns of V and O")
      .def_prop_ro("num_items", [](const PlanHandle& p) { return p.plan.num_items(); })
      .def_prop_ro("num_partials", [](const PlanHandle& p) { return p.plan.num_partials; })
      .def_prop_ro("block_tokens", [](const PlanHandle& p) { return p.plan.block_tokens; })
      .def_prop_ro("strategy", [](const PlanHandle& p) { return std::string(to_string(p.plan.strategy)); });

  nb::class_<IncrementalPlanner>(m, "_Planner",
                                 "A tree that changes a little every decode step (Context.planner): its changes,\n"
                                 "then update() for the step's plan.")
      .def("add_node", &IncrementalPlanner::add_node, nb::arg("id"), nb::arg("parent"), nb::arg("slots"))
      .def("add_node_range", &IncrementalPlanner::add_node_range, nb::arg("id"), nb::arg("parent"), nb::arg("first_slot"),
           nb::arg("count"))
      .def("add_node_pages", &IncrementalPlanner::add_node_pages, nb::arg("id"), nb::arg("parent"), nb::arg("pages"),
           nb::arg("page_size"), nb::arg("last_page_tokens"))
      .def("append_range", &IncrementalPlanner::append_range, nb::arg("id"), nb::arg("first_slot"), nb::arg("count"))
      .def("append_pages", &IncrementalPlanner::append_pages, nb::arg("id"), nb::arg("count"), nb::arg("new_pages"))
      .def("remove_node", &IncrementalPlanner::remove_node, nb::arg("id"))
      .def("set_queries",
           [](IncrementalPlanner& p, const std::vector<std::pair<std::int64_t, std::optional<std::int64_t>>>& queries) {
             std::vector<TreeQuery> list;
             list.reserve(queries.size());
             for (const auto& [node, upto] : queries) list.push_back(TreeQuery{node, upto.value_or(kWholeNode)});
             p.set_queries(list);
           },
           nb::arg("queries"), "This step's queries: [(node, upto or None), ...]; query i is row i of Q.")
      .def("update",
           [](IncrementalPlanner& p) {
             nb::gil_scoped_release release;
             return PlanHandle{p.update()};
           },
           "Applies the changes; the step's plan (Context.attention takes it).")
      .def_prop_ro("num_nodes", [](const IncrementalPlanner& p) { return p.tree().node_count(); })
      .def_prop_ro("held_layout", [](const IncrementalPlanner& p) { return p.last_update().held_layout; },
                   "whether the last update kept an earlier step's layout (not bitwise a whole-tree plan)");

  nb::class_<ContextHandle>(m, "_Context", nb::is_weak_referenceable())
      .def("__init__",
           [](ContextHandle* c, const std::string& backend, int device, int threads, const std::string& model_cache) {
             ContextOptions options;
             options.backend = parse_backend(backend);
             options.device = device;
             options.cpu.threads = threads;
             options.model_cache_path = model_cache;
             new (c) ContextHandle{Context(options), device < 0 ? 0 : device};
           },
           nb::arg("backend"), nb::arg("device"), nb::arg("threads"), nb::arg("model_cache"))
      .def_prop_ro("backend", [](const ContextHandle& c) { return std::string(to_string(c.context.backend())); })
      .def("plan",
           [](ContextHandle& c, const Tree& tree, const std::string& strategy, std::optional<int> block_tokens,
              std::optional<int> window, std::optional<std::string> kv_dtype) {
             const PlanOptions options = plan_options(strategy, block_tokens, window, kv_dtype);
             nb::gil_scoped_release release;
             return PlanHandle{c.context.plan(tree, options)};
           },
           nb::arg("tree"), nb::arg("strategy") = "flatten", nb::arg("block_tokens") = nb::none(),
           nb::arg("window") = nb::none(), nb::arg("kv_dtype").none() = nb::none())
      .def("planner",
           [](ContextHandle& c, const Tree& tree, const std::string& strategy, std::optional<int> block_tokens,
              bool bitwise_updates, std::optional<int> window, std::optional<std::string> kv_dtype) {
             IncrementalOptions incremental;
             incremental.hold_flatten_blocks = !bitwise_updates;
             incremental.hold_greedy_groups = !bitwise_updates;
             return c.context.planner(tree, plan_options(strategy, block_tokens, window, kv_dtype), incremental);
           },
           nb::arg("tree"), nb::arg("strategy") = "flatten", nb::arg("block_tokens") = nb::none(),
           nb::arg("bitwise_updates") = false, nb::arg("window") = nb::none(), nb::arg("kv_dtype").none() = nb::none())
      .def("_attention",
           [](ContextHandle& c, const PlanHandle& plan, const Array& q, const Array& k, const Array& v, const Array& o,
              std::optional<Array> lse, std::uintptr_t stream, float logit_softcap, float k_scale, float v_scale,
              std::optional<Array> sinks, std::optional<Array> k_scales, std::optional<Array> v_scales,
              std::optional<std::string> kv_dtype) {
             attention(c, plan, q, k, v, o, std::move(lse), stream,
                       Variants{logit_softcap, k_scale, v_scale, std::move(sinks), std::move(k_scales), std::move(v_scales),
                                std::move(kv_dtype)});
           },
           nb::arg("plan"), nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse").none(),
           nb::arg("stream"), nb::arg("logit_softcap") = 0.0f, nb::arg("k_scale") = 1.0f, nb::arg("v_scale") = 1.0f,
           nb::arg("sinks").none() = nb::none(), nb::arg("k_scales").none() = nb::none(),
           nb::arg("v_scales").none() = nb::none(), nb::arg("kv_dtype").none() = nb::none())
      .def("_graph_stable",
           [](ContextHandle& c, const std::vector<const PlanHandle*>& plans, double headroom) {
             std::vector<const Plan*> list;
             for (const PlanHandle* p : plans) list.push_back(&p->plan);
             const std::lock_guard<std::mutex> lock(c.busy);
             c.context.graph_stable(list, headroom);
           },
           nb::arg("plans"), nb::arg("headroom"))
      .def("_upload",
           [](ContextHandle& c, const PlanHandle& plan, std::uintptr_t stream) {
             const std::lock_guard<std::mutex> lock(c.busy);
             c.context.upload(plan.plan, reinterpret_cast<CUstream_st*>(stream));
           },
           nb::arg("plan"), nb::arg("stream"));

  m.attr("__version__") = TREEATTN_VERSION_STRING;
  m.attr("has_cuda") = bool(TREEATTN_HAS_CUDA);
  m.attr("has_vulkan") = bool(TREEATTN_HAS_VULKAN);
}

#pragma once
// treeattn: decode-time attention over a tree of KV cache (DeFT-Flatten).
//
//   treeattn::Tree tree({32, 8, 128});
//   tree.add_node_range(0, treeattn::kNoParent, 0, 4000);   // shared prompt
//   tree.add_node_range(1, 0, 4000, 20);                     // two branches
//   tree.add_node_range(2, 0, 4020, 20);
//   tree.add_query(1);
//   tree.add_query(2);
//   treeattn::Context ctx;                                    // auto: CUDA, then a Vulkan GPU, then the CPU
//   treeattn::Plan plan = ctx.plan(tree);                     // with this device's cost model
//   ctx.run(plan, {q, k, v, o, lse});                         // once per layer (enqueue: device memory)

#include "treeattn/context.hpp"
#include "treeattn/config.h"
#include "treeattn/dtype.hpp"
#include "treeattn/error.hpp"
#include "treeattn/incremental_planner.hpp"
#include "treeattn/log.hpp"
#include "treeattn/plan.hpp"
#include "treeattn/planner.hpp"
#include "treeattn/tensor.hpp"
#include "treeattn/tree.hpp"
#if TREEATTN_HAS_CUDA
#include "treeattn/cuda.hpp"
#endif

#pragma once
// treeattn's tools (library treeattn::tools, beside treeattn::treeattn): what
// the CLI, the tests and the benchmarks use around the engine. .npy and tree
// files, the DESIGN workloads (few-shot, Medusa speculative trees,
// tree-of-thought traces, level shapes, random forests, random arrays), their
// decode-loop scenarios, and a paged KV cache with its sequence tree.

#include "treeattn/kv_cache.hpp"
#include "treeattn/npy.hpp"
#include "treeattn/scenarios.hpp"
#include "treeattn/sequence_tree.hpp"
#include "treeattn/tree_json.hpp"
#include "treeattn/workloads.hpp"

#pragma once
// The tree file of `treeattn run` (docs/cli.md):
//   {"heads_q": 32, "heads_kv": 8, "head_dim": 128, "scale": 0.088,   (scale optional;
//    "head_dim_v": 128,                                              head_dim_v optional: head_dim)
//    "nodes": [{"id": 0, "parent": -1, "slots": [0, 1, 2]},
//              {"id": 1, "parent": 0, "slot_range": [3, 2]}],         ([start, count])
//    "queries": [{"node": 1}, {"node": 0, "upto": 2}]}                 (upto optional)

#include <string>

#include "treeattn/tree.hpp"

namespace treeattn {

// Throws Io for malformed JSON or wrong field types (naming the field, e.g.
// "nodes[3].parent"); the tree itself is validated later by plan().
Tree parse_tree_json(const std::string& text, const std::string& name = "tree JSON");
Tree load_tree_json(const std::string& path);

std::string tree_to_json(const Tree& tree);

}  // namespace treeattn

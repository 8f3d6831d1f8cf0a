/* The C API from C (C11, linked against the shared library): trees by node id
 * with listed and ranged slots and `upto`, every strategy on the CPU backend
 * against a naive attention written here, and every failure path returning its
 * status with a message that names the problem. Prints "N passed, N failed". */

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "treeattn/treeattn.h"

static int g_passed = 0, g_failed = 0;

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (cond) {                                                                \
      ++g_passed;                                                              \
    } else {                                                                   \
      ++g_failed;                                                              \
      fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #cond); \
    }                                                                          \
  } while (0)

/* A failure's status and a message containing `needle`. */
#define CHECK_FAILS(call, status, needle)                                                                  \
  do {                                                                                                     \
    const treeattn_status got_ = (call);                                                                   \
    const char* message_ = treeattn_last_error();                                                          \
    if (got_ == (status) && strstr(message_, (needle)) != NULL) {                                          \
      ++g_passed;                                                                                          \
    } else {                                                                                               \
      ++g_failed;                                                                                          \
      fprintf(stderr, "%s:%d: %s gave status %d, message \"%s\"; expected %d and \"%s\"\n", __FILE__, __LINE__, \
              #call, (int)got_, message_, (int)(status), (needle));                                        \
    }                                                                                                      \
  } while (0)

enum { HQ = 4, HKV = 2, D = 64, SLOTS = 64 };

/* The tree: root id 100 (slots 0..29, ranged), child 7 (slots 40, 35, 36, listed),
 * child 9 under 7 (slots 50..53, on pages 25 and 26 of 2 slots); queries on 7, on 9,
 * and on 9 up to its 2nd token. */
static const int64_t kPath0[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21,
                                 22, 23, 24, 25, 26, 27, 28, 29, 40, 35, 36};
static const int kQueryTokens[3] = {33, 37, 35};
static const int64_t kTail[] = {50, 51, 52, 53};

static int64_t path_slot(int t) { return t < 33 ? kPath0[t] : kTail[t - 33]; }

static float f16_to_float(uint16_t h) {
  const uint32_t sign = (uint32_t)(h >> 15) << 31, exponent = (h >> 10) & 31, mantissa = h & 1023;
  uint32_t bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else { /* subnormal */
      float value = ldexpf((float)mantissa, -24);
      return sign ? -value : value;
    }
  } else if (exponent == 31) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else {
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

static uint16_t float_to_f16(float f) { /* values in (-2, 2), round to nearest */
  uint32_t bits;
  memcpy(&bits, &f, 4);
  const uint16_t sign = (uint16_t)((bits >> 16) & 0x8000);
  const float a = fabsf(f);
  if (a < 6.103515625e-05f) return (uint16_t)(sign | (uint16_t)lrintf(a / 5.9604644775390625e-08f));
  int e;
  const float m = frexpf(a, &e); /* a = m * 2^e, m in [0.5, 1) */
  long q = lrintf((m * 2.0f - 1.0f) * 1024.0f);
  int exponent = e - 1 + 15;
  if (q == 1024) {
    q = 0;
    ++exponent;
  }
  return (uint16_t)(sign | (uint16_t)(exponent << 10) | (uint16_t)q);
}

static treeattn_tensor tensor(void* data, treeattn_dtype dtype, int ndim, int64_t a, int64_t b, int64_t c) {
  treeattn_tensor t;
  memset(&t, 0, sizeof t);
  t.data = data;
  t.dtype = dtype;
  t.ndim = ndim;
  t.shape[0] = a;
  t.shape[1] = b;
  t.shape[2] = c;
  return t;
}

/* An fp8 e4m3 (float8_e4m3fn) code's value. */
static double e4m3_to_double(uint8_t b) {
  const int exponent = (b >> 3) & 15, mantissa = b & 7;
  const double magnitude = exponent == 0 ? ldexp(mantissa, -9) : ldexp(1.0 + mantissa / 8.0, exponent - 7);
  return (b & 0x80) ? -magnitude : magnitude;
}

/* Element i of K or V: f16, or (with per-KV-head scales) e4m3 times its head's scale. */
static double kv_value(const void* data, const float* scales, int64_t i, int dim) {
  if (scales == NULL) return f16_to_float(((const uint16_t*)data)[i]);
  return e4m3_to_double(((const uint8_t*)data)[i]) * scales[(i / dim) % HKV];
}

/* The naive attention of the tree's queries, in double: each query's path,
 * scores soft-capped at `cap` (0: not), a sink per query head in the softmax
 * (sinks NULL: none). Q [3, HQ, d] f16; K [SLOTS, HKV, d] and V [SLOTS, HKV, dv]. */
static void reference(int d, int dv, const uint16_t* q, const void* k, const void* v, const float* k_scales,
                      const float* v_scales, const float* sinks, double cap, double* want_o, double* want_lse) {
  const double scale = 1.0 / sqrt((double)d);
  for (int query = 0; query < 3; ++query) {
    for (int h = 0; h < HQ; ++h) {
      const int kv = h / (HQ / HKV);
      double scores[40], max = sinks ? sinks[h] : -INFINITY;
      for (int t = 0; t < kQueryTokens[query]; ++t) {
        const int64_t row = path_slot(t) * HKV + kv;
        double s = 0.0;
        for (int c = 0; c < d; ++c) s += f16_to_float(q[(query * HQ + h) * d + c]) * kv_value(k, k_scales, row * d + c, d);
        scores[t] = cap != 0.0 ? cap * tanh(s * scale / cap) : s * scale;
        if (scores[t] > max) max = scores[t];
      }
      double acc[256] = {0}, sum = sinks ? exp(sinks[h] - max) : 0.0;
      for (int t = 0; t < kQueryTokens[query]; ++t) {
        const double p = exp(scores[t] - max);
        const int64_t row = path_slot(t) * HKV + kv;
        sum += p;
        for (int c = 0; c < dv; ++c) acc[c] += p * kv_value(v, v_scales, row * dv + c, dv);
      }
      for (int c = 0; c < dv; ++c) want_o[(query * HQ + h) * dv + c] = acc[c] / sum;
      want_lse[query * HQ + h] = max + log(sum);
    }
  }
}

/* Max |got - want| over O (n values) and LSE (3 * HQ). */
static double worst_error(const float* o, const double* want_o, int n, const float* lse, const double* want_lse) {
  double worst = 0.0;
  for (int i = 0; i < n; ++i) worst = fmax(worst, fabs(o[i] - want_o[i]));
  for (int i = 0; i < 3 * HQ; ++i) worst = fmax(worst, fabs(lse[i] - want_lse[i]));
  return worst;
}

static unsigned g_seed = 12345u;
static unsigned next_random(void) { return (g_seed = g_seed * 1103515245u + 12345u) >> 16; }
static uint16_t random_f16(void) { return float_to_f16((float)(next_random() & 2047) / 1024.0f - 1.0f); }

static void fill_f16(uint16_t* a, size_t n) {
  for (size_t i = 0; i < n; ++i) a[i] = random_f16();
}

/* Random f16 Q [3, HQ, d], K [SLOTS, HKV, d] and V [SLOTS, HKV, dv], and their plain attention. */
static void random_inputs(int d, int dv, uint16_t* q, uint16_t* k, uint16_t* v, double* want_o, double* want_lse) {
  fill_f16(q, (size_t)(3 * HQ * d));
  fill_f16(k, (size_t)(SLOTS * HKV * d));
  fill_f16(v, (size_t)(SLOTS * HKV * dv));
  reference(d, dv, q, k, v, NULL, NULL, NULL, 0.0, want_o, want_lse);
}

/* The tree's nodes and queries, into a tree of any heads. */
static void add_nodes_and_queries(treeattn_tree* tree) {
  const int64_t listed[] = {40, 35, 36};
  CHECK(treeattn_tree_add_node(tree, 7, 100, listed, 3) == TREEATTN_OK); /* before its parent: fine */
  CHECK(treeattn_tree_add_node_range(tree, 100, -1, 0, 30) == TREEATTN_OK);
  const int64_t pages[] = {25, 26}; /* pages of 2 slots: 50, 51 and 52, 53 */
  CHECK(treeattn_tree_add_node_pages(tree, 9, 7, pages, 2, 2, 2) == TREEATTN_OK);
  CHECK(treeattn_tree_add_query(tree, 7, -1) == TREEATTN_OK);
  CHECK(treeattn_tree_add_query(tree, 9, -1) == TREEATTN_OK);
  CHECK(treeattn_tree_add_query(tree, 9, 2) == TREEATTN_OK);
}

static treeattn_tree* build_tree(void) {
  treeattn_tree* tree = NULL;
  CHECK(treeattn_tree_create(HQ, HKV, D, 0.0f, &tree) == TREEATTN_OK);
  add_nodes_and_queries(tree);
  return tree;
}

/* fp8 e4m3 K and V with per-KV-head scales, sinks and a soft-cap through
 * treeattn_run_with on the tree's plan; then the options' failures. */
static void test_variants(treeattn_context* context, const treeattn_plan* plan, const treeattn_tensor* tq,
                          const treeattn_tensor* to, const treeattn_tensor* tl) {
  static uint8_t k8[SLOTS * HKV * D], v8[SLOTS * HKV * D];
  for (size_t i = 0; i < sizeof k8; ++i) k8[i] = (uint8_t)(next_random() & 0xf7); /* 0xf7: never the NaN code 0x7f */
  for (size_t i = 0; i < sizeof v8; ++i) v8[i] = (uint8_t)(next_random() & 0xf7);
  float k_scales[HKV] = {0.004f, 0.003f}, v_scales[HKV] = {0.002f, 0.005f}, sinks[HQ] = {0.5f, -1.0f, 2.0f, 0.0f};
  const uint16_t* q = (const uint16_t*)tq->data;
  static double want_o[3 * HQ * D], want_lse[3 * HQ];
  reference(D, D, q, k8, v8, k_scales, v_scales, sinks, 3.0, want_o, want_lse);

  const treeattn_tensor tk = tensor(k8, TREEATTN_DTYPE_FP8_E4M3, 3, SLOTS, HKV, D);
  const treeattn_tensor tv = tensor(v8, TREEATTN_DTYPE_FP8_E4M3, 3, SLOTS, HKV, D);
  const treeattn_tensor tk_scales = tensor(k_scales, TREEATTN_DTYPE_F32, 1, HKV, 0, 0);
  const treeattn_tensor tv_scales = tensor(v_scales, TREEATTN_DTYPE_F32, 1, HKV, 0, 0);
  const treeattn_tensor tsinks = tensor(sinks, TREEATTN_DTYPE_F32, 1, HQ, 0, 0);
  treeattn_attention_options options;
  treeattn_attention_options_init(&options);
  CHECK(options.k_scale == 1.0f && options.v_scale == 1.0f && options.logit_softcap == 0.0f && options.sinks == NULL);
  options.logit_softcap = 3.0f;
  options.sinks = &tsinks;
  options.k_scales = &tk_scales;
  options.v_scales = &tv_scales;
  memset(to->data, 0, 3 * HQ * D * sizeof(float));
  CHECK(treeattn_run_with(context, plan, tq, &tk, &tv, to, tl, &options) == TREEATTN_OK);
  const double worst = worst_error((const float*)to->data, want_o, 3 * HQ * D, (const float*)tl->data, want_lse);
  if (!(worst <= 2e-3)) fprintf(stderr, "variants: max abs error %g\n", worst);
  CHECK(worst <= 2e-3);

  const treeattn_tensor short_sinks = tensor(sinks, TREEATTN_DTYPE_F32, 1, HQ - 1, 0, 0);
  options.sinks = &short_sinks;
  CHECK_FAILS(treeattn_run_with(context, plan, tq, &tk, &tv, to, NULL, &options), TREEATTN_ERROR_INVALID_ARGUMENT,
              "sinks is [3] f32, expected [4] (heads_q)");
  const treeattn_tensor f16_sinks = tensor(sinks, TREEATTN_DTYPE_F16, 1, HQ, 0, 0);
  options.sinks = &f16_sinks;
  CHECK_FAILS(treeattn_run_with(context, plan, tq, &tk, &tv, to, NULL, &options), TREEATTN_ERROR_INVALID_ARGUMENT,
              "sinks must be f32, got f16");
  const treeattn_tensor short_scales = tensor(k_scales, TREEATTN_DTYPE_F32, 1, HKV - 1, 0, 0);
  options.sinks = NULL;
  options.k_scales = &short_scales;
  CHECK_FAILS(treeattn_run_with(context, plan, tq, &tk, &tv, to, NULL, &options), TREEATTN_ERROR_INVALID_ARGUMENT,
              "k_scales is [1] f32, expected [2] (heads_kv)");
  const treeattn_tensor f16_scales = tensor(v_scales, TREEATTN_DTYPE_F16, 1, HKV, 0, 0);
  options.k_scales = &tk_scales;
  options.v_scales = &f16_scales;
  CHECK_FAILS(treeattn_run_with(context, plan, tq, &tk, &tv, to, NULL, &options), TREEATTN_ERROR_INVALID_ARGUMENT,
              "v_scales must be f32, got f16");
  options.v_scales = &tv_scales;
  const treeattn_tensor no_data = tensor(NULL, TREEATTN_DTYPE_F32, 1, HKV, 0, 0);
  options.k_scales = &no_data;
  CHECK_FAILS(treeattn_run_with(context, plan, tq, &tk, &tv, to, NULL, &options), TREEATTN_ERROR_INVALID_ARGUMENT,
              "k_scales has no data (pass NULL for none)");
  options.k_scales = &tk_scales;
  options.logit_softcap = -1.0f;
  CHECK_FAILS(treeattn_run_with(context, plan, tq, &tk, &tv, to, NULL, &options), TREEATTN_ERROR_INVALID_ARGUMENT,
              "logit_softcap = -1 must be finite and not negative");
  options.logit_softcap = 0.0f;
  static uint16_t v16[SLOTS * HKV * D];
  const treeattn_tensor f16_v = tensor(v16, TREEATTN_DTYPE_F16, 3, SLOTS, HKV, D);
  CHECK_FAILS(treeattn_run_with(context, plan, tq, &tk, &f16_v, to, NULL, &options), TREEATTN_ERROR_INVALID_ARGUMENT,
              "K and V must both be fp8 of one kind, got K fp8_e4m3 and V f16");
  const treeattn_tensor e5m2_v = tensor(v8, TREEATTN_DTYPE_FP8_E5M2, 3, SLOTS, HKV, D);
  CHECK_FAILS(treeattn_run_with(context, plan, tq, &tk, &e5m2_v, to, NULL, &options), TREEATTN_ERROR_INVALID_ARGUMENT,
              "K and V must both be fp8 of one kind, got K fp8_e4m3 and V fp8_e5m2");
  options.struct_size = 5;
  CHECK_FAILS(treeattn_run_with(context, plan, tq, &tk, &tv, to, NULL, &options), TREEATTN_ERROR_INVALID_ARGUMENT,
              "treeattn_attention_options.struct_size is 5");
  CHECK_FAILS(treeattn_enqueue_with(context, plan, tq, &tk, &tv, to, NULL, NULL, NULL), TREEATTN_ERROR_INVALID_ARGUMENT,
              "this context runs the cpu backend: use treeattn_run");
}

/* A tree of one node and query with these heads: created, then refused by
 * treeattn_plan_create with `needle` (the head dims are checked when planned). */
static void expect_plan_refuses_heads(treeattn_context* context, const treeattn_tree_options* options, const char* needle) {
  treeattn_tree* tree = NULL;
  treeattn_plan* plan = NULL;
  CHECK(treeattn_tree_create_with(options, &tree) == TREEATTN_OK);
  CHECK(treeattn_tree_add_node_range(tree, 1, -1, 0, 10) == TREEATTN_OK);
  CHECK(treeattn_tree_add_query(tree, 1, -1) == TREEATTN_OK);
  CHECK_FAILS(treeattn_plan_create(context, tree, NULL, &plan), TREEATTN_ERROR_INVALID_TREE, needle);
  treeattn_tree_destroy(tree);
}

/* A tree of 192-column Q and K and 128-column V and O (treeattn_tree_create_with). */
static void test_head_dim_v(treeattn_context* context) {
  enum { DQK = 192, DV = 128 };
  static uint16_t q[3 * HQ * DQK], k[SLOTS * HKV * DQK], v[SLOTS * HKV * DV];
  static double want_o[3 * HQ * DV], want_lse[3 * HQ];
  random_inputs(DQK, DV, q, k, v, want_o, want_lse);

  treeattn_tree_options tree_options;
  treeattn_tree_options_init(&tree_options);
  CHECK(tree_options.struct_size == sizeof tree_options && tree_options.head_dim_v == 0 && tree_options.scale == 0.0f);
  tree_options.heads_q = HQ;
  tree_options.heads_kv = HKV;
  tree_options.head_dim = DQK;
  tree_options.head_dim_v = DV;
  treeattn_tree* tree = NULL;
  CHECK(treeattn_tree_create_with(&tree_options, &tree) == TREEATTN_OK);
  add_nodes_and_queries(tree);
  treeattn_plan* plan = NULL;
  CHECK(treeattn_plan_create(context, tree, NULL, &plan) == TREEATTN_OK);
  static float o[3 * HQ * DV], lse[3 * HQ];
  const treeattn_tensor tq = tensor(q, TREEATTN_DTYPE_F16, 3, 3, HQ, DQK);
  const treeattn_tensor tk = tensor(k, TREEATTN_DTYPE_F16, 3, SLOTS, HKV, DQK);
  const treeattn_tensor tv = tensor(v, TREEATTN_DTYPE_F16, 3, SLOTS, HKV, DV);
  const treeattn_tensor to = tensor(o, TREEATTN_DTYPE_F32, 3, 3, HQ, DV);
  const treeattn_tensor tl = tensor(lse, TREEATTN_DTYPE_F32, 2, 3, HQ, 0);
  CHECK(treeattn_run_with(context, plan, &tq, &tk, &tv, &to, &tl, NULL) == TREEATTN_OK);
  const double worst = worst_error(o, want_o, 3 * HQ * DV, lse, want_lse);
  if (!(worst <= 2e-3)) fprintf(stderr, "head_dim_v: max abs error %g\n", worst);
  CHECK(worst <= 2e-3);
  CHECK_FAILS(treeattn_run(context, plan, &tq, &tk, &tk, &to, NULL), TREEATTN_ERROR_INVALID_ARGUMENT,
              "expected [64, 2, 128] (K's slots, heads_kv, head_dim_v)");
  treeattn_plan_destroy(plan);
  treeattn_tree_destroy(tree);

  treeattn_tree* bad = NULL;
  tree_options.head_dim_v = -2;
  CHECK_FAILS(treeattn_tree_create_with(&tree_options, &bad), TREEATTN_ERROR_INVALID_TREE, "head_dim_v -2 must be positive");
  tree_options.head_dim_v = 64;
  expect_plan_refuses_heads(context, &tree_options, "head_dim = 192 with head_dim_v = 64 is not supported");
  tree_options.head_dim = 80;
  tree_options.head_dim_v = 0;
  expect_plan_refuses_heads(context, &tree_options,
                            "head_dim = 80 is not supported (supported: 64, 96, 128, 256; or head_dim 192 with head_dim_v 128)");
  CHECK_FAILS(treeattn_tree_create_with(NULL, &bad), TREEATTN_ERROR_INVALID_ARGUMENT, "options is NULL");
}

/* A program compiled against an older header, whose treeattn_attention_options
 * ended at v_scale (its sizeof padded to 24 bytes): treeattn_attention_options_init,
 * the header's macro, passes that sizeof to treeattn_attention_options_init_sized,
 * so the library writes none of the bytes after the program's struct, and a call
 * reads the fields up to v_scale (not the padding) and the defaults of the rest. */
typedef struct older_attention_options {
  size_t struct_size;
  float logit_softcap;
  float k_scale;
  float v_scale;
} older_attention_options;

static void test_older_struct(treeattn_context* context, const treeattn_plan* plan, const treeattn_tensor* tq,
                              const treeattn_tensor* tk, const treeattn_tensor* tv, const treeattn_tensor* to) {
  union {
    older_attention_options older;
    unsigned char bytes[sizeof(treeattn_attention_options) + 16];
  } memory;
  treeattn_attention_options_init(NULL); /* the macro takes a literal NULL: nothing to fill */
  treeattn_plan_options_init_sized(NULL, sizeof(treeattn_plan_options));
  memset(memory.bytes, 0xAB, sizeof memory.bytes);
  treeattn_attention_options_init_sized((treeattn_attention_options*)&memory.older, sizeof memory.older);
  CHECK(memory.older.struct_size == sizeof memory.older && memory.older.k_scale == 1.0f && memory.older.v_scale == 1.0f &&
        memory.older.logit_softcap == 0.0f);
  int untouched = 1;
  for (size_t i = sizeof memory.older; i < sizeof memory.bytes; ++i) untouched = untouched && memory.bytes[i] == 0xAB;
  CHECK(untouched);
  memory.older.logit_softcap = -2.0f; /* read from the older struct: refused by name */
  CHECK_FAILS(treeattn_run_with(context, plan, tq, tk, tv, to, NULL, (const treeattn_attention_options*)&memory.older),
              TREEATTN_ERROR_INVALID_ARGUMENT, "logit_softcap = -2");
  memory.older.logit_softcap = 0.0f; /* the fields after it are not read: the bytes there are 0xAB */
  CHECK(treeattn_run_with(context, plan, tq, tk, tv, to, NULL, (const treeattn_attention_options*)&memory.older) ==
        TREEATTN_OK);
  /* A struct larger than the library's (a newer header): zeroed past it, then refused naming its size. */
  unsigned char newer[sizeof(treeattn_attention_options) + 8];
  memset(newer, 0xAB, sizeof newer);
  treeattn_attention_options_init_sized((treeattn_attention_options*)newer, sizeof newer);
  CHECK(newer[sizeof newer - 1] == 0);
  CHECK_FAILS(treeattn_run_with(context, plan, tq, tk, tv, to, NULL, (const treeattn_attention_options*)newer),
              TREEATTN_ERROR_INVALID_ARGUMENT, "treeattn_attention_options.struct_size is");
}

int main(void) {
  printf("test_c_api: treeattn %s\n", treeattn_version_string());
  CHECK(strcmp(treeattn_version_string(), TREEATTN_VERSION_STRING) == 0);

  /* Inputs: Q [3, HQ, D], K and V [SLOTS, HKV, D], f16. */
  static uint16_t q[3 * HQ * D], k[SLOTS * HKV * D], v[SLOTS * HKV * D];
  static double want_o[3 * HQ * D], want_lse[3 * HQ];
  random_inputs(D, D, q, k, v, want_o, want_lse);

  treeattn_tree* tree = build_tree();
  treeattn_context_options context_options;
  treeattn_context_options_init(&context_options);
  context_options.backend = TREEATTN_BACKEND_CPU;
  context_options.threads = 2;
  treeattn_context* context = NULL;
  CHECK(treeattn_context_create(&context_options, &context) == TREEATTN_OK);
  CHECK(strcmp(treeattn_context_backend(context), "cpu") == 0);

  static float o[3 * HQ * D], lse[3 * HQ];
  const treeattn_tensor tq = tensor(q, TREEATTN_DTYPE_F16, 3, 3, HQ, D);
  const treeattn_tensor tk = tensor(k, TREEATTN_DTYPE_F16, 3, SLOTS, HKV, D);
  const treeattn_tensor tv = tensor(v, TREEATTN_DTYPE_F16, 3, SLOTS, HKV, D);
  const treeattn_tensor to = tensor(o, TREEATTN_DTYPE_F32, 3, 3, HQ, D);
  const treeattn_tensor tl = tensor(lse, TREEATTN_DTYPE_F32, 2, 3, HQ, 0);
  const treeattn_strategy strategies[] = {TREEATTN_STRATEGY_FLATTEN, TREEATTN_STRATEGY_NODE,     TREEATTN_STRATEGY_NODE_CHUNK,
                                          TREEATTN_STRATEGY_SEQUENCE, TREEATTN_STRATEGY_CASCADE, TREEATTN_STRATEGY_GREEDY};
  for (int s = 0; s < 6; ++s) {
    for (int block = 0; block <= 16; block += 16) { /* auto, and 16-token blocks */
      treeattn_plan_options plan_options;
      treeattn_plan_options_init(&plan_options);
      plan_options.strategy = strategies[s];
      plan_options.block_tokens = block;
      treeattn_plan* plan = NULL;
      CHECK(treeattn_plan_create(context, tree, &plan_options, &plan) == TREEATTN_OK);
      CHECK(treeattn_plan_num_queries(plan) == 3);
      memset(o, 0, sizeof o);
      CHECK(treeattn_run(context, plan, &tq, &tk, &tv, &to, &tl) == TREEATTN_OK);
      const double worst = worst_error(o, want_o, 3 * HQ * D, lse, want_lse);
      if (!(worst <= 2e-3)) fprintf(stderr, "strategy %d, block %d: max abs error %g\n", s, block, worst);
      CHECK(worst <= 2e-3);
      treeattn_plan_destroy(plan);
    }
  }

  /* A plan made with NULL options, and LSE left out. */
  treeattn_plan* plan = NULL;
  CHECK(treeattn_plan_create(context, tree, NULL, &plan) == TREEATTN_OK);
  CHECK(treeattn_run(context, plan, &tq, &tk, &tv, &to, NULL) == TREEATTN_OK);

  /* Failures: each status, each message naming the problem; nothing crashes. */
  treeattn_tree* bad = NULL;
  CHECK_FAILS(treeattn_tree_create(6, 4, D, 0.0f, &bad), TREEATTN_ERROR_INVALID_TREE, "heads_q a multiple of heads_kv");
  CHECK(bad == NULL);
  CHECK_FAILS(treeattn_tree_create(4, 0, D, 0.0f, &bad), TREEATTN_ERROR_INVALID_TREE, "heads_kv 0");
  CHECK_FAILS(treeattn_tree_create(4, 2, D, 0.0f, NULL), TREEATTN_ERROR_INVALID_ARGUMENT, "out is NULL");
  CHECK(treeattn_tree_create(HQ, HKV, D, 0.0f, &bad) == TREEATTN_OK);
  CHECK(treeattn_tree_add_node_range(bad, 1, -1, 0, 10) == TREEATTN_OK);
  CHECK(treeattn_tree_add_node_range(bad, 2, 5, 10, 10) == TREEATTN_OK); /* parent 5 never comes */
  CHECK(treeattn_tree_add_query(bad, 2, -1) == TREEATTN_OK);
  treeattn_plan* bad_plan = NULL;
  CHECK_FAILS(treeattn_plan_create(context, bad, NULL, &bad_plan), TREEATTN_ERROR_INVALID_TREE,
              "node 2 (nodes[1]): parent 5 is not a node id");
  CHECK(bad_plan == NULL);
  treeattn_tree_destroy(bad);
  CHECK_FAILS(treeattn_tree_add_node(NULL, 1, -1, NULL, 0), TREEATTN_ERROR_INVALID_ARGUMENT, "tree is NULL");
  CHECK_FAILS(treeattn_tree_add_node(tree, 11, 9, NULL, 3), TREEATTN_ERROR_INVALID_ARGUMENT, "slots is NULL");
  CHECK_FAILS(treeattn_tree_add_node_pages(tree, 11, 9, NULL, 2, 16, 3), TREEATTN_ERROR_INVALID_ARGUMENT, "pages is NULL");

  const treeattn_tensor short_q = tensor(q, TREEATTN_DTYPE_F16, 3, 2, HQ, D);
  CHECK_FAILS(treeattn_run(context, plan, &short_q, &tk, &tv, &to, NULL), TREEATTN_ERROR_INVALID_ARGUMENT,
              "Q is [2, 4, 64] f16, expected [3, 4, 64]");
  const treeattn_tensor short_k = tensor(k, TREEATTN_DTYPE_F16, 3, 40, HKV, D);
  CHECK_FAILS(treeattn_run(context, plan, &tq, &short_k, &tv, &to, NULL), TREEATTN_ERROR_INVALID_ARGUMENT,
              "K has 40 slots but the tree reads slot 53");
  treeattn_tensor strided_k = tk;
  strided_k.strides[0] = HKV * D;
  strided_k.strides[1] = D + 1;
  strided_k.strides[2] = 1;
  CHECK_FAILS(treeattn_run(context, plan, &tq, &strided_k, &tv, &to, NULL), TREEATTN_ERROR_INVALID_ARGUMENT,
              "k: strides[1] is 65, expected 64");
  CHECK_FAILS(treeattn_run(context, plan, NULL, &tk, &tv, &to, NULL), TREEATTN_ERROR_INVALID_ARGUMENT, "q is NULL");
  CHECK_FAILS(treeattn_run(context, NULL, &tq, &tk, &tv, &to, NULL), TREEATTN_ERROR_INVALID_ARGUMENT, "plan is NULL");
  CHECK_FAILS(treeattn_enqueue(context, plan, &tq, &tk, &tv, &to, NULL, NULL), TREEATTN_ERROR_INVALID_ARGUMENT,
              "this context runs the cpu backend: use treeattn_run");
  treeattn_plan_options wrong_size;
  treeattn_plan_options_init(&wrong_size);
  wrong_size.struct_size = 3;
  CHECK_FAILS(treeattn_plan_create(context, tree, &wrong_size, &bad_plan), TREEATTN_ERROR_INVALID_ARGUMENT,
              "treeattn_plan_options.struct_size is 3");
  treeattn_plan_options bad_strategy;
  treeattn_plan_options_init(&bad_strategy);
  bad_strategy.strategy = (treeattn_strategy)42;
  CHECK_FAILS(treeattn_plan_create(context, tree, &bad_strategy, &bad_plan), TREEATTN_ERROR_INVALID_ARGUMENT,
              "strategy is 42");
  treeattn_context_options no_gpu;
  treeattn_context_options_init(&no_gpu);
  no_gpu.backend = (treeattn_backend)9;
  treeattn_context* bad_context = NULL;
  CHECK_FAILS(treeattn_context_create(&no_gpu, &bad_context), TREEATTN_ERROR_INVALID_ARGUMENT, "backend is 9");
  CHECK(treeattn_plan_create(context, tree, NULL, &bad_plan) == TREEATTN_OK);
  CHECK(strcmp(treeattn_last_error(), "") == 0); /* a success clears the message */
  treeattn_plan_destroy(bad_plan);

  test_variants(context, plan, &tq, &to, &tl);
  test_head_dim_v(context);
  test_older_struct(context, plan, &tq, &tk, &tv, &to);

  treeattn_plan_destroy(plan);
  treeattn_context_destroy(context);
  treeattn_tree_destroy(tree);
  treeattn_tree_destroy(NULL); /* destroying NULL does nothing */
  printf("%d passed, %d failed\n", g_passed, g_failed);
  return g_failed == 0 ? 0 : 1;
}

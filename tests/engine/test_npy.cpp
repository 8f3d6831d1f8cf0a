// .npy files: round trips for every dtype and rank, NumPy's header variants,
// and precise errors for what we do not read.

#include <doctest/doctest.h>

#include <cstdio>

#include "treeattn/error.hpp"
#include "treeattn/npy.hpp"
#include "treeattn/workloads.hpp"

using namespace treeattn;

namespace {

std::string npy_with_header(const std::string& dict, std::size_t data_bytes, char major = 1) {
  std::string header = dict;
  while ((10 + header.size() + 1) % 64 != 0) header.push_back(' ');
  header.push_back('\n');
  std::string out("\x93NUMPY", 6);
  out.push_back(major);
  out.push_back('\0');
  if (major == 1) {
    out.push_back(char(header.size() & 0xff));
    out.push_back(char(header.size() >> 8));
  } else {
    for (int i = 0; i < 4; ++i) out.push_back(char((header.size() >> (8 * i)) & 0xff));
  }
  return out + header + std::string(data_bytes, '\0');
}

void expect_io_error(const std::string& bytes, const char* fragment) {
  try {
    (void)parse_npy(bytes, "x.npy");
    FAIL("accepted a bad .npy");
  } catch (const Error& e) {
    CHECK(e.category() == ErrorCategory::Io);
    CHECK_MESSAGE(std::string(e.what()).find(fragment) != std::string::npos, e.what());
  }
}

}  // namespace

TEST_CASE("round trips for every dtype and rank") {
  for (DType dtype : {DType::f16, DType::bf16, DType::f32}) {
    for (const std::vector<std::int64_t>& shape : std::vector<std::vector<std::int64_t>>{{7}, {3, 5}, {2, 3, 64}, {0, 4, 64}}) {
      HostArray a = random_array(dtype, shape, 42);
      const std::string bytes = encode_npy(a.view());
      CHECK((bytes.size() - a.bytes.size()) % 64 == 0);  // data aligned as NumPy aligns it
      const HostArray b = parse_npy(bytes, "mem");
      CHECK(b.dtype == dtype);
      CHECK(b.shape == shape);
      CHECK(b.bytes == a.bytes);
    }
  }
}

TEST_CASE("fp8 codes are '|u1', read back as the kind the reader names, refused without one") {
  for (DType fp8 : {DType::fp8_e4m3, DType::fp8_e5m2}) {
    HostArray a = random_array(fp8, {5, 2, 64}, 9);
    const std::string bytes = encode_npy(a.view());
    CHECK(bytes.find("'descr': '|u1'") != std::string::npos);
    const HostArray b = parse_npy(bytes, "mem", fp8);
    CHECK(b.dtype == fp8);
    CHECK(b.shape == a.shape);
    CHECK(b.bytes == a.bytes);
    expect_io_error(bytes, "dtype '|u1' holds fp8 codes, read only as fp8_e4m3 or fp8_e5m2 K and V (--kv-dtype)");
  }
}

TEST_CASE("files on disk") {
  HostArray a = random_array(DType::f32, {4, 2, 64}, 3);
  const std::string path = "test_npy_roundtrip.npy";
  write_npy(path, a.view());
  const HostArray b = read_npy(path);
  std::remove(path.c_str());
  CHECK(b.bytes == a.bytes);
  CHECK_THROWS_WITH_AS(read_npy("/nonexistent/x.npy"), doctest::Contains("cannot open"), Error);
}

TEST_CASE("header variants NumPy writes") {
  // Version 2.0 headers, double quotes, a scalar shape and no trailing comma.
  HostArray v2 = parse_npy(npy_with_header("{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (2, 3)}", 24, 2), "v2");
  CHECK(v2.shape == std::vector<std::int64_t>{2, 3});
  HostArray scalar = parse_npy(npy_with_header("{'descr': '<f2', 'fortran_order': False, 'shape': (), }", 2), "s");
  CHECK(scalar.shape.empty());
  CHECK(scalar.bytes.size() == 2);
}

TEST_CASE("rejections name the problem") {
  expect_io_error("not numpy at all", "bad magic");
  expect_io_error(npy_with_header("{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }", 16), "dtype '<f8' is not supported");
  expect_io_error(npy_with_header("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", 8), "dtype '>f4'");
  expect_io_error(npy_with_header("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2), }", 16), "Fortran-ordered");
  expect_io_error(npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }", 15),
                  "shape [2, 2] f32 needs 16 data bytes, the file holds 15");
  expect_io_error(npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2, x), }", 8), "not a tuple");
  // 2^62 x 4 f32 elements: 2^66 bytes, which wrap to 0 in 64 bits and must not match an empty file.
  expect_io_error(npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, 4), }", 0),
                  "shape [4611686018427387904, 4] f32 has more than 9223372036854775807 bytes");
  expect_io_error(npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", 8, 9), "version 9");
  expect_io_error(npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", 8).substr(0, 20),
                  "truncated");
}

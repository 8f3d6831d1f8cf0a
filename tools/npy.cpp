#include "treeattn/npy.hpp"

#include <cstdio>
#include <limits>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "fail.hpp"
#include "read_file.hpp"

namespace treeattn {
namespace {

const char kMagic[] = "\x93NUMPY";
constexpr std::size_t kMagicSize = 6;

const char* descr_of(DType dtype) {
  switch (dtype) {
    case DType::f16: return "<f2";
    case DType::bf16: return "<u2";
    case DType::f32: return "<f4";
    case DType::fp8_e4m3:
    case DType::fp8_e5m2: return "|u1";
  }
  return "?";
}

// The value text after `'key':` in the header dict, or empty if absent.
std::string dict_value(const std::string& header, const std::string& key) {
  const std::string quoted[2] = {"'" + key + "'", "\"" + key + "\""};
  for (const std::string& k : quoted) {
    std::size_t at = header.find(k);
    if (at == std::string::npos) continue;
    at = header.find(':', at + k.size());
    if (at == std::string::npos) return {};
    std::size_t start = header.find_first_not_of(" \t", at + 1);
    if (start == std::string::npos) return {};
    std::size_t end;
    if (header[start] == '(') end = header.find(')', start) + 1;
    else if (header[start] == '\'' || header[start] == '"') end = header.find(header[start], start + 1) + 1;
    else end = header.find_first_of(",}", start);
    if (end == 0 || end == std::string::npos) return {};
    return header.substr(start, end - start);
  }
  return {};
}

std::vector<std::int64_t> parse_shape(const std::string& text, const std::string& name) {
  if (text.size() < 2 || text.front() != '(' || text.back() != ')') {
    fail(ErrorCategory::Io, "{}: .npy header has no valid 'shape' (got '{}')", name, text);
  }
  std::vector<std::int64_t> shape;
  std::istringstream in(text.substr(1, text.size() - 2));
  std::string part;
  while (std::getline(in, part, ',')) {
    const std::size_t b = part.find_first_not_of(" \t");
    if (b == std::string::npos) continue;  // the trailing comma of a 1-tuple
    std::size_t used = 0;
    long long value = -1;
    try {
      value = std::stoll(part.substr(b), &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || value < 0) fail(ErrorCategory::Io, "{}: .npy shape '{}' is not a tuple of sizes", name, text);
    shape.push_back(value);
  }
  return shape;
}

}  // namespace

HostArray parse_npy(const std::string& contents, const std::string& name, std::optional<DType> bytes_as) {
  if (contents.size() < kMagicSize + 4 || contents.compare(0, kMagicSize, kMagic, kMagicSize) != 0) {
    fail(ErrorCategory::Io, "{}: not a .npy file (bad magic)", name);
  }
  const unsigned major = static_cast<unsigned char>(contents[6]);
  std::size_t header_len, header_start;
  if (major == 1) {
    header_len = std::size_t(static_cast<unsigned char>(contents[8])) |
                 std::size_t(static_cast<unsigned char>(contents[9])) << 8;
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (contents.size() < 12) fail(ErrorCategory::Io, "{}: truncated .npy header", name);
    header_len = 0;
    for (int i = 3; i >= 0; --i) header_len = header_len << 8 | static_cast<unsigned char>(contents[8 + std::size_t(i)]);
    header_start = 12;
  } else {
    fail(ErrorCategory::Io, "{}: unsupported .npy format version {}", name, major);
  }
  if (contents.size() < header_start + header_len) fail(ErrorCategory::Io, "{}: truncated .npy header", name);
  const std::string header = contents.substr(header_start, header_len);

  HostArray array;
  const std::string descr = dict_value(header, "descr");
  if (descr == "'<f2'" || descr == "\"<f2\"") array.dtype = DType::f16;
  else if (descr == "'<f4'" || descr == "\"<f4\"") array.dtype = DType::f32;
  else if (descr == "'<u2'" || descr == "\"<u2\"") array.dtype = DType::bf16;
  else if ((descr == "'|u1'" || descr == "\"|u1\"") && bytes_as && is_fp8(*bytes_as)) array.dtype = *bytes_as;
  else if (descr == "'|u1'" || descr == "\"|u1\"") {
    fail(ErrorCategory::Io, "{}: dtype '|u1' holds fp8 codes, read only as fp8_e4m3 or fp8_e5m2 K and V (--kv-dtype)", name);
  } else {
    fail(ErrorCategory::Io,
         "{}: dtype {} is not supported (use '<f2' for f16, '<f4' for f32, '<u2' for bf16 bits, '|u1' for fp8 codes)",
         name, descr.empty() ? "(missing)" : descr);
  }
  const std::string fortran = dict_value(header, "fortran_order");
  if (fortran == "True") fail(ErrorCategory::Io, "{}: Fortran-ordered arrays are not supported (save it C-ordered)", name);
  if (fortran != "False") fail(ErrorCategory::Io, "{}: .npy header has no valid 'fortran_order'", name);
  array.shape = parse_shape(dict_value(header, "shape"), name);

  // The data's bytes, refused past what an int64 element count can hold.
  std::size_t expected = dtype_size(array.dtype);
  for (std::int64_t d : array.shape) {
    if (d != 0 && expected > std::size_t(std::numeric_limits<std::int64_t>::max()) / std::size_t(d)) {
      fail(ErrorCategory::Io, "{}: shape [{}] {} has more than {} bytes of data", name, fmt::join(array.shape, ", "),
           to_string(array.dtype), std::numeric_limits<std::int64_t>::max());
    }
    expected *= std::size_t(d);
  }
  const std::size_t data_start = header_start + header_len;
  const std::size_t found = contents.size() - data_start;
  if (found != expected) {
    fail(ErrorCategory::Io, "{}: shape [{}] {} needs {} data bytes, the file holds {}", name,
         fmt::join(array.shape, ", "), to_string(array.dtype), expected, found);
  }
  array.bytes.assign(contents.begin() + std::ptrdiff_t(data_start), contents.end());
  return array;
}

HostArray read_npy(const std::string& path, std::optional<DType> bytes_as) {
  return parse_npy(read_file(path), path, bytes_as);
}

std::string encode_npy(const TensorRef& t) {
  std::string shape;
  for (std::int64_t d : t.shape) shape += fmt::format("{}, ", d);
  if (t.shape.size() > 1) shape.resize(shape.size() - 2);  // (3,) keeps its comma
  std::string header =
      fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}", descr_of(t.dtype), shape);
  // Pad with spaces so the data starts on a 64-byte boundary; end with '\n'.
  const std::size_t unpadded = kMagicSize + 4 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');
  std::string out(kMagic, kMagicSize);
  out.push_back('\x01');
  out.push_back('\x00');
  out.push_back(char(header.size() & 0xff));
  out.push_back(char(header.size() >> 8));
  out += header;
  out.append(static_cast<const char*>(t.data), t.bytes());
  return out;
}

void write_npy(const std::string& path, const TensorRef& t) {
  const std::string bytes = encode_npy(t);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) fail(ErrorCategory::Io, "{}: cannot open for writing", path);
  const bool ok = std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  if (std::fclose(f) != 0 || !ok) fail(ErrorCategory::Io, "{}: write failed", path);
}

}  // namespace treeattn

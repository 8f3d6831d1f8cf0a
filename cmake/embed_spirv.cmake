# cmake -DSPV=in.spv -DOUT=out.cpp -DNAME=symbol -P embed_spirv.cmake
# Writes the SPIR-V module as a uint32 array the Vulkan backend links in.
file(READ "${SPV}" bytes HEX)
string(LENGTH "${bytes}" hex_length)
math(EXPR word_count "${hex_length} / 8")
# SPIR-V words are little-endian on disk: reverse each group of four bytes.
string(REGEX REPLACE "(..)(..)(..)(..)" "0x\\4\\3\\2\\1u," words "${bytes}")
string(REGEX REPLACE "(([^,]*,){8})" "\\1\n  " words "${words}")
file(WRITE "${OUT}" "// Generated from ${SPV} by embed_spirv.cmake; do not edit.\n"
  "#include <cstddef>\n#include <cstdint>\n\n"
  "namespace treeattn::vulkan::spirv {\n"
  "extern const std::uint32_t ${NAME}[];\nextern const std::size_t ${NAME}_words;\n"
  "const std::uint32_t ${NAME}[] = {\n  ${words}\n};\n"
  "const std::size_t ${NAME}_words = ${word_count};\n}\n")

# A cross build's dependencies (or a build on a machine without their
# packages): fmt (header-only), nlohmann_json and doctest from the build
# machine's headers (Debian ships no mingw builds of them), and
# the Vulkan headers and volk for the Vulkan backend (volk loads vulkan-1.dll
# at run time). Each is reached through a folder of links to its own headers,
# so no other host header is visible to the cross compiler.
set(TREEATTN_HOST_INCLUDE_DIR /usr/include CACHE PATH "Where the build machine's fmt, nlohmann, doctest, vulkan and volk headers are")
set(host_headers ${CMAKE_BINARY_DIR}/host-headers)
file(MAKE_DIRECTORY ${host_headers})
foreach(entry fmt nlohmann doctest vulkan vk_video volk.h volk.c)
  if(EXISTS ${TREEATTN_HOST_INCLUDE_DIR}/${entry} AND NOT EXISTS ${host_headers}/${entry})
    file(CREATE_LINK ${TREEATTN_HOST_INCLUDE_DIR}/${entry} ${host_headers}/${entry} SYMBOLIC)
  endif()
endforeach()
add_library(fmt::fmt INTERFACE IMPORTED GLOBAL)
target_include_directories(fmt::fmt SYSTEM INTERFACE ${host_headers})
target_compile_definitions(fmt::fmt INTERFACE FMT_HEADER_ONLY)
add_library(nlohmann_json::nlohmann_json INTERFACE IMPORTED GLOBAL)
target_include_directories(nlohmann_json::nlohmann_json SYSTEM INTERFACE ${host_headers})
add_library(doctest::doctest INTERFACE IMPORTED GLOBAL)
target_include_directories(doctest::doctest SYSTEM INTERFACE ${host_headers})
set(Vulkan_INCLUDE_DIR ${host_headers} CACHE PATH "Vulkan headers (the build machine's)")
set(TREEATTN_VOLK_DIR ${host_headers} CACHE PATH "volk (the build machine's)")

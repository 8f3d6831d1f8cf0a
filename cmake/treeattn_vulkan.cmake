# The Vulkan backend's build: Vulkan headers and volk (no link-time libvulkan:
# volk loads the loader at run time), a glslang to compile the shaders, and a
# compile probe that decides whether the cooperative-matrix variant is built.

set(TREEATTN_GLSLANG "" CACHE FILEPATH
    "glslang compiler for the shaders (scripts/setup_glslang.sh provides one that compiles cooperative-matrix shaders)")

function(treeattn_find_vulkan_toolchain out)
  set(${out} OFF PARENT_SCOPE)
  find_package(Vulkan QUIET)  # headers only
  find_path(TREEATTN_VOLK_DIR volk.c PATHS /usr/include /usr/local/include ENV VULKAN_SDK PATH_SUFFIXES include Include)
  if(NOT TREEATTN_GLSLANG)
    find_program(TREEATTN_GLSLANG_FOUND NAMES glslang glslangValidator)
    set(TREEATTN_GLSLANG "${TREEATTN_GLSLANG_FOUND}" CACHE FILEPATH "" FORCE)
  endif()
  set(missing "")
  if(NOT Vulkan_INCLUDE_DIRS)
    list(APPEND missing "Vulkan headers (libvulkan-dev)")
  endif()
  if(NOT TREEATTN_VOLK_DIR)
    list(APPEND missing "volk (libvulkan-volk-dev)")
  endif()
  if(NOT TREEATTN_GLSLANG)
    list(APPEND missing "glslang (glslang-tools or scripts/setup_glslang.sh)")
  endif()
  if(missing)
    string(JOIN ", " missing_text ${missing})
    set(TREEATTN_VULKAN_MISSING "${missing_text}" PARENT_SCOPE)
    return()
  endif()
  set(${out} ON PARENT_SCOPE)
endfunction()

# Does the glslang found compile GL_KHR_cooperative_matrix (glslang >= 14)?
function(treeattn_probe_glslang_coopmat out)
  set(probe_dir ${CMAKE_BINARY_DIR}/shader_probe)
  file(WRITE ${probe_dir}/coopmat.comp [=[
#version 460
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
layout(local_size_x = 32) in;
layout(std430, binding = 0) buffer B { float16_t data[]; };
void main() {
  coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> a;
  coopMatLoad(a, data, 0, 16, gl_CooperativeMatrixLayoutRowMajor);
  coopMatStore(a, data, 256, 16, gl_CooperativeMatrixLayoutRowMajor);
}
]=])
  execute_process(COMMAND ${TREEATTN_GLSLANG} -V --target-env vulkan1.3 ${probe_dir}/coopmat.comp -o ${probe_dir}/coopmat.spv
                  RESULT_VARIABLE result OUTPUT_QUIET ERROR_QUIET)
  if(result EQUAL 0)
    set(${out} ON PARENT_SCOPE)
  else()
    set(${out} OFF PARENT_SCOPE)
  endif()
endfunction()

# Compiles shaders/<source> with glslang (extra arguments: -D defines) and embeds
# the SPIR-V into `target` as treeattn::vulkan::spirv::<name>.
function(treeattn_embed_shader target name source)
  set(spv ${CMAKE_CURRENT_BINARY_DIR}/shaders/${name}.spv)
  set(cpp ${CMAKE_CURRENT_BINARY_DIR}/shaders/${name}.spv.cpp)
  file(GLOB shader_includes ${PROJECT_SOURCE_DIR}/shaders/*.glsl)
  add_custom_command(
    OUTPUT ${spv}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${CMAKE_CURRENT_BINARY_DIR}/shaders
    COMMAND ${TREEATTN_GLSLANG} -V --target-env vulkan1.3 ${ARGN} -o ${spv} ${PROJECT_SOURCE_DIR}/shaders/${source}
    DEPENDS ${PROJECT_SOURCE_DIR}/shaders/${source} ${shader_includes}
    COMMENT "glslang: ${source} -> ${name}.spv"
    VERBATIM)
  add_custom_command(
    OUTPUT ${cpp}
    COMMAND ${CMAKE_COMMAND} -DSPV=${spv} -DOUT=${cpp} -DNAME=${name} -P ${PROJECT_SOURCE_DIR}/cmake/embed_spirv.cmake
    DEPENDS ${spv} ${PROJECT_SOURCE_DIR}/cmake/embed_spirv.cmake
    VERBATIM)
  target_sources(${target} PRIVATE ${cpp})
endfunction()

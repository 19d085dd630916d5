# Finds what the Vulkan backend plugin needs to build: volk (header and
# source, Debian libvulkan-volk-dev), the Vulkan headers (libvulkan-dev),
# glslangValidator (glslang-tools) and spirv-val (spirv-tools). Nothing links
# libvulkan: volk opens the loader at run time. Sets KVMEM_VULKAN_FOUND and
# KVMEM_VULKAN_MISSING (what is absent, for the message).
find_path(KVMEM_VOLK_INCLUDE_DIR volk.h)
find_file(KVMEM_VOLK_SOURCE volk.c HINTS ${KVMEM_VOLK_INCLUDE_DIR})
find_path(KVMEM_VULKAN_INCLUDE_DIR vulkan/vulkan.h)
find_program(KVMEM_GLSLANG glslangValidator)
find_program(KVMEM_SPIRV_VAL spirv-val)

set(KVMEM_VULKAN_MISSING "")
if(NOT KVMEM_VOLK_INCLUDE_DIR OR NOT KVMEM_VOLK_SOURCE)
  list(APPEND KVMEM_VULKAN_MISSING "volk.h/volk.c (libvulkan-volk-dev)")
endif()
if(NOT KVMEM_VULKAN_INCLUDE_DIR)
  list(APPEND KVMEM_VULKAN_MISSING "vulkan/vulkan.h (libvulkan-dev)")
endif()
if(NOT KVMEM_GLSLANG)
  list(APPEND KVMEM_VULKAN_MISSING "glslangValidator (glslang-tools)")
endif()
if(NOT KVMEM_SPIRV_VAL)
  list(APPEND KVMEM_VULKAN_MISSING "spirv-val (spirv-tools)")
endif()
if(EMSCRIPTEN OR NOT UNIX OR APPLE)
  list(APPEND KVMEM_VULKAN_MISSING "a Linux-like target (plugins are dlopen'ed .so files)")
endif()
if(KVMEM_VULKAN_MISSING)
  set(KVMEM_VULKAN_FOUND OFF)
else()
  set(KVMEM_VULKAN_FOUND ON)
endif()

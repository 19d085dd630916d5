# The C core's sources: the one list every build of the core takes them from,
# the library (core/CMakeLists.txt), the WebAssembly module
# (wasm/CMakeLists.txt) and the fuzz harness (tests/fuzz/CMakeLists.txt).
#
# Every .c file under core/, at any depth, is a source; its name says which
# instruction set it needs:
#   *_avx2.c     x86-64 kernels, compiled with KVMEM_AVX2_FLAGS
#   *_avx512.c   x86-64 kernels, compiled with KVMEM_AVX512_FLAGS
#   *_wasm128.c  WebAssembly SIMD128 kernels (the Emscripten build only)
#   the rest     portable C11 (libc, libm, pthreads)
# A file moved between folders needs no edit here; a new instruction set
# is a suffix and its flags below, and a group here.
#
# Sets, as absolute paths, sorted:
#   KVMEM_CORE_SOURCES          the portable files
#   KVMEM_CORE_AVX2_SOURCES     KVMEM_CORE_AVX512_SOURCES     KVMEM_CORE_WASM128_SOURCES
#   KVMEM_CORE_DIR              core/ (its private headers are included from there)
get_filename_component(KVMEM_CORE_DIR "${CMAKE_CURRENT_LIST_DIR}/../core" ABSOLUTE)

set(KVMEM_AVX2_FLAGS -mavx2 -mfma -mf16c)
set(KVMEM_AVX512_FLAGS -mavx512f -mavx512bw -mavx512vl -mavx2 -mfma -mf16c)

file(GLOB_RECURSE KVMEM_CORE_SOURCES CONFIGURE_DEPENDS "${KVMEM_CORE_DIR}/*.c")
list(SORT KVMEM_CORE_SOURCES)
set(KVMEM_CORE_AVX2_SOURCES ${KVMEM_CORE_SOURCES})
list(FILTER KVMEM_CORE_AVX2_SOURCES INCLUDE REGEX "_avx2\\.c$")
set(KVMEM_CORE_AVX512_SOURCES ${KVMEM_CORE_SOURCES})
list(FILTER KVMEM_CORE_AVX512_SOURCES INCLUDE REGEX "_avx512\\.c$")
set(KVMEM_CORE_WASM128_SOURCES ${KVMEM_CORE_SOURCES})
list(FILTER KVMEM_CORE_WASM128_SOURCES INCLUDE REGEX "_wasm128\\.c$")
list(FILTER KVMEM_CORE_SOURCES EXCLUDE REGEX "_(avx2|avx512|wasm128)\\.c$")

# Add the x86-64 kernels to `target` with their flags and tell the core's
# dispatchers they are there (KVMEM_HAVE_AVX2 / KVMEM_HAVE_AVX512: without
# them every dispatcher keeps the portable kernels). Does nothing when the
# target processor is not x86-64 (or under Emscripten).
function(kvmem_core_x86_sources target)
  if(NOT CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64|amd64" OR EMSCRIPTEN)
    return()
  endif()
  target_sources(${target} PRIVATE ${KVMEM_CORE_AVX2_SOURCES} ${KVMEM_CORE_AVX512_SOURCES})
  set_source_files_properties(${KVMEM_CORE_AVX2_SOURCES} TARGET_DIRECTORY ${target}
                              PROPERTIES COMPILE_OPTIONS "${KVMEM_AVX2_FLAGS}")
  set_source_files_properties(${KVMEM_CORE_AVX512_SOURCES} TARGET_DIRECTORY ${target}
                              PROPERTIES COMPILE_OPTIONS "${KVMEM_AVX512_FLAGS}")
  target_compile_definitions(${target} PRIVATE KVMEM_HAVE_AVX2 KVMEM_HAVE_AVX512)
endfunction()

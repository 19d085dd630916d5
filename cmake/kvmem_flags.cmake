# Warning and sanitizer flags for every kvmem target (kvmem_apply_flags).
# POSIX 2008 (clock_gettime, fsync, ...) while keeping strict ISO C11 elsewhere.
add_compile_definitions(_POSIX_C_SOURCE=200809L)
set(KVMEM_WARNINGS -Wall -Wextra -Wpedantic -Wshadow -Wstrict-prototypes -Wmissing-prototypes
    -Wformat=2 -Wvla -Wcast-qual -Wundef -Wno-unused-parameter)
if(KVMEM_WERROR)
  list(APPEND KVMEM_WARNINGS -Werror)
endif()

set(KVMEM_SAN_FLAGS "")
if(KVMEM_SANITIZE)
  string(REPLACE ";" "," _san "${KVMEM_SANITIZE}")
  set(KVMEM_SAN_FLAGS -fsanitize=${_san} -fno-omit-frame-pointer -fno-sanitize-recover=all)
  add_compile_options(${KVMEM_SAN_FLAGS})
  add_link_options(${KVMEM_SAN_FLAGS})
endif()

function(kvmem_apply_flags target)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:C>:${KVMEM_WARNINGS}>)
endfunction()

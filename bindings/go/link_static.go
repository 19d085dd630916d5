//go:build kvmem_static

package kvmem

// -tags kvmem_static: libkvmem.a linked into the program (kvmem-static.pc:
// libkvmem.a -lm -lpthread -ldl), so it runs with nothing to find at run time.
// The CUDA and Vulkan backends are plugins that libkvmem loads from its own
// directory, which a static program does not have: it gets the CPU backend
// unless KVMEM_BACKEND_PATH names the plugins' directory.

/*
#cgo pkg-config: kvmem-static
*/
import "C"

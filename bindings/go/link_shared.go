//go:build !kvmem_static

package kvmem

// The header and libkvmem.so come from pkg-config: an installed kvmem
// (cmake --install puts kvmem.pc in <prefix>/lib/pkgconfig; set
// PKG_CONFIG_PATH for a prefix pkg-config does not search), or a build tree
// (PKG_CONFIG_PATH=build/default finds its kvmem-uninstalled.pc). The program
// then needs libkvmem.so.0 at run time: a system prefix, or an rpath, the same
// for both (CGO_LDFLAGS=-Wl,-rpath,$(pkg-config --variable=libdir kvmem)), or
// build with -tags kvmem_static instead (link_static.go).

/*
#cgo pkg-config: kvmem
*/
import "C"

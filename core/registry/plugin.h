/* The one place plugins (backends and stores) are found and opened. */
#ifndef KVMEM_PLUGIN_H
#define KVMEM_PLUGIN_H

#include <stddef.h>

/* Opens libkvmem-<name>.so and returns the address of its init symbol, or
 * NULL with the reason in why. Looked up in KVMEM_BACKEND_PATH, beside
 * libkvmem (or the program that links it statically), then by the dynamic
 * loader's own search.
 *
 * A plugin, once opened, stays mapped for the life of the process
 * (RTLD_NODELETE): objects made from it may be alive anywhere, GPU loaders
 * and drivers do not unload cleanly (their globals would turn into leaks
 * and their code into dangling pointers), and opening one again costs a
 * driver start. Builds without dlopen (WebAssembly) answer "cannot load". */
void *kvm_plugin_symbol(const char *name, const char *symbol, char *why, size_t why_size);

#endif

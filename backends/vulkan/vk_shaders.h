/* The embedded SPIR-V modules (generated vk_shaders_data.c). */
#ifndef KVMEM_VK_SHADERS_H
#define KVMEM_VK_SHADERS_H

#include <stddef.h>
#include <stdint.h>

typedef struct kvm_vk_shader {
    const char *name;     /* the .comp file name without extension */
    const uint32_t *code; /* SPIR-V words */
    size_t n_words;
} kvm_vk_shader;

/* Terminated by an entry with name NULL. */
extern const kvm_vk_shader kvm_vk_shaders[];
extern const int kvm_vk_n_shaders;

#endif

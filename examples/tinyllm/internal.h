/* tinyllm internals shared between its source files. */
#ifndef TINYLLM_INTERNAL_H
#define TINYLLM_INTERNAL_H

#include "tinyllm.h"

#if defined(__GNUC__) || defined(__clang__)
#define TL_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define TL_PRINTF(a, b)
#endif

/* Write a message to err (if any) and return -1. */
int tl_errf(char *err, size_t size, const char *fmt, ...) TL_PRINTF(3, 4);
int tl_read_file(const char *path, uint8_t **out, size_t *size, char *err, size_t err_size);
int tl_config_check(const tl_config *c, char *err, size_t err_size);
/* Floats of all weights in tl_model.data order (classifier included unless shared). */
size_t tl_n_weights(const tl_config *c, int shared_cls);
/* Point m->w into m->data, laid out as llama2.c does. */
void tl_set_pointers(tl_model *m, int shared_cls);

#endif

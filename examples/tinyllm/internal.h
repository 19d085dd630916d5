/* tinyllm internals shared between its source files. */
#ifndef TINYLLM_INTERNAL_H
#define TINYLLM_INTERNAL_H

#include "tinyllm.h"

#if defined(__GNUC__) || defined(__clang__)
#define TL_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define TL_PRINTF(a, b)
/* The history (methods.c): tl_history_append with the flush of the tail
 * optional (flush = 0 keeps blocks aligned to BS tokens across appends). */
int tl_history_append_ex(tl_history *h, const float *k_rot, const float *v, int32_t T,
                         const int32_t *positions, const int32_t *tokens, const float *q_rot,
                         const float *acc, int32_t prompt_len, int flush, char *err, size_t err_size);
/* Raw K, V of history tokens [first, first + T) as [L][T][kv_dim] f32. */
int tl_history_read_raw(tl_history *h, int64_t first, int64_t T, float *k, float *v, char *err, size_t err_size);
/* Rotate raw keys [L][T][kv_dim] to the positions pos[T] in place. */
int tl_history_rotate(tl_history *h, float *k, int64_t T, const int32_t *pos, char *err, size_t err_size);

#endif

/* Write a message to err (if any) and return -1. */
int tl_errf(char *err, size_t size, const char *fmt, ...) TL_PRINTF(3, 4);
int tl_read_file(const char *path, uint8_t **out, size_t *size, char *err, size_t err_size);
int tl_config_check(const tl_config *c, char *err, size_t err_size);
/* Floats of all weights in tl_model.data order (classifier included unless shared). */
size_t tl_n_weights(const tl_config *c, int shared_cls);
/* Point m->w into m->data, laid out as llama2.c does. */
void tl_set_pointers(tl_model *m, int shared_cls);

/* Building a tokenizer (tokenizer.c): allocate n tokens with arena_size
 * bytes for their pieces, set each (sp_space: U+2581 stands for a space, as
 * in sentencepiece vocabularies), set the special ids, then finish (checks
 * scores and byte pieces, builds the lookup table). */
tl_tokenizer *tl_tok_alloc(int32_t n, size_t arena_size);
int tl_tok_set(tl_tokenizer *t, int32_t id, const char *bytes, size_t len, float score, int type,
               int sp_space);
void tl_tok_specials(tl_tokenizer *t, int32_t bos, int32_t eos, int32_t unk, int add_prefix);
int tl_tok_finish(tl_tokenizer *t, char *err, size_t err_size);
tl_tokenizer *tl_tok_clone(const tl_tokenizer *t);
/* The byte a "<0xNN>" piece stands for, or -1 for any other piece. */
int tl_tok_byte_value(const char *p, size_t n);

/* The history (methods.c): tl_history_append with the flush of the tail
 * optional (flush = 0 keeps blocks aligned to BS tokens across appends). */
int tl_history_append_ex(tl_history *h, const float *k_rot, const float *v, int32_t T,
                         const int32_t *positions, const int32_t *tokens, const float *q_rot,
                         const float *acc, int32_t prompt_len, int flush, char *err, size_t err_size);
/* Raw K, V of history tokens [first, first + T) as [L][T][kv_dim] f32. */
int tl_history_read_raw(tl_history *h, int64_t first, int64_t T, float *k, float *v, char *err, size_t err_size);
/* Rotate raw keys [L][T][kv_dim] to the positions pos[T] in place. */
int tl_history_rotate(tl_history *h, float *k, int64_t T, const int32_t *pos, char *err, size_t err_size);

#endif

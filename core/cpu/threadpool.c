#include "threadpool.h"
#include "../alloc.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

struct kvm_threadpool {
    int n_workers;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done;
    pthread_mutex_t submit; /* one job at a time; busy callers run inline */
    uint64_t generation;
    int stop;
    /* the current job */
    kvm_task_fn fn;
    void *arg;
    size_t n, grain;
    atomic_size_t next;
    int active; /* workers still inside the job */
};

static void run_chunks(kvm_threadpool *tp) {
    for (;;) {
        size_t b = atomic_fetch_add(&tp->next, tp->grain);
        if (b >= tp->n) break;
        size_t e = b + tp->grain < tp->n ? b + tp->grain : tp->n;
        tp->fn(tp->arg, b, e);
    }
}

static void *worker(void *p) {
    kvm_threadpool *tp = p;
    uint64_t seen = 0;
    pthread_mutex_lock(&tp->mu);
    for (;;) {
        while (!tp->stop && tp->generation == seen) pthread_cond_wait(&tp->cv_work, &tp->mu);
        if (tp->stop) break;
        seen = tp->generation;
        pthread_mutex_unlock(&tp->mu);
        run_chunks(tp);
        pthread_mutex_lock(&tp->mu);
        if (--tp->active == 0) pthread_cond_signal(&tp->cv_done);
    }
    pthread_mutex_unlock(&tp->mu);
    return NULL;
}

kvm_threadpool *kvm_threadpool_create(int n_threads) {
    if (n_threads < 1) n_threads = 1;
    kvm_threadpool *tp = kvm_calloc(1, sizeof *tp);
    if (!tp) return NULL;
    pthread_mutex_init(&tp->mu, NULL);
    pthread_mutex_init(&tp->submit, NULL);
    pthread_cond_init(&tp->cv_work, NULL);
    pthread_cond_init(&tp->cv_done, NULL);
    atomic_init(&tp->next, 0);
    int want = n_threads - 1;
    if (want > 0) {
        tp->threads = kvm_calloc((size_t)want, sizeof *tp->threads);
        if (!tp->threads) {
            kvm_threadpool_free(tp);
            return NULL;
        }
        for (int i = 0; i < want; i++) {
            /* fewer workers than asked (e.g. a build without threads) still works */
            if (pthread_create(&tp->threads[i], NULL, worker, tp) != 0) break;
            tp->n_workers++;
        }
    }
    return tp;
}

void kvm_threadpool_free(kvm_threadpool *tp) {
    if (!tp) return;
    pthread_mutex_lock(&tp->mu);
    tp->stop = 1;
    pthread_cond_broadcast(&tp->cv_work);
    pthread_mutex_unlock(&tp->mu);
    for (int i = 0; i < tp->n_workers; i++) pthread_join(tp->threads[i], NULL);
    kvm_free(tp->threads);
    pthread_cond_destroy(&tp->cv_work);
    pthread_cond_destroy(&tp->cv_done);
    pthread_mutex_destroy(&tp->mu);
    pthread_mutex_destroy(&tp->submit);
    kvm_free(tp);
}

int kvm_threadpool_size(const kvm_threadpool *tp) { return tp ? tp->n_workers + 1 : 1; }

void kvm_parallel_for(kvm_threadpool *tp, size_t n, size_t grain, kvm_task_fn fn, void *arg) {
    if (n == 0) return;
    if (grain == 0) grain = 1;
    if (!tp || tp->n_workers == 0 || n <= grain || pthread_mutex_trylock(&tp->submit) != 0) {
        fn(arg, 0, n);
        return;
    }
    pthread_mutex_lock(&tp->mu);
    tp->fn = fn;
    tp->arg = arg;
    tp->n = n;
    tp->grain = grain;
    atomic_store(&tp->next, 0);
    tp->active = tp->n_workers;
    tp->generation++;
    pthread_cond_broadcast(&tp->cv_work);
    pthread_mutex_unlock(&tp->mu);
    run_chunks(tp);
    pthread_mutex_lock(&tp->mu);
    while (tp->active > 0) pthread_cond_wait(&tp->cv_done, &tp->mu);
    pthread_mutex_unlock(&tp->mu);
    pthread_mutex_unlock(&tp->submit);
}

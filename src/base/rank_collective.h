/* Collectives between the ranks of a tensor-parallel group whose buffers share one address space
 * (ranks on CPU backends in one process, one host thread each): a barrier that a failing rank can
 * break, a sum all-reduce whose summation order never depends on the buffer's length or on which
 * rank runs faster (rank 0 + rank 1 + ... for every element), and a column gather into rank 0.
 *
 * Every rank calls the same collectives in the same order; each call returns CI_OK, or CI_ERR
 * once any rank has called ci_rank_collective_abort (a rank that failed mid-step), so that no
 * rank is left waiting. */
#ifndef CI_BASE_RANK_COLLECTIVE_H
#define CI_BASE_RANK_COLLECTIVE_H

#include <stdint.h>

enum { CI_MAX_RANKS = 8 };

typedef struct ci_rank_collective ci_rank_collective;

/* A collective for `world` ranks (1 .. CI_MAX_RANKS). NULL with ci_last_error on failure. */
ci_rank_collective *ci_rank_collective_create(int world);

/* Frees it (no rank may be inside a call). NULL is a no-op. */
void ci_rank_collective_free(ci_rank_collective *c);

/* Makes the calls work again after an abort; only while no rank is inside a call (between
 * steps). */
void ci_rank_collective_reset(ci_rank_collective *c);

/* Breaks every wait, now and until the next reset: calls return CI_ERR. */
void ci_rank_collective_abort(ci_rank_collective *c);

/* Waits until every rank has arrived. */
int ci_rank_collective_barrier(ci_rank_collective *c);

/* Ranks of the collective. */
int ci_rank_collective_world(const ci_rank_collective *c);

/* Publishes a pointer of rank `rank` for the current call (before a barrier), and reads rank
 * `rank`'s (after it): a device collective's buffers and events. A published pointer stays
 * readable until its rank passes the second barrier after publishing it. */
void ci_rank_collective_publish(ci_rank_collective *c, int rank, void *ptr);
void *ci_rank_collective_peer(const ci_rank_collective *c, int rank);

/* buf[i] = sum over ranks r = 0, 1, ... of rank r's buf[i], for n floats, on every rank. Each rank
 * adds up an equal slice of the elements and writes the sums into every rank's buffer. */
int ci_rank_collective_all_reduce(ci_rank_collective *c, int rank, float *buf, int64_t n);

/* Column gather: rank r's src [rows, cols] goes to columns [col0, col0 + cols) of rank 0's dst
 * [rows, dst_cols] (dst is read from rank 0's call; the other ranks pass NULL). */
int ci_rank_collective_gather_cols(ci_rank_collective *c, int rank, float *dst, const float *src,
                                   int64_t rows, int64_t cols, int64_t col0, int64_t dst_cols);

#endif

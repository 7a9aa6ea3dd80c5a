/* ranks.h — the step broadcast of a model split over ranks (DESIGN.md decision 6).
 *
 * Rank 0 owns the requests, the scheduler and the KV cache's block tables; every forward pass it
 * runs is first sent to the other ranks (token ids, positions, sequence rows, each sequence's
 * block table and, under data-parallel attention, the rank attending for it; the logit rows), which
 * run the same pass over their shards in lock step, so that
 * the all-reduces inside it meet. Sampling happens once, on rank 0: the followers compute their
 * share of the logits for the gather of a vocabulary-parallel lm_head and keep nothing. Rank 0
 * ends the followers' loop with a stop message when it is done. A follower whose pass fails cannot leave
 * rank 0 waiting in a collective: it aborts the job (comm_abort) with its message.
 *
 * defines: ranks_send_pass(), ranks_send_stop(), ranks_follow()
 */
#ifndef MOESERVE_ENGINE_RANKS_H
#define MOESERVE_ENGINE_RANKS_H

#include "engine/forward.h"

/* Rank 0, inside forward_run: the pass b to every other rank (nothing without ranks). */
void ranks_send_pass(struct forward *f, const struct forward_batch *b);
/* Rank 0: the followers' loop ends (nothing without ranks). */
void ranks_send_stop(struct forward *f);
/* Ranks > 0: runs every pass rank 0 sends until it sends stop. */
enum status ranks_follow(struct forward *f, struct err *err);

#endif

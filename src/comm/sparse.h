/*
 * sparse.h - the sparse collectives' pieces that tests reach
 * (comm/sparse.c; the calls themselves are in comm/collectives.h).
 */
#ifndef LOOMI_SPARSE_H
#define LOOMI_SPARSE_H

#include <stddef.h>
#include <stdint.h>

#include "loom.h"

/* One rank's pairs, merged: out_idx/out_val get the pairs sorted by
 * index, those sharing an index combined with op in input order
 * (LOOM_AVG combines as LOOM_SUM); returns how many there are.  out_idx
 * and out_val hold nnz pairs, scratch 4 * nnz uint64 (a radix sort's). */
size_t loomi_sparse_merge(const uint64_t *idx, const void *val, size_t nnz, loom_datatype_t dtype,
                          loom_op_t op, uint64_t *out_idx, void *out_val, uint64_t *scratch);

/* The switch rule, the same on every rank: 1 to exchange pairs, 0 to
 * fall back to the dense collective.  counts[r * stride] is rank r's
 * merged count (allgather, rs 0); counts[r * stride + b] its count in
 * block b (reduce-scatter).  Sparse when the pairs (8 + es bytes each)
 * a rank would send or receive are at most the bytes of the dense ring
 * algorithm: n * max_r count <= 2 * dense * es / (8 + es) for the
 * allgather, and for the reduce-scatter, for every rank, the pairs it
 * sends to others and receives from others <= (n - 1) * block * es /
 * (8 + es). */
int loomi_sparse_use_sparse(int rs, int n, size_t es, size_t dense, const uint64_t *counts,
                            size_t stride);

#endif

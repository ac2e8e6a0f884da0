/* Paged attention on the CPU, float32: query rows that each attend to a prefix of their
 * sequence's K/V, read in place through the block tables (the torch path copies them into a
 * padded batch first).
 *
 * A row is one query token: a decode, or one token of a prefill chunk over cached context.
 * Row r reads the block table of sequence row_seqs[r] (row r itself when row_seqs is NULL:
 * the decode step) and attends to that sequence's first context_lens[r] tokens, which already
 * hold this step's K/V. Consecutive rows of one sequence at consecutive positions (a chunk)
 * form a tile of up to TILE_HEADS / G rows that walks the K/V once for all of them; a row
 * whose context ends before the tile's gives its extra keys weight exactly 0, so a row's
 * output is bitwise the same whatever tile it lands in.
 *
 * Work is split over (tile, kv head) pairs; each is computed by one thread in a fixed order,
 * so the output does not depend on the thread count or the schedule. Per pair, the context is
 * walked in chunks of CHUNK tokens with an online softmax:
 *   1. scores s[j][t] = q[j] . k[t] / sqrt(D) for the tile's rows x the G query heads of
 *      this kv head (j);
 *   2. p[j][t] = exp(s[j][t] - m[j]) with m[j] the running max; the sums so far are rescaled
 *      when m[j] grows; keys past row j's context get p = 0;
 *   3. acc[j] += p[j][t] * v[t].
 * out[j] = acc[j] / sum_t p[j][t].
 *
 * Layouts (all contiguous): query and out [R, H, D]; key_cache and value_cache
 * [num_blocks, block_size, KVH, D]; block_tables [S, max_blocks] int64; row_seqs [R] int64
 * (or NULL); context_lens [R] int64. Query head h reads kv head h / G (G = H / KVH).
 *
 * Vectors are GCC/Clang vector extensions of LANES floats (one AVX-512 register, or two AVX2
 * ones). Common head sizes get their own copy of the loops with D known at compile time.
 * Built by engine/cpu_decode.py and called through ctypes.
 */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifndef LANES
#ifdef __AVX512F__
#define LANES 16 /* floats per vector: one AVX-512 register */
#else
#define LANES 8 /* one AVX2 register: 16-float vectors cost 4x here (split, spilled) */
#endif
#endif
#define CHUNK 64 /* tokens per online-softmax step, a multiple of LANES; scores stay in L1 */
#ifndef TILE_HEADS
#define TILE_HEADS 16 /* query heads per tile (rows x G): a tile's scores and acc fit in L1 */
#endif

typedef float vf __attribute__((vector_size(LANES * 4)));
typedef int32_t vi __attribute__((vector_size(LANES * 4)));
typedef float vf8 __attribute__((vector_size(32)));
typedef float vf4 __attribute__((vector_size(16)));

/* --- vector helpers ------------------------------------------------------------------------ */

static inline vf load(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void store(float *p, vf v) { memcpy(p, &v, sizeof v); }

static inline vf splat(float x) { return (vf){0} + x; }

static inline vf blend(vi mask, vf a, vf b) { return (vf)(((vi)a & mask) | ((vi)b & ~mask)); }

static inline float hsum(vf v) { /* a tree: 16 -> 8 -> 4 -> 1 */
#if LANES == 16
    vf8 lo8, hi8;
    memcpy(&lo8, &v, sizeof lo8);
    memcpy(&hi8, (const char *)&v + sizeof lo8, sizeof hi8);
    const vf8 s8 = lo8 + hi8;
#else
    const vf8 s8 = v;
#endif
    vf4 lo4, hi4;
    memcpy(&lo4, &s8, sizeof lo4);
    memcpy(&hi4, (const char *)&s8 + sizeof lo4, sizeof hi4);
    const vf4 s4 = lo4 + hi4;
    return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

/* exp(x) for x <= 0 (a score minus the running max): Cephes' expf polynomial, relative error
 * ~2e-7; 0 below -87 (and for -inf), NaN stays NaN. */
static inline vf exp_nonpositive(vf x) {
    const vi tiny = x < splat(-87.0f);
    x = blend(tiny, splat(-87.0f), x);
    const vf magic = splat(12582912.0f); /* 1.5 * 2^23: adding it rounds to an integer */
    const vf n = (x * splat(1.44269504088896341f) + magic) - magic;
    const vf r = x - n * splat(0.693359375f) + n * splat(2.12194440e-4f); /* x - n ln 2 */
    vf p = splat(1.9875691500e-4f);
    p = p * r + splat(1.3981999507e-3f);
    p = p * r + splat(8.3334519073e-3f);
    p = p * r + splat(4.1665795894e-2f);
    p = p * r + splat(1.6666665459e-1f);
    p = p * r + splat(5.0000001201e-1f);
    p = p * r * r + r + splat(1.0f);
    const vi two_n = (__builtin_convertvector(n, vi) + 127) << 23; /* 2^n, n in [-126, 0] */
    return (vf)((vi)(p * (vf)two_n) & ~tiny);
}

static inline float dot(const float *restrict a, const float *restrict b, int64_t n) {
    vf acc = splat(0.0f);
    int64_t d = 0;
    for (; d + LANES <= n; d += LANES) acc += load(a + d) * load(b + d);
    float sum = hsum(acc);
    for (; d < n; d++) sum += a[d] * b[d];
    return sum;
}

static inline void axpy(float *restrict y, float a, const float *restrict x, int64_t n) {
    const vf va = splat(a);
    int64_t d = 0;
    for (; d + LANES <= n; d += LANES) store(y + d, load(y + d) + va * load(x + d));
    for (; d < n; d++) y[d] += a * x[d];
}

/* --- one (tile, kv head) pair ----------------------------------------------------------- */

struct shape {
    int64_t num_blocks, block_size, row_stride, head_stride, group, head_dim;
    float scale; /* row_stride = KVH * D (a K/V token row); head_stride = H * D (a query row) */
};

struct pair {
    const float *q;       /* the tile's first row, this kv head's first query head */
    const float *k, *v;   /* this kv head's row at block 0, offset 0 */
    const int64_t *table; /* the sequence's block table */
    const int64_t *ctx;   /* context length of each of the tile's rows (nondecreasing) */
    int64_t num_rows;
    float *out; /* as q */
};

/* Element offsets of the next n tokens' rows, advancing (block, offset) through the table.
 * Returns 1 if the table names a block outside the pool. */
static int walk(const struct shape *s, const int64_t *restrict table, int64_t n,
                int64_t *restrict rows, int64_t *block, int64_t *offset) {
    int64_t b = *block, o = *offset;
    for (int64_t t = 0; t < n; t++) {
        const int64_t id = table[b];
        if (id < 0 || id >= s->num_blocks) return 1;
        rows[t] = (id * s->block_size + o) * s->row_stride;
        if (++o == s->block_size) {
            o = 0;
            b++;
        }
    }
    *block = b;
    *offset = o;
    return 0;
}

/* p = exp(s - new max) in place over one chunk (n of CHUNK scores valid, n may be 0); updates
 * the running max and sum, rescaling acc [D] when the max grows. */
static inline void softmax_step(float *restrict s, int64_t n, float *restrict run_max,
                                float *restrict run_sum, float *restrict acc, int64_t head_dim) {
    for (int64_t t = n; t < CHUNK; t++) s[t] = -INFINITY; /* exp -> 0 */
    vf top = load(s);
    for (int64_t t = LANES; t < CHUNK; t += LANES) {
        const vf x = load(s + t);
        top = blend(x > top, x, top);
    }
    float new_max = *run_max;
    for (int l = 0; l < LANES; l++) new_max = top[l] > new_max ? top[l] : new_max;
    vf sum = splat(0.0f);
    for (int64_t t = 0; t < CHUNK; t += LANES) {
        const vf p = exp_nonpositive(load(s + t) - splat(new_max));
        store(s + t, p);
        sum += p;
    }
    if (new_max > *run_max && *run_sum > 0.0f) { /* rescale what came before */
        const float shrink = exp_nonpositive(splat(*run_max - new_max))[0];
        for (int64_t d = 0; d < head_dim; d++) acc[d] *= shrink;
        *run_sum *= shrink;
    }
    *run_max = new_max;
    *run_sum += hsum(sum);
}

/* Inlined into one copy per head size, so that head_dim is a constant in the inner loops.
 * Returns 0, or 1 for a block outside the pool (the pair's output is then undefined). */
static inline __attribute__((always_inline)) int attend(const struct shape *s,
                                                        const struct pair *p, int64_t head_dim) {
    const int64_t group = s->group, heads = p->num_rows * group, ctx = p->ctx[p->num_rows - 1];
    float scores[heads * CHUNK]; /* [rows * G, CHUNK] */
    float acc[heads * head_dim];  /* [rows * G, D] */
    float run_max[heads], run_sum[heads];
    const float *q[heads];
    int64_t rows[2][CHUNK]; /* row offsets of this chunk's tokens and the next chunk's */
    for (int64_t i = 0; i < heads * head_dim; i++) acc[i] = 0.0f;
    for (int64_t j = 0; j < heads; j++) {
        run_max[j] = -INFINITY;
        run_sum[j] = 0.0f;
        q[j] = p->q + (j / group) * s->head_stride + (j % group) * head_dim;
    }
    int64_t block = 0, offset = 0;
    if (walk(s, p->table, ctx < CHUNK ? ctx : CHUNK, rows[0], &block, &offset)) return 1;
    for (int64_t start = 0, cur = 0; start < ctx; start += CHUNK, cur ^= 1) {
        const int64_t n = ctx - start < CHUNK ? ctx - start : CHUNK;
        const int64_t next = ctx - start - n < CHUNK ? ctx - start - n : CHUNK;
        const int64_t *restrict here = rows[cur], *restrict ahead = rows[cur ^ 1];
        for (int64_t t = 0; t < n; t++) { /* 1. scores; prefetch the V rows of step 3 */
            const float *restrict k = p->k + here[t];
            for (int64_t d = 0; d < head_dim; d += LANES) __builtin_prefetch(p->v + here[t] + d);
            for (int64_t j = 0; j < heads; j++)
                scores[j * CHUNK + t] = dot(q[j], k, head_dim) * s->scale;
        }
        if (walk(s, p->table, next, rows[cur ^ 1], &block, &offset)) return 1;
        for (int64_t j = 0; j < heads; j++) { /* 2. online softmax over the row's own keys */
            const int64_t own = p->ctx[j / group] - start;
            softmax_step(scores + j * CHUNK, own < 0 ? 0 : own < n ? own : n, run_max + j,
                         run_sum + j, acc + j * head_dim, head_dim);
        }
        for (int64_t t = 0; t < n; t++) { /* 3. weighted values; prefetch the next K rows */
            const float *restrict v = p->v + here[t];
            if (t < next)
                for (int64_t d = 0; d < head_dim; d += LANES)
                    __builtin_prefetch(p->k + ahead[t] + d);
            for (int64_t j = 0; j < heads; j++)
                axpy(acc + j * head_dim, scores[j * CHUNK + t], v, head_dim);
        }
    }
    for (int64_t j = 0; j < heads; j++) {
        const float inv = 1.0f / run_sum[j];
        float *restrict o = p->out + (q[j] - p->q);
        for (int64_t d = 0; d < head_dim; d++) o[d] = acc[j * head_dim + d] * inv;
    }
    return 0;
}

static int attend_32(const struct shape *s, const struct pair *p) { return attend(s, p, 32); }
static int attend_64(const struct shape *s, const struct pair *p) { return attend(s, p, 64); }
static int attend_128(const struct shape *s, const struct pair *p) { return attend(s, p, 128); }
static int attend_any(const struct shape *s, const struct pair *p) {
    return attend(s, p, s->head_dim);
}

/* --- entry point ----------------------------------------------------------------------------- */

/* Returns 0; 1 if a block id lies outside [0, num_blocks); 2 if a context length lies outside
 * [1, max_blocks * block_size]; 3 if a row_seqs entry lies outside [0, num_seqs); 4 if the
 * tile list cannot be allocated. Pairs with bad input are skipped (their output is undefined). */
int kvsim_paged_attention_f32(const float *query, const float *key_cache,
                              const float *value_cache, const int64_t *block_tables,
                              const int64_t *row_seqs, const int64_t *context_lens, float *out,
                              int64_t num_rows, int64_t num_seqs, int64_t num_heads,
                              int64_t num_kv_heads, int64_t head_dim, int64_t num_blocks,
                              int64_t block_size, int64_t max_blocks, float scale,
                              int num_threads) {
    const struct shape s = {
        .num_blocks = num_blocks,
        .block_size = block_size,
        .row_stride = num_kv_heads * head_dim,
        .head_stride = num_heads * head_dim,
        .group = num_heads / num_kv_heads,
        .head_dim = head_dim,
        .scale = scale,
    };
    int (*const fn)(const struct shape *, const struct pair *) =
        head_dim == 32 ? attend_32 : head_dim == 64 ? attend_64
                                 : head_dim == 128 ? attend_128 : attend_any;
    const int64_t max_tile = s.group >= TILE_HEADS ? 1 : TILE_HEADS / s.group;
    for (int64_t r = 0; r < num_rows; r++) {
        const int64_t seq = row_seqs ? row_seqs[r] : r;
        if (seq < 0 || seq >= num_seqs) return 3;
        if (context_lens[r] < 1 || context_lens[r] > max_blocks * block_size) return 2;
    }
    /* tile i is rows [first[i], first[i + 1]): one sequence, consecutive positions */
    int64_t *first = malloc((size_t)(num_rows + 1) * sizeof *first);
    if (!first) return 4;
    int64_t num_tiles = 0;
    for (int64_t r = 0; r < num_rows; r++) {
        const int joins = r > 0 && row_seqs && row_seqs[r] == row_seqs[r - 1] &&
                          context_lens[r] == context_lens[r - 1] + 1 &&
                          r - first[num_tiles - 1] < max_tile;
        if (!joins) first[num_tiles++] = r;
    }
    first[num_tiles] = num_rows;
    int status = 0;
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads)
    for (int64_t i = 0; i < num_tiles * num_kv_heads; i++) {
        const int64_t tile = i / num_kv_heads, kv = i % num_kv_heads, r = first[tile];
        const int64_t offset = r * s.head_stride + kv * s.group * head_dim; /* [R, H, D] */
        const struct pair p = {
            .q = query + offset,
            .k = key_cache + kv * head_dim,
            .v = value_cache + kv * head_dim,
            .table = block_tables + (row_seqs ? row_seqs[r] : r) * max_blocks,
            .ctx = context_lens + r,
            .num_rows = first[tile + 1] - r,
            .out = out + offset,
        };
        if (fn(&s, &p)) {
#pragma omp atomic write
            status = 1;
        }
    }
    free(first);
    return status;
}

/*
 * coli_c_check: reads a coli store through the C ABI (store/ffi/include/coli_store.h) and checks
 * every expert and dense tensor against the SOURCE checkpoint's safetensors files, which it
 * parses itself. Dequantization and quantization are this program's own code, written from
 * docs/FORMAT.md section 6:
 *
 *   fp8 store   : raw e4m3 bytes and block scales equal the source's (bit-exact, lossless)
 *   bf16 store  : bits equal the source's BF16, or round-to-nearest-even of the source's f32
 *   int8 / int4 : scale = max(absmax / qmax, 1e-8) per row / group, q = clip(rint(w / s)),
 *                 exactly; and |w_deq - w_src| <= s / 2 (within half a quantization step)
 *   f32 store   : bits equal the source's value
 *   mxfp4 store : e2m1 bytes and e8m0 scales equal the source's MXFP4 blocks (bit-exact,
 *                 lossless; gpt-oss's fused [E, 2I, H/32, 16] tensors, gate = even rows)
 *   biases      : f32 bits equal the source's widened BF16 bias (gpt-oss); none elsewhere
 *
 * where w_src = e4m3(q) * scale (FP8 source, in f32), e2m1(q) * 2^(e - 127) (MXFP4 source) or
 * the widened BF16/F32 value. It also
 * checks its own dequantization against coli_dequantize_row, the caller-buffer fetch against
 * the library-owned fetch, the batch fetch, stats and error codes.
 *
 * Usage: coli_c_check STORE_DIR CHECKPOINT_DIR
 * Exit status 0 when every check passes, 1 on a mismatch (the first ones are printed), 2 on a
 * usage or setup error.
 */
#define _GNU_SOURCE
#include "coli_store.h"

#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

_Static_assert(sizeof(coli_open_options) == 32, "coli_open_options layout");
_Static_assert(sizeof(coli_stats) == 16, "coli_stats layout");
_Static_assert(sizeof(coli_expert_key) == 8, "coli_expert_key layout");
_Static_assert(sizeof(coli_expert_info) == 64, "coli_expert_info layout");
_Static_assert(sizeof(coli_matrix_view) == 72, "coli_matrix_view layout");
_Static_assert(sizeof(coli_dense_view) == 104, "coli_dense_view layout");

static long g_failures = 0;
static long g_checked_values = 0;

#define FAIL(...)                                   \
    do {                                            \
        if (g_failures < 20) {                      \
            fprintf(stderr, "MISMATCH: ");          \
            fprintf(stderr, __VA_ARGS__);           \
            fprintf(stderr, "\n");                  \
        }                                           \
        g_failures++;                               \
    } while (0)

#define CHECK_OK(call)                                                                   \
    do {                                                                                 \
        coli_status st_ = (call);                                                        \
        if (st_ != COLI_OK) {                                                            \
            fprintf(stderr, "%s:%d: %s failed: %s: %s\n", __FILE__, __LINE__, #call,     \
                    coli_status_name(st_), coli_last_error_message());                   \
            exit(1);                                                                     \
        }                                                                                \
    } while (0)

/* ---- source checkpoint: safetensors files parsed here ---------------------------------- */

enum src_dtype { SRC_F8, SRC_BF16, SRC_F32, SRC_U8 };

typedef struct {
    char *path;
    uint8_t *bytes;  /* whole file */
    size_t len;
    const char *header; /* JSON header (NUL-terminated copy) */
    size_t data_start;  /* 8 + header length */
} shard;

typedef struct {
    enum src_dtype dtype;
    size_t ndim, rows, cols; /* rows/cols: of a 1-D or 2-D tensor */
    size_t shape[4];
    const uint8_t *data;
} src_tensor;

static shard *g_shards = NULL;
static size_t g_nshards = 0;

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of memory (%zu bytes)\n", n);
        exit(2);
    }
    return p;
}

static void load_shards(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) {
        perror(dir);
        exit(2);
    }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t n = strlen(e->d_name);
        if (n < 12 || strcmp(e->d_name + n - 12, ".safetensors") != 0) continue;
        shard s;
        memset(&s, 0, sizeof s);
        s.path = xmalloc(strlen(dir) + n + 2);
        sprintf(s.path, "%s/%s", dir, e->d_name);
        FILE *f = fopen(s.path, "rb");
        if (!f) {
            perror(s.path);
            exit(2);
        }
        fseek(f, 0, SEEK_END);
        long len = ftell(f);
        fseek(f, 0, SEEK_SET);
        s.len = (size_t)len;
        s.bytes = xmalloc(s.len);
        if (fread(s.bytes, 1, s.len, f) != s.len) {
            fprintf(stderr, "%s: short read\n", s.path);
            exit(2);
        }
        fclose(f);
        uint64_t hlen = 0;
        for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | s.bytes[i];
        if (s.len < 8 || hlen > s.len - 8) {
            fprintf(stderr, "%s: bad safetensors header length\n", s.path);
            exit(2);
        }
        char *h = xmalloc(hlen + 1);
        memcpy(h, s.bytes + 8, hlen);
        h[hlen] = 0;
        s.header = h;
        s.data_start = 8 + hlen;
        g_shards = realloc(g_shards, (g_nshards + 1) * sizeof(shard));
        if (!g_shards) exit(2);
        g_shards[g_nshards++] = s;
    }
    closedir(d);
    if (g_nshards == 0) {
        fprintf(stderr, "%s: no .safetensors files\n", dir);
        exit(2);
    }
}

static void free_shards(void) {
    for (size_t i = 0; i < g_nshards; i++) {
        free(g_shards[i].path);
        free(g_shards[i].bytes);
        free((void *)g_shards[i].header);
    }
    free(g_shards);
}

/* Finds `"key"` followed by optional blanks and ':' inside [p, end); returns the position after
 * the colon and blanks, or NULL. */
static const char *json_key(const char *p, const char *end, const char *key) {
    size_t kl = strlen(key);
    for (const char *q = p; q + kl + 2 <= end; q++) {
        if (q[0] == '"' && strncmp(q + 1, key, kl) == 0 && q[kl + 1] == '"') {
            const char *r = q + kl + 2;
            while (r < end && (*r == ' ' || *r == '\t' || *r == '\n' || *r == '\r')) r++;
            if (r < end && *r == ':') {
                r++;
                while (r < end && (*r == ' ' || *r == '\t' || *r == '\n' || *r == '\r')) r++;
                return r;
            }
        }
    }
    return NULL;
}

/* Parses up to `max` unsigned integers of a JSON array starting at '['; returns the count. */
static size_t json_uints(const char *p, const char *end, uint64_t *out, size_t max) {
    if (p >= end || *p != '[') return 0;
    p++;
    size_t n = 0;
    while (p < end && *p != ']') {
        if (*p >= '0' && *p <= '9') {
            char *q;
            unsigned long long v = strtoull(p, &q, 10);
            if (n < max) out[n] = v;
            n++;
            p = q;
        } else {
            p++;
        }
    }
    return n;
}

/* Looks up tensor `name` in the shards; returns 0 when found. */
static int find_tensor(const char *name, src_tensor *t) {
    size_t nl = strlen(name);
    char *quoted = xmalloc(nl + 3);
    sprintf(quoted, "\"%s\"", name);
    for (size_t i = 0; i < g_nshards; i++) {
        const char *h = g_shards[i].header;
        const char *hit = strstr(h, quoted);
        if (!hit) continue;
        const char *obj = strchr(hit + nl + 2, '{');
        const char *end = obj ? strchr(obj, '}') : NULL;
        if (!obj || !end) break;
        const char *dt = json_key(obj, end, "dtype");
        const char *sh = json_key(obj, end, "shape");
        const char *of = json_key(obj, end, "data_offsets");
        if (!dt || !sh || !of) break;
        if (strncmp(dt, "\"F8_E4M3\"", 9) == 0) t->dtype = SRC_F8;
        else if (strncmp(dt, "\"BF16\"", 6) == 0) t->dtype = SRC_BF16;
        else if (strncmp(dt, "\"F32\"", 5) == 0) t->dtype = SRC_F32;
        else if (strncmp(dt, "\"U8\"", 4) == 0) t->dtype = SRC_U8;
        else {
            fprintf(stderr, "%s: unsupported source dtype %.12s\n", name, dt);
            exit(2);
        }
        uint64_t shape[4], offs[2];
        size_t nd = json_uints(sh, end, shape, 4);
        if (json_uints(of, end, offs, 2) != 2 || nd < 1 || nd > 4) break;
        t->ndim = nd;
        t->rows = nd == 2 ? shape[0] : 1;
        t->cols = nd == 2 ? shape[1] : shape[0];
        size_t esz = (t->dtype == SRC_F8 || t->dtype == SRC_U8) ? 1 : t->dtype == SRC_BF16 ? 2 : 4;
        size_t count = 1;
        for (size_t k = 0; k < 4; k++) {
            t->shape[k] = k < nd ? shape[k] : 1;
            count *= t->shape[k];
        }
        if (offs[1] - offs[0] != count * esz ||
            g_shards[i].data_start + offs[1] > g_shards[i].len) {
            fprintf(stderr, "%s: inconsistent safetensors entry\n", name);
            exit(2);
        }
        t->data = g_shards[i].bytes + g_shards[i].data_start + offs[0];
        free(quoted);
        return 0;
    }
    free(quoted);
    return -1;
}

static uint16_t rd16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }
static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}
static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}
static float bf16_f32(uint16_t b) { return bits_f32((uint32_t)b << 16); }

/* float8 e4m3fn -> f32 (FORMAT.md section 6): 1 sign, 4 exponent bits (bias 7), 3 mantissa. */
static float e4m3(uint8_t b) {
    int sign = b >> 7, e = (b >> 3) & 15, m = b & 7;
    float v;
    if (e == 15 && m == 7) return NAN;
    if (e == 0) v = ldexpf((float)m / 8.0f, -6);
    else v = ldexpf(1.0f + (float)m / 8.0f, e - 7);
    return sign ? -v : v;
}

/* MXFP4 element (OCP Microscaling Formats v1.0): e2m1 code -> value; 1 sign bit, 2 exponent
 * bits (bias 1), 1 mantissa bit. */
static float e2m1(int code) {
    static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    return (code & 8) ? -mag[code & 7] : mag[code & 7];
}

/* e8m0 scale byte -> 2^(e - 127) (255 is NaN and never stored). */
static float e8m0(uint8_t e) { return ldexpf(1.0f, (int)e - 127); }

/* f32 -> bf16, round to nearest, ties to even. */
static uint16_t f32_bf16_rne(float f) {
    uint32_t u = f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* A source matrix with its (optional) FP8 block scales, as f32 values; or (mx = 1) rows of one
 * expert's slice of fused MXFP4 tensors: matrix row r is row r * mx_step + mx_off of
 * mx_blocks ([R, cols/32, 16] bytes) and mx_scales ([R, cols/32] e8m0 bytes). */
typedef struct {
    const char *name;
    src_tensor w;
    int has_scale;
    src_tensor s;
    int mx;
    const uint8_t *mx_blocks, *mx_scales;
    size_t mx_step, mx_off;
} src_matrix;

static void load_src_matrix(const char *name, src_matrix *m) {
    m->name = name;
    m->mx = 0;
    if (find_tensor(name, &m->w) != 0) {
        fprintf(stderr, "source tensor %s not found in the checkpoint\n", name);
        exit(2);
    }
    m->has_scale = 0;
    if (m->w.dtype == SRC_F8) {
        char sname[512];
        snprintf(sname, sizeof sname, "%s_scale_inv", name);
        if (find_tensor(sname, &m->s) != 0) {
            fprintf(stderr, "source scale %s not found\n", sname);
            exit(2);
        }
        m->has_scale = 1;
    }
}

/* The source's scale of FP8 block (br, bc), widened to f32. */
static float src_block_scale(const src_matrix *m, size_t br, size_t bc) {
    size_t i = br * m->s.cols + bc;
    return m->s.dtype == SRC_BF16 ? bf16_f32(rd16(m->s.data + 2 * i)) : bits_f32(rd32(m->s.data + 4 * i));
}

/* The source bytes of MXFP4 matrix row r: cols/2 e2m1 bytes, cols/32 e8m0 scales. */
static const uint8_t *mx_row(const src_matrix *m, size_t r) {
    return m->mx_blocks + (r * m->mx_step + m->mx_off) * (m->w.cols / 2);
}
static const uint8_t *mx_row_scales(const src_matrix *m, size_t r) {
    return m->mx_scales + (r * m->mx_step + m->mx_off) * (m->w.cols / 32);
}

/* Source value [r][c] as f32: e4m3(q) * scale (in f32), e2m1(q) * 2^(e - 127), or the widened
 * BF16/F32 value. */
static float src_value(const src_matrix *m, size_t r, size_t c) {
    if (m->mx) {
        uint8_t b = mx_row(m, r)[c / 2];
        return e2m1(c % 2 == 0 ? (b & 15) : (b >> 4)) * e8m0(mx_row_scales(m, r)[c / 32]);
    }
    size_t i = r * m->w.cols + c;
    switch (m->w.dtype) {
    case SRC_F8: return e4m3(m->w.data[i]) * src_block_scale(m, r / 128, c / 128);
    case SRC_BF16: return bf16_f32(rd16(m->w.data + 2 * i));
    default: return bits_f32(rd32(m->w.data + 4 * i));
    }
}

/* ---- this program's own dequantization of a store matrix (FORMAT.md section 6) --------- */

static float own_dequant(const coli_matrix_view *v, size_t r, size_t c) {
    switch (v->encoding) {
    case COLI_ENC_F32: return bits_f32(rd32(v->data + 4 * (r * v->cols + c)));
    case COLI_ENC_BF16: return bf16_f32(rd16(v->data + 2 * (r * v->cols + c)));
    case COLI_ENC_FP8: {
        size_t bcols = (v->cols + 127) / 128;
        return e4m3(v->data[r * v->cols + c]) * v->scales[(r / 128) * bcols + c / 128];
    }
    case COLI_ENC_INT8: return (float)(int8_t)v->data[r * v->cols + c] * v->scales[r];
    case COLI_ENC_INT4: {
        size_t stride = (v->cols + 1) / 2, g = v->group_size, ng = (v->cols + g - 1) / g;
        uint8_t b = v->data[r * stride + c / 2];
        int nib = (c % 2 == 0) ? (b & 15) : (b >> 4);
        return (float)(nib - 8) * v->scales[r * ng + c / g];
    }
    case COLI_ENC_MXFP4: {
        uint8_t b = v->data[r * ((v->cols + 1) / 2) + c / 2];
        return e2m1(c % 2 == 0 ? (b & 15) : (b >> 4)) * e8m0(v->e8m0_scales[r * ((v->cols + 31) / 32) + c / 32]);
    }
    }
    fprintf(stderr, "unknown encoding %u\n", v->encoding);
    exit(1);
}

/* Quantized integer of [r][c] for int8/int4 views. */
static int own_q(const coli_matrix_view *v, size_t r, size_t c) {
    if (v->encoding == COLI_ENC_INT8) return (int8_t)v->data[r * v->cols + c];
    size_t stride = (v->cols + 1) / 2;
    uint8_t b = v->data[r * stride + c / 2];
    return ((c % 2 == 0) ? (b & 15) : (b >> 4)) - 8;
}

/* Compares one store matrix with its source. */
static void check_matrix(const char *what, const coli_matrix_view *v, const src_matrix *src) {
    if (v->rows != src->w.rows || v->cols != src->w.cols) {
        FAIL("%s: store shape [%zu, %zu], source [%zu, %zu]", what, v->rows, v->cols, src->w.rows,
             src->w.cols);
        return;
    }
    size_t rows = v->rows, cols = v->cols;
    float *lib = xmalloc(cols * sizeof(float));
    for (size_t r = 0; r < rows; r++) {
        /* 1. Own dequantization == the library's reference dequantization (bitwise). */
        CHECK_OK(coli_dequantize_row(v, r, lib, cols));
        for (size_t c = 0; c < cols; c++) {
            float mine = own_dequant(v, r, c);
            if (f32_bits(mine) != f32_bits(lib[c])) {
                FAIL("%s [%zu][%zu]: own dequantization %.9g, coli_dequantize_row %.9g", what, r, c,
                     mine, lib[c]);
            }
        }
        /* 2. Against the source. */
        switch (v->encoding) {
        case COLI_ENC_MXFP4:
            if (!src->mx) {
                FAIL("%s: mxfp4 store from a non-MXFP4 source", what);
                break;
            }
            if (memcmp(v->data + r * (cols / 2), mx_row(src, r), cols / 2) != 0)
                FAIL("%s row %zu: mxfp4 bytes differ from the source", what, r);
            if (memcmp(v->e8m0_scales + r * (cols / 32), mx_row_scales(src, r), cols / 32) != 0)
                FAIL("%s row %zu: e8m0 scales differ from the source", what, r);
            g_checked_values += (long)cols;
            break;
        case COLI_ENC_FP8:
            if (src->w.dtype != SRC_F8) {
                FAIL("%s: fp8 store from a non-FP8 source", what);
                break;
            }
            if (memcmp(v->data + r * cols, src->w.data + r * cols, cols) != 0)
                FAIL("%s row %zu: fp8 bytes differ from the source", what, r);
            if (r % 128 == 0) {
                size_t bcols = (cols + 127) / 128;
                for (size_t bc = 0; bc < bcols; bc++) {
                    float want = src_block_scale(src, r / 128, bc);
                    float got = v->scales[(r / 128) * bcols + bc];
                    if (f32_bits(want) != f32_bits(got))
                        FAIL("%s block (%zu, %zu): scale %.9g, source %.9g", what, r / 128, bc, got, want);
                }
            }
            g_checked_values += (long)cols;
            break;
        case COLI_ENC_BF16:
        case COLI_ENC_F32:
            for (size_t c = 0; c < cols; c++) {
                float w = src_value(src, r, c);
                uint32_t got, want;
                if (v->encoding == COLI_ENC_BF16) {
                    got = rd16(v->data + 2 * (r * cols + c));
                    want = src->w.dtype == SRC_BF16 ? rd16(src->w.data + 2 * (r * cols + c)) : f32_bf16_rne(w);
                } else {
                    got = rd32(v->data + 4 * (r * cols + c));
                    want = f32_bits(w);
                }
                if (got != want) FAIL("%s [%zu][%zu]: bits %#x, source gives %#x", what, r, c, got, want);
            }
            g_checked_values += (long)cols;
            break;
        case COLI_ENC_INT8:
        case COLI_ENC_INT4: {
            int qmax = v->encoding == COLI_ENC_INT8 ? 127 : 7;
            int qmin = -qmax - 1;
            size_t g = v->encoding == COLI_ENC_INT8 ? cols : v->group_size;
            size_t ng = (cols + g - 1) / g;
            for (size_t gi = 0; gi < ng; gi++) {
                size_t c0 = gi * g, c1 = c0 + g < cols ? c0 + g : cols;
                float absmax = 0.0f;
                for (size_t c = c0; c < c1; c++) absmax = fmaxf(absmax, fabsf(src_value(src, r, c)));
                float s = absmax / (float)qmax;
                if (s < 1e-8f) s = 1e-8f;
                float got_s = v->scales[r * ng + gi];
                if (f32_bits(got_s) != f32_bits(s))
                    FAIL("%s row %zu group %zu: scale %.9g, expected max(absmax / %d, 1e-8) = %.9g", what, r,
                         gi, got_s, qmax, s);
                for (size_t c = c0; c < c1; c++) {
                    float w = src_value(src, r, c);
                    float qf = rintf(w / s);
                    int q = qf < (float)qmin ? qmin : qf > (float)qmax ? qmax : (int)qf;
                    if (own_q(v, r, c) != q)
                        FAIL("%s [%zu][%zu]: q %d, expected clip(rint(%.9g / %.9g)) = %d", what, r, c,
                             own_q(v, r, c), w, s, q);
                    float deq = own_dequant(v, r, c);
                    float err = fabsf(deq - w);
                    if (!(err <= got_s * 0.5f + 1e-6f * (fabsf(w) + got_s)))
                        FAIL("%s [%zu][%zu]: |%.9g - %.9g| = %.3g exceeds half a step (%.3g)", what, r, c, deq,
                             w, err, got_s * 0.5f);
                }
            }
            if (v->encoding == COLI_ENC_INT4 && cols % 2 == 1) {
                uint8_t last = v->data[r * ((cols + 1) / 2) + cols / 2];
                if ((last >> 4) != 8) FAIL("%s row %zu: padding nibble %d, expected 8", what, r, last >> 4);
            }
            g_checked_values += (long)cols;
            break;
        }
        default: FAIL("%s: unknown encoding %u", what, v->encoding);
        }
    }
    free(lib);
}

/* ---- the run --------------------------------------------------------------------------- */

static const char *matrix_suffix(const char *family, int which) {
    static const char *mixtral[3] = {"w1", "w3", "w2"};
    static const char *hf[3] = {"gate_proj", "up_proj", "down_proj"};
    return strcmp(family, "mixtral") == 0 ? mixtral[which] : hf[which];
}

/* Compares the store's bias of one expert matrix with `want` (BF16 [n] values, or NULL when the
 * source has none). */
static void check_bias(const char *what, const coli_expert *e, uint32_t which, const uint8_t *want,
                       size_t n) {
    const float *b = NULL;
    size_t len = 0;
    CHECK_OK(coli_expert_bias(e, which, &b, &len));
    if (want == NULL) {
        if (b != NULL || len != 0) FAIL("%s: a bias of %zu values, the source has none", what, len);
        return;
    }
    if (b == NULL || len != n || ((uintptr_t)b % 64) != 0) {
        FAIL("%s: bias %p of %zu values, expected %zu", what, (const void *)b, len, n);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        float w = bf16_f32(rd16(want + 2 * i));
        if (f32_bits(b[i]) != f32_bits(w)) FAIL("%s bias [%zu]: %.9g, source %.9g", what, i, b[i], w);
    }
    g_checked_values += (long)n;
}

/* gpt-oss: expert e's gate (which 0), up (1) or down (2) out of the layer's fused MXFP4 tensors
 * (gate_up rows interleaved: gate row i = row 2i, up row i = row 2i + 1), and its bias. */
static void check_gpt_oss_matrix(const coli_expert_info *info, const coli_expert *e, int which,
                                 const coli_matrix_view *v) {
    char base[256], name[320], what[320];
    snprintf(base, sizeof base, "model.layers.%u.mlp.experts.%s", info->layer,
             which == 2 ? "down_proj" : "gate_up_proj");
    src_tensor blocks, scales, bias;
    snprintf(name, sizeof name, "%s_blocks", base);
    if (find_tensor(name, &blocks) != 0 || blocks.dtype != SRC_U8 || blocks.ndim != 4) {
        fprintf(stderr, "source tensor %s (U8 [E, R, C/32, 16]) not found\n", name);
        exit(2);
    }
    snprintf(name, sizeof name, "%s_scales", base);
    if (find_tensor(name, &scales) != 0 || scales.dtype != SRC_U8 || scales.ndim != 3) {
        fprintf(stderr, "source tensor %s (U8 [E, R, C/32]) not found\n", name);
        exit(2);
    }
    snprintf(name, sizeof name, "%s_bias", base);
    if (find_tensor(name, &bias) != 0 || bias.dtype != SRC_BF16 || bias.ndim != 2) {
        fprintf(stderr, "source tensor %s (BF16 [E, R]) not found\n", name);
        exit(2);
    }
    size_t rows = which == 2 ? info->hidden : info->intermediate, cols = v->cols;
    size_t src_rows = blocks.shape[1], nblk = blocks.shape[2];
    if (info->expert >= blocks.shape[0] || nblk * 32 != cols || blocks.shape[3] != 16 ||
        src_rows != (which == 2 ? rows : 2 * rows) || scales.shape[1] != src_rows || scales.shape[2] != nblk ||
        bias.cols != src_rows) {
        FAIL("%s: source shape does not match the store's [%zu, %zu]", base, rows, cols);
        return;
    }
    src_matrix src;
    memset(&src, 0, sizeof src);
    src.name = base;
    src.w.dtype = SRC_U8;
    src.w.ndim = 2;
    src.w.rows = rows;
    src.w.cols = cols;
    src.mx = 1;
    src.mx_blocks = blocks.data + (size_t)info->expert * src_rows * nblk * 16;
    src.mx_scales = scales.data + (size_t)info->expert * src_rows * nblk;
    src.mx_step = which == 2 ? 1 : 2;
    src.mx_off = which == 1 ? 1 : 0;
    snprintf(what, sizeof what, "%s expert %u %s", base, info->expert, matrix_suffix("gpt_oss", which));
    check_matrix(what, v, &src);
    /* The bias, de-interleaved the same way (BF16 values). */
    const uint8_t *b = bias.data + 2 * (size_t)info->expert * src_rows;
    uint8_t *want = xmalloc(2 * rows);
    for (size_t r = 0; r < rows; r++) memcpy(want + 2 * r, b + 2 * (r * src.mx_step + src.mx_off), 2);
    check_bias(what, e, (uint32_t)which, want, rows);
    free(want);
}

static void check_expert(const char *family, const coli_expert *e) {
    coli_expert_info info;
    CHECK_OK(coli_expert_get_info(e, &info));
    if (info.record_len % 4096 != 0 || info.payload_len > info.record_len || ((uintptr_t)info.record % 4096) != 0)
        FAIL("layer %u expert %u: record %p len %zu payload %zu not aligned", info.layer, info.expert,
             (const void *)info.record, info.record_len, info.payload_len);
    for (size_t i = info.payload_len; i < info.record_len; i++) {
        if (info.record[i] != 0) {
            FAIL("layer %u expert %u: padding byte %zu is not zero", info.layer, info.expert, i);
            break;
        }
    }
    for (int which = 0; which < 3; which++) {
        coli_matrix_view v;
        CHECK_OK(coli_expert_matrix(e, (uint32_t)which, &v));
        size_t want_rows = which == 2 ? info.hidden : info.intermediate;
        if (v.rows != want_rows || v.encoding != info.encoding || ((uintptr_t)v.data % 64) != 0)
            FAIL("layer %u expert %u matrix %d: view rows %zu encoding %u", info.layer, info.expert, which,
                 v.rows, v.encoding);
        int gpt_oss = strcmp(family, "gpt_oss") == 0;
        if (gpt_oss != ((info.flags & COLI_RECORD_FLAG_BIASES) != 0))
            FAIL("layer %u expert %u: flags %#x for family %s", info.layer, info.expert, info.flags, family);
        if (gpt_oss) {
            check_gpt_oss_matrix(&info, e, which, &v);
            continue;
        }
        char name[256];
        snprintf(name, sizeof name, "model.layers.%u.%s.experts.%u.%s.weight", info.layer,
                 strcmp(family, "mixtral") == 0 ? "block_sparse_moe" : "mlp", info.expert,
                 matrix_suffix(family, which));
        src_matrix src;
        load_src_matrix(name, &src);
        check_matrix(name, &v, &src);
        check_bias(name, e, (uint32_t)which, NULL, 0);
    }
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s STORE_DIR CHECKPOINT_DIR\n", argv[0]);
        return 2;
    }
    if (coli_abi_version() != COLI_ABI_VERSION) {
        fprintf(stderr, "library ABI %u, header %u\n", coli_abi_version(), COLI_ABI_VERSION);
        return 1;
    }
    load_shards(argv[2]);

    coli_open_options opts;
    CHECK_OK(coli_open_options_init(&opts));
    opts.io_mode = COLI_IO_AUTO;
    coli_store *store = NULL;
    CHECK_OK(coli_store_open(argv[1], &opts, &store));

    const char *family, *id, *cfg;
    uint32_t num_layers, enc, gs;
    size_t nlayers, align;
    CHECK_OK(coli_store_family(store, &family));
    CHECK_OK(coli_store_id(store, &id));
    CHECK_OK(coli_store_config_json(store, &cfg));
    CHECK_OK(coli_store_num_layers(store, &num_layers));
    CHECK_OK(coli_store_expert_layer_count(store, &nlayers));
    CHECK_OK(coli_store_expert_encoding(store, &enc, &gs));
    CHECK_OK(coli_store_buffer_alignment(store, &align));
    if (strlen(id) != 32 || strstr(cfg, "\"model_type\"") == NULL || nlayers == 0 || align < 4096)
        FAIL("manifest: id %s, %zu expert layers, alignment %zu", id, nlayers, align);
    printf("store %s: family %s, %u layers, %zu expert layers, expert encoding %u (group %u)\n", id, family,
           num_layers, nlayers, enc, gs);

    uint64_t fetched = 0, fetched_bytes = 0;
    void *buf = NULL;
    size_t buf_cap = 0;
    for (size_t li = 0; li < nlayers; li++) {
        uint32_t layer, n, n2;
        CHECK_OK(coli_store_expert_layer(store, li, &layer, &n));
        CHECK_OK(coli_store_layer_num_experts(store, layer, &n2));
        if (n != n2 || n == 0) FAIL("layer %u: %u vs %u experts", layer, n, n2);
        /* All experts of the layer in one batch fetch (library-owned buffers). */
        coli_expert_key *keys = xmalloc(n * sizeof *keys);
        coli_expert **hs = xmalloc(n * sizeof *hs);
        for (uint32_t x = 0; x < n; x++) {
            keys[x].layer = layer;
            keys[x].expert = x;
        }
        CHECK_OK(coli_fetch_experts(store, keys, n, hs));
        for (uint32_t x = 0; x < n; x++) {
            uint32_t h, in;
            size_t rl;
            CHECK_OK(coli_store_expert_dims(store, layer, x, &h, &in));
            CHECK_OK(coli_expert_record_len(store, layer, x, &rl));
            coli_expert_info info;
            CHECK_OK(coli_expert_get_info(hs[x], &info));
            if (info.layer != layer || info.expert != x || info.hidden != h || info.intermediate != in ||
                info.record_len != rl)
                FAIL("layer %u expert %u: info disagrees with the manifest queries", layer, x);
            check_expert(family, hs[x]);
            fetched++;
            fetched_bytes += rl;
            /* The caller-buffer fetch of the same expert gives the same bytes. */
            if (rl > buf_cap) {
                free(buf);
                buf_cap = rl;
                buf = aligned_alloc(align, (rl + align - 1) / align * align);
                if (!buf) return 2;
            }
            coli_expert *into = NULL;
            CHECK_OK(coli_fetch_expert_into(store, layer, x, buf, buf_cap, &into));
            coli_expert_info info2;
            CHECK_OK(coli_expert_get_info(into, &info2));
            if (info2.record != (const uint8_t *)buf || info2.record_len != rl ||
                memcmp(info2.record, info.record, rl) != 0)
                FAIL("layer %u expert %u: caller-buffer fetch differs", layer, x);
            if (x == 0) check_expert(family, into);
            coli_expert_release(into);
            fetched++;
            fetched_bytes += rl;
            coli_expert_release(hs[x]);
        }
        free(keys);
        free(hs);
    }

    /* Dense tensors: every one against the source tensor of the same name. */
    size_t nd;
    CHECK_OK(coli_dense_count(store, &nd));
    for (size_t i = 0; i < nd; i++) {
        const char *name;
        coli_dense_view dv;
        CHECK_OK(coli_dense_name(store, i, &name));
        CHECK_OK(coli_dense_get(store, name, &dv));
        if (strcmp(dv.name, name) != 0 || (dv.ndim != 1 && dv.ndim != 2)) FAIL("dense %s: bad view", name);
        src_matrix src;
        load_src_matrix(name, &src);
        if (src.w.ndim != dv.ndim) FAIL("dense %s: %u dims, source %zu", name, dv.ndim, src.w.ndim);
        check_matrix(name, &dv.matrix, &src);
    }

    /* Stats and error paths. */
    coli_stats st;
    CHECK_OK(coli_store_stats(store, &st));
    if (st.reads != fetched || st.bytes_read != fetched_bytes)
        FAIL("stats: %llu reads / %llu bytes, expected %llu / %llu", (unsigned long long)st.reads,
             (unsigned long long)st.bytes_read, (unsigned long long)fetched, (unsigned long long)fetched_bytes);
    coli_expert *none = NULL;
    coli_status rc = coli_fetch_expert(store, 100000, 0, &none);
    if (rc != COLI_ERR_NOT_FOUND || none != NULL || strstr(coli_last_error_message(), "100000") == NULL)
        FAIL("missing expert: %s (%s)", coli_status_name(rc), coli_last_error_message());
    uint32_t first_layer, first_n;
    CHECK_OK(coli_store_expert_layer(store, 0, &first_layer, &first_n));
    rc = coli_fetch_expert_into(store, first_layer, 0, (char *)buf + 8, buf_cap - 8, &none);
    if (rc != COLI_ERR_BUFFER) FAIL("misaligned buffer: %s", coli_status_name(rc));
    rc = coli_store_num_layers(NULL, &num_layers);
    if (rc != COLI_ERR_NULL_ARGUMENT) FAIL("NULL store: %s", coli_status_name(rc));
    rc = coli_dense_get(store, "no.such.tensor", NULL);
    if (rc != COLI_ERR_NULL_ARGUMENT) FAIL("NULL out: %s", coli_status_name(rc));
    coli_dense_view dv;
    rc = coli_dense_get(store, "no.such.tensor", &dv);
    if (rc != COLI_ERR_NOT_FOUND) FAIL("unknown tensor: %s", coli_status_name(rc));
    const char *mirror = "/nonexistent/mirror";
    opts.mirror_dirs = &mirror;
    opts.mirror_count = 1;
    coli_store *s2 = NULL;
    rc = coli_store_open(argv[1], &opts, &s2);
    /* A mirror directory that does not exist: an I/O error naming it, no handle. */
    if (rc != COLI_ERR_IO || s2 != NULL) FAIL("mirrors: %s", coli_status_name(rc));

    free(buf);
    coli_store_close(store);
    free_shards();
    printf("%ld values checked against the source, %llu expert fetches, %zu dense tensors: %s\n",
           g_checked_values, (unsigned long long)fetched, nd, g_failures ? "FAILED" : "ok");
    if (g_failures) fprintf(stderr, "%ld mismatches\n", g_failures);
    return g_failures ? 1 : 0;
}

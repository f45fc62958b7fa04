/*
 * coli_store.h - C ABI of the coli block store (library: libcoli_store_ffi.{so,a}).
 *
 * A coli store is a directory holding every routed expert of a Mixture-of-Experts model as one
 * aligned, checksummed record, plus dense tensors and the model's files (format:
 * docs/FORMAT.md). This header lets C/C++ engines open a store, query its manifest, fetch
 * experts and read dense tensors. Full documentation and an example: docs/C_API.md.
 *
 * Conventions:
 *   - Functions return a coli_status (COLI_OK = 0 on success); results come back through
 *     out-pointers, written only on success.
 *   - After a failure, coli_last_error_message() gives a message (per thread).
 *   - NULL for a required pointer gives COLI_ERR_NULL_ARGUMENT.
 *   - A coli_store may be shared by several threads; a coli_expert is immutable after its
 *     fetch (readable from several threads) and released exactly once.
 *   - Sizes are in bytes unless said otherwise; matrices are row-major [rows, cols] with
 *     rows = output features, as in the source checkpoint.
 *
 * Hand-written; kept in sync with the Rust sources in store/ffi/src (the tests compile it, check the
 * struct sizes and that it declares every exported function).
 */
#ifndef COLI_STORE_H
#define COLI_STORE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Version of this ABI; compare with coli_abi_version() at run time. */
#define COLI_ABI_VERSION 2u

/* ---- status codes -------------------------------------------------------------------- */

typedef int32_t coli_status;

enum {
    COLI_OK = 0,
    COLI_ERR_NULL_ARGUMENT = 1,     /* a required pointer argument was NULL */
    COLI_ERR_INVALID_ARGUMENT = 2,  /* out-of-range index, bad option, inconsistent view */
    COLI_ERR_IO = 3,                /* operating-system I/O error (message names the file) */
    COLI_ERR_FORMAT = 4,            /* damaged store / not a store (names file and field) */
    COLI_ERR_NEWER_VERSION = 5,     /* written by a newer format version */
    COLI_ERR_INCOMPLETE = 6,        /* experts listed in MANIFEST are missing */
    COLI_ERR_CHECKSUM = 7,          /* a record/tensor failed its checksum */
    COLI_ERR_NOT_FOUND = 8,         /* no such expert, layer or dense tensor */
    COLI_ERR_BUFFER = 9,            /* caller buffer too small or misaligned */
    COLI_ERR_UNSUPPORTED = 10,      /* reserved: feature not supported (no current call) */
    COLI_ERR_PANIC = 11             /* internal error (a bug); the message says where */
};

/* Message of the most recent failed call on this thread ("" if none). Never NULL; valid until
 * the next failing coli_* call on the same thread. */
const char *coli_last_error_message(void);

/* Static name of a status code ("COLI_ERR_IO", ...; "COLI_ERR_UNKNOWN" otherwise). */
const char *coli_status_name(coli_status status);

uint32_t coli_abi_version(void);     /* COLI_ABI_VERSION of the library */
uint32_t coli_format_version(void);  /* newest store format version the library reads */

/* ---- encodings (docs/FORMAT.md section 6) ---------------------------------------------- */

enum {
    COLI_ENC_F32 = 1,   /* little-endian f32, no scales */
    COLI_ENC_BF16 = 2,  /* bfloat16 bit patterns (u16), no scales */
    COLI_ENC_FP8 = 3,   /* e4m3fn bytes; f32 scale per 128x128 block [ceil(r/128), ceil(c/128)] */
    COLI_ENC_INT8 = 4,  /* i8; f32 scale per row */
    COLI_ENC_INT4 = 5,  /* two per byte (low nibble = even column, q = nibble - 8);
                           f32 scale per group_size columns [rows, ceil(cols/group_size)] */
    COLI_ENC_MXFP4 = 6, /* format version 2: e2m1 values, two per byte (low nibble = even
                           column); e8m0 byte scale 2^(e-127) per 32 columns
                           [rows, ceil(cols/32)] in coli_matrix_view.e8m0_scales */
    COLI_ENC_GGML = 7,  /* format version 4 (i-quants, MXFP4: 6): llama.cpp block type from a GGUF, group_size =
                           its ggml type id; scales inside the blocks (no scale section);
                           an expert's three matrices may differ in type */
    COLI_ENC_MXFP8 = 8  /* format version 5: e4m3fn bytes; e8m0 byte scale 2^(e-127) per 32
                           columns [rows, ceil(cols/32)] in coli_matrix_view.e8m0_scales */
};

/* ---- opening a store ------------------------------------------------------------------- */

typedef struct coli_store coli_store;    /* opaque */
typedef struct coli_expert coli_expert;  /* opaque */

enum {
    COLI_IO_AUTO = 0,     /* O_DIRECT when supported at the store alignment, else buffered */
    COLI_IO_DIRECT = 1,   /* O_DIRECT or COLI_ERR_IO at open */
    COLI_IO_BUFFERED = 2  /* through the page cache */
};

typedef struct coli_open_options {
    uint32_t struct_size;       /* sizeof(coli_open_options); set by coli_open_options_init */
    uint32_t verify_checksums;  /* non-zero: verify record xxh3 on every fetch (default 1) */
    uint32_t io_mode;           /* COLI_IO_* (default COLI_IO_AUTO) */
    uint32_t fetch_threads;     /* reads in flight in a batch fetch (default 4) */
    const char *const *mirror_dirs; /* mirror directories (docs/MIRRORS.md), drives 1, 2, ... */
    size_t mirror_count;        /* entries in mirror_dirs (0: no mirrors) */
} coli_open_options;

/* Fills *opts with the defaults. */
coli_status coli_open_options_init(coli_open_options *opts);

/* Opens and validates the store directory `path`; opts may be NULL (defaults). */
coli_status coli_store_open(const char *path, const coli_open_options *opts, coli_store **out);

/* Closes the store (NULL is ignored). Expert handles stay valid; dense views and strings
 * returned by the store do not. */
void coli_store_close(coli_store *store);

/* ---- manifest queries (strings are owned by the store, valid until close) ---------------- */

coli_status coli_store_family(const coli_store *store, const char **out);      /* model_type */
coli_status coli_store_id(const coli_store *store, const char **out);          /* 32 hex digits */
coli_status coli_store_config_json(const coli_store *store, const char **out); /* config.json */
coli_status coli_store_num_layers(const coli_store *store, uint32_t *out);
/* Layers holding routed experts: count, then each (ascending layer id). */
coli_status coli_store_expert_layer_count(const coli_store *store, size_t *out);
coli_status coli_store_expert_layer(const coli_store *store, size_t index, uint32_t *layer,
                                    uint32_t *num_experts);
/* Experts of one decoder layer (COLI_ERR_NOT_FOUND when it holds none). */
coli_status coli_store_layer_num_experts(const coli_store *store, uint32_t layer,
                                         uint32_t *num_experts);
/* Expert encoding (COLI_ENC_*) and group size field (int4: group; fp8: 128; mxfp4, mxfp8: 32;
 * else 0). */
coli_status coli_store_expert_encoding(const coli_store *store, uint32_t *encoding,
                                       uint32_t *group_size);
/* Hidden size H and intermediate size I of one expert (gate/up [I, H], down [H, I]). */
coli_status coli_store_expert_dims(const coli_store *store, uint32_t layer, uint32_t expert,
                                   uint32_t *hidden, uint32_t *intermediate);
/* Record length on disk (a multiple of the store alignment): the buffer size
 * coli_fetch_expert_into needs. */
coli_status coli_expert_record_len(const coli_store *store, uint32_t layer, uint32_t expert,
                                   size_t *len);
/* Alignment a coli_fetch_expert_into buffer must have (store alignment, at least 4096). */
coli_status coli_store_buffer_alignment(const coli_store *store, size_t *out);
/* How records are read: COLI_IO_DIRECT or COLI_IO_BUFFERED. */
coli_status coli_store_io_mode(const coli_store *store, uint32_t *out);

typedef struct coli_stats {
    uint64_t reads;       /* expert records read since open */
    uint64_t bytes_read;  /* bytes read from segment files by those reads */
} coli_stats;

coli_status coli_store_stats(const coli_store *store, coli_stats *out);

/* ---- experts --------------------------------------------------------------------------- */

typedef struct coli_expert_key {
    uint32_t layer;
    uint32_t expert;
} coli_expert_key;

/* Fetch into a library-owned buffer (aligned); release with coli_expert_release. */
coli_status coli_fetch_expert(const coli_store *store, uint32_t layer, uint32_t expert,
                              coli_expert **out);
/* Fetch `count` experts (in parallel up to fetch_threads); out[i] for keys[i]. All or nothing. */
coli_status coli_fetch_experts(const coli_store *store, const coli_expert_key *keys,
                               size_t count, coli_expert **out);
/* Fetch into the caller's buffer (aligned to coli_store_buffer_alignment, at least
 * coli_expert_record_len bytes). The handle borrows buf: keep it alive and unmodified until
 * coli_expert_release. */
coli_status coli_fetch_expert_into(const coli_store *store, uint32_t layer, uint32_t expert,
                                   void *buf, size_t buf_len, coli_expert **out);
/* Releases a handle (NULL is ignored). */
void coli_expert_release(coli_expert *expert);

typedef struct coli_expert_info {
    uint32_t layer;
    uint32_t expert;
    uint32_t encoding;       /* COLI_ENC_* */
    uint32_t group_size;
    size_t hidden;           /* H */
    size_t intermediate;     /* I */
    const uint8_t *record;   /* record bytes (docs/FORMAT.md section 5), matrices row-major:
                                a format-7 interleaved record is reordered after its checksum */
    size_t record_len;       /* bytes, padding included */
    size_t payload_len;      /* bytes before the zero padding */
    uint32_t flags;          /* COLI_RECORD_FLAG_* bits (ABI 2) */
    uint32_t reserved;       /* 0 */
} coli_expert_info;

/* coli_expert_info.flags: the record carries an f32 bias per matrix (coli_expert_bias). */
#define COLI_RECORD_FLAG_BIASES 1u

coli_status coli_expert_get_info(const coli_expert *expert, coli_expert_info *out);

enum {
    COLI_MATRIX_GATE = 0,  /* [I, H] */
    COLI_MATRIX_UP = 1,    /* [I, H] */
    COLI_MATRIX_DOWN = 2   /* [H, I] */
};

typedef struct coli_matrix_view {
    const uint8_t *data;   /* weight section, data_len bytes */
    size_t data_len;
    const float *scales;   /* scale_count f32 values, 64-byte aligned; NULL when none */
    size_t scale_count;
    size_t rows;           /* output features */
    size_t cols;           /* input features */
    uint32_t encoding;     /* COLI_ENC_* */
    uint32_t group_size;   /* int4: columns per group; fp8: 128; mxfp4, mxfp8: 32; else 0 */
    const uint8_t *e8m0_scales; /* mxfp4, mxfp8: e8m0_scale_count bytes [rows, ceil(cols/32)],
                                   64-byte aligned; NULL for the other encodings (ABI 2) */
    size_t e8m0_scale_count;
} coli_matrix_view;

/* View of one matrix of a fetched expert; valid while the handle lives. */
coli_status coli_expert_matrix(const coli_expert *expert, uint32_t which,
                               coli_matrix_view *out);
/* Bias of one matrix (f32 [I] for gate/up, [H] for down), 64-byte aligned, valid while the
 * handle lives; *out = NULL and *out_len = 0 when the record has no biases (ABI 2). */
coli_status coli_expert_bias(const coli_expert *expert, uint32_t which, const float **out,
                             size_t *out_len);

/* ---- dense tensors --------------------------------------------------------------------- */

typedef struct coli_dense_view {
    const char *name;         /* owned by the store */
    coli_matrix_view matrix;  /* 1-D [n] as rows = 1, cols = n */
    uint32_t ndim;            /* 1 or 2 */
    uint32_t reserved;        /* 0 */
    size_t shape[2];          /* shape[1] = 0 when ndim == 1 */
} coli_dense_view;

coli_status coli_dense_count(const coli_store *store, size_t *out);
coli_status coli_dense_name(const coli_store *store, size_t index, const char **out);
/* View of the dense tensor `name`; valid until coli_store_close. */
coli_status coli_dense_get(const coli_store *store, const char *name, coli_dense_view *out);

/* ---- reference dequantization ---------------------------------------------------------- */

/* Dequantizes row `row` of a view to f32 (out_len == view->cols), per docs/FORMAT.md. */
coli_status coli_dequantize_row(const coli_matrix_view *view, size_t row, float *out,
                                size_t out_len);

#ifdef __cplusplus
}
#endif

#endif /* COLI_STORE_H */

/* safetensors.h — reader and writer for the public safetensors layout (SPEC §3): 8-byte little-endian
 * header length, JSON header (dtype, shape, data_offsets per tensor, optional string-valued
 * __metadata__), then the raw data. The reader treats the file as hostile: every offset, shape and
 * length is checked against the file before anything is read or allocated from it. The data section
 * is memory-mapped, never read whole. Also the Hugging Face shard index
 * (model.safetensors.index.json: {"metadata": {...}, "weight_map": {tensor: shard file}}). */
#ifndef PS_SAFETENSORS_H
#define PS_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

#define PS_ST_MAX_HEADER (100u * 1000u * 1000u) /* 100 MB, as in the reference library */
#define PS_ST_MAX_TENSORS 1000000
#define PS_ST_MAX_NDIM 8

typedef enum {
    PS_DT_F32, PS_DT_F16, PS_DT_BF16, PS_DT_F64, PS_DT_I64, PS_DT_I32, PS_DT_I16, PS_DT_I8, PS_DT_U8, PS_DT_BOOL,
    PS_DT_U16, PS_DT_U32, PS_DT_U64, PS_DT_F8_E4M3, PS_DT_F8_E5M2,
    PS_DT_F8_E8M0, /* unsigned power-of-two scales (block scales of quantised weights) */
    PS_DT_F4       /* float4 e2m1, two per byte (element 2i in the low nibble); the shape counts elements */
} ps_dtype;

typedef struct {
    char *name;
    ps_dtype dtype;
    int ndim;
    int64_t shape[PS_ST_MAX_NDIM];
    uint64_t begin, end; /* byte offsets into the data section */
} ps_st_entry;

typedef struct {
    char *path;
    const uint8_t *data; /* the data section (file bytes after the header), inside the read-only mapping */
    uint64_t data_len;
    void *map;           /* the whole file, mapped read-only (private) */
    size_t map_len;
    int n;
    ps_st_entry *entries;
    int n_meta;
    char **meta_keys, **meta_vals;
} ps_st_file;

/* Open and fully validate a safetensors file; maps it read-only (nothing of the data section is read
 * until a tensor is converted). The file must not be truncated while it is open. */
int ps_st_open(const char *path, ps_st_file *f, ps_error *err);
void ps_st_close(ps_st_file *f);

const ps_st_entry *ps_st_find(const ps_st_file *f, const char *name);
const char *ps_st_meta(const ps_st_file *f, const char *key);
int64_t ps_st_numel(const ps_st_entry *e);
const char *ps_dtype_name(ps_dtype d);

/* Convert one tensor (F32, F16 or BF16) to float32 into out[numel]. */
int ps_st_read_f32(const ps_st_file *f, const ps_st_entry *e, float *out, ps_error *err);

/* Drop the tensor's file pages from this process (they are read again if touched): after converting a
 * tensor, so that loading holds at most one tensor's bytes of the file at a time. */
void ps_st_release(const ps_st_file *f, const ps_st_entry *e);

/* A tensor to write: float32 data, row-major. */
typedef struct {
    const char *name;
    int ndim;
    int64_t shape[PS_ST_MAX_NDIM];
    const float *data;
} ps_st_tensor;

/* Write F32 tensors atomically, with "__metadata__": {"format": "pt", meta_keys[i]: meta_vals[i]...}. */
int ps_st_save(const char *path, const ps_st_tensor *t, int n, const char *const *meta_keys,
               const char *const *meta_vals, int n_meta, ps_error *err);
/* The same, storing every tensor as `dtype` (PS_DT_F32, PS_DT_BF16 or PS_DT_F16; rounded to nearest even). */
int ps_st_save_as(const char *path, const ps_st_tensor *t, int n, const char *const *meta_keys,
                  const char *const *meta_vals, int n_meta, ps_dtype dtype, ps_error *err);
/* Bytes per element of a dtype (0 if unknown, and for F4, which has half a byte: see ps_dtype_bits). */
int ps_dtype_size(ps_dtype d);
/* Bits per element (4 for F4; 0 if unknown). A tensor's bytes are numel * bits / 8 (a whole number). */
int ps_dtype_bits(ps_dtype d);

/* ---- the shard index of a sharded checkpoint ---- */

#define PS_ST_INDEX_NAME "model.safetensors.index.json"
#define PS_ST_INDEX_MAX_BYTES (64u << 20)

/* One entry of an index's name-sorted view: the name and its position in `names`. */
typedef struct {
    const char *name;
    int i;
} ps_st_index_key;

typedef struct {
    char *path;      /* the index file (error messages) */
    int n;           /* weight_map entries */
    char **names;    /* tensor names, n */
    int *shard;      /* shard of each entry: index into shards[] */
    ps_st_index_key *order; /* entries sorted by name (ps_st_index_find) */
    int n_shards;
    char **shards;   /* distinct shard file names, in order of first appearance */
} ps_st_index;

/* Parse an index: a JSON object (no duplicate keys) whose "weight_map" is an object of strings; each
 * shard name must be a plain file name (not empty, no '/', not "." or ".."); "metadata", when present,
 * must be an object; other top-level keys are ignored. `source` names the file in errors. */
int ps_st_index_parse(const char *json, size_t len, const char *source, ps_st_index *ix, ps_error *err);
int ps_st_index_load(const char *path, ps_st_index *ix, ps_error *err);
void ps_st_index_free(ps_st_index *ix);
/* The entry of a tensor name, or -1. */
int ps_st_index_find(const ps_st_index *ix, const char *name);

/* The path of shard `shard` of the checkpoint directory dir, checked to stay inside dir once symlinks
 * are resolved (the one exception: a Hugging Face hub cache snapshot, DIR = ROOT/snapshots/REV, whose
 * files link to ROOT/blobs/). Errors name the index file `index_path`. */
int ps_st_shard_path(const char *dir, const char *index_path, const char *shard, char *out, size_t n, ps_error *err);

/* Copy s into buf (size n) with control characters and non-ASCII bytes escaped as \xNN and a long
 * string cut with "...": untrusted names in one-line error messages. Returns buf. */
const char *ps_st_printable(const char *s, char *buf, size_t n);

/* ---- a checkpoint's weight files: DIR/model.safetensors, or the shards DIR/model.safetensors.index.json
 * names (transformers' order: model.safetensors wins when both exist). Shards are opened lazily, on the
 * first lookup of a tensor they hold; an opened shard must hold only tensors the index maps to it. ---- */
typedef struct {
    int sharded;
    char dir[4096], path[4096]; /* path: model.safetensors or the index (error messages) */
    ps_st_file single;
    ps_st_index ix;
    ps_st_file *sh;             /* [ix.n_shards], opened[i] when open */
    char *opened;
} ps_st_set;

int ps_st_set_open(ps_st_set *s, const char *dir, ps_error *err);
void ps_st_set_close(ps_st_set *s);
/* Look a tensor up: 1 and *f, *e set when found; 0 when the checkpoint does not list it; -1 on an error
 * (a shard that cannot be opened, a shard holding an unlisted tensor or one mapped elsewhere, or a
 * listed tensor that its shard lacks), with the file named. */
int ps_st_set_find(ps_st_set *s, const char *name, const ps_st_file **f, const ps_st_entry **e, ps_error *err);
/* Every tensor name the checkpoint lists (the single file's, or the index's weight_map): i < n. */
int ps_st_set_n_names(const ps_st_set *s);
const char *ps_st_set_name(const ps_st_set *s, int i);
/* Number of weight files opened so far. */
int ps_st_set_n_open(const ps_st_set *s);

/* Half-precision conversions (round-to-nearest-even on the way down). */
float ps_f16_to_f32(uint16_t h);
float ps_bf16_to_f32(uint16_t h);
uint16_t ps_f32_to_f16(float f);
uint16_t ps_f32_to_bf16(float f);

#endif

/* safetensors.h — reader and writer for the public safetensors layout (SPEC §3): 8-byte little-endian
 * header length, JSON header (dtype, shape, data_offsets per tensor, optional string-valued
 * __metadata__), then the raw data. The reader treats the file as hostile: every offset, shape and
 * length is checked against the file before anything is read or allocated from it. */
#ifndef PS_SAFETENSORS_H
#define PS_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "error.h"

#define PS_ST_MAX_HEADER (100u * 1000u * 1000u) /* 100 MB, as in the reference library */
#define PS_ST_MAX_TENSORS 1000000
#define PS_ST_MAX_NDIM 8

typedef enum {
    PS_DT_F32, PS_DT_F16, PS_DT_BF16, PS_DT_F64, PS_DT_I64, PS_DT_I32, PS_DT_I16, PS_DT_I8, PS_DT_U8, PS_DT_BOOL,
    PS_DT_U16, PS_DT_U32, PS_DT_U64, PS_DT_F8_E4M3, PS_DT_F8_E5M2
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
    uint8_t *data;      /* the data section (file bytes after the header) */
    uint64_t data_len;
    int n;
    ps_st_entry *entries;
    int n_meta;
    char **meta_keys, **meta_vals;
} ps_st_file;

/* Open and fully validate a safetensors file; reads the data section into memory. */
int ps_st_open(const char *path, ps_st_file *f, ps_error *err);
void ps_st_close(ps_st_file *f);

const ps_st_entry *ps_st_find(const ps_st_file *f, const char *name);
const char *ps_st_meta(const ps_st_file *f, const char *key);
int64_t ps_st_numel(const ps_st_entry *e);
const char *ps_dtype_name(ps_dtype d);

/* Convert one tensor (F32, F16 or BF16) to float32 into out[numel]. */
int ps_st_read_f32(const ps_st_file *f, const ps_st_entry *e, float *out, ps_error *err);

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

/* Half-precision conversions (round-to-nearest-even on the way down). */
float ps_f16_to_f32(uint16_t h);
float ps_bf16_to_f32(uint16_t h);
uint16_t ps_f32_to_f16(float f);
uint16_t ps_f32_to_bf16(float f);

#endif

/* fileio.h — whole-file reads with a size limit, and atomic writes (temp file + fsync + rename),
 * so a killed run never leaves a half-written file under its final name. */
#ifndef PS_FILEIO_H
#define PS_FILEIO_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <jansson.h>

#include "core/error.h"

/* Read a regular file into a malloc'd buffer (NUL-terminated, *len excludes the NUL). Refuses
 * directories and files larger than max_bytes. */
int ps_read_file(const char *path, size_t max_bytes, char **data, size_t *len, ps_error *err);

/* Atomic writer: ps_atomic_open gives a FILE* on a temp file beside `path`; ps_atomic_commit flushes,
 * fsyncs, closes and renames it over `path` (and fsyncs the directory); ps_atomic_abort removes it. */
typedef struct {
    FILE *f;
    char path[4096];
    char tmp[4096 + 16];
} ps_atomic_file;

int ps_atomic_open(ps_atomic_file *af, const char *path, ps_error *err);
int ps_atomic_commit(ps_atomic_file *af, ps_error *err);
void ps_atomic_abort(ps_atomic_file *af);

/* Convenience: write a whole buffer atomically. */
int ps_write_file_atomic(const char *path, const void *data, size_t len, ps_error *err);

/* Join dir and name with one '/' into out (size n). Fails if it does not fit. */
int ps_path_join(char *out, size_t n, const char *dir, const char *name, ps_error *err);

/* Bytes of memory available to this process now (MemAvailable, or free pages); 0 if unknown. */
uint64_t ps_mem_available(void);

/* Remove temporary files (NAME.tmp*) that a killed writer left in dir. */
void ps_clean_temp_files(const char *dir);

/* mkdir -p for one directory level (existing directory is fine). */
int ps_mkdir(const char *path, ps_error *err);

/* Write the text s followed by a newline to path, atomically (ps_write_file_atomic). */
int ps_write_text_atomic(const char *path, const char *s, ps_error *err);

/* "an object", "an array", "a string", "an integer", "a real number", "a boolean" or "null" (also for
 * NULL, a missing value): for error messages that name what a JSON key held. */
const char *ps_json_type_name(const json_t *v);

/* The records of a JSON-lines file (a training log): a new array of its lines' values, in file order
 * (blank lines skipped); NULL with the file and line named when a line is not valid JSON. */
json_t *ps_read_jsonl(const char *path, ps_error *err);

#endif

#define _POSIX_C_SOURCE 200809L
#include "core/fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <dirent.h>
#include <unistd.h>

int ps_read_file(const char *path, size_t max_bytes, char **data, size_t *len, ps_error *err) {
    *data = NULL;
    *len = 0;
    int fd = open(path, O_RDONLY);
    if (fd < 0) return ps_fail(err, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return ps_fail(err, "%s: cannot stat: %s", path, strerror(e));
    }
    if (S_ISDIR(st.st_mode)) {
        close(fd);
        return ps_fail(err, "%s: is a directory, expected a file", path);
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return ps_fail(err, "%s: not a regular file", path);
    }
    if ((uint64_t)st.st_size > (uint64_t)max_bytes) {
        close(fd);
        return ps_fail(err, "%s: file is %lld bytes, more than the limit of %zu", path, (long long)st.st_size,
                       max_bytes);
    }
    size_t n = (size_t)st.st_size;
    char *buf = malloc(n + 1);
    if (!buf) {
        close(fd);
        return ps_fail(err, "%s: out of memory reading %zu bytes", path, n);
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0) {
            if (errno == EINTR) continue;
            int e = errno;
            free(buf);
            close(fd);
            return ps_fail(err, "%s: read error: %s", path, strerror(e));
        }
        if (r == 0) break; /* file shrank under us */
        got += (size_t)r;
    }
    close(fd);
    buf[got] = '\0';
    *data = buf;
    *len = got;
    return 0;
}

int ps_atomic_open(ps_atomic_file *af, const char *path, ps_error *err) {
    memset(af, 0, sizeof *af);
    if (strlen(path) >= sizeof af->path) return ps_fail(err, "%s: path too long", path);
    strcpy(af->path, path);
    snprintf(af->tmp, sizeof af->tmp, "%s.tmpXXXXXX", path);
    int fd = mkstemp(af->tmp);
    if (fd < 0) return ps_fail(err, "%s: cannot create temporary file: %s", path, strerror(errno));
    fchmod(fd, 0644);
    af->f = fdopen(fd, "wb");
    if (!af->f) {
        int e = errno;
        close(fd);
        unlink(af->tmp);
        return ps_fail(err, "%s: cannot open temporary file: %s", path, strerror(e));
    }
    return 0;
}

void ps_atomic_abort(ps_atomic_file *af) {
    if (af->f) fclose(af->f);
    af->f = NULL;
    if (af->tmp[0]) unlink(af->tmp);
    af->tmp[0] = '\0';
}

int ps_atomic_commit(ps_atomic_file *af, ps_error *err) {
    if (!af->f) return ps_fail(err, "%s: atomic write not open", af->path);
    int bad = ferror(af->f) || fflush(af->f) != 0;
    int e = errno;
    if (!bad && fsync(fileno(af->f)) != 0) {
        bad = 1;
        e = errno;
    }
    if (fclose(af->f) != 0 && !bad) {
        bad = 1;
        e = errno;
    }
    af->f = NULL;
    if (bad) {
        unlink(af->tmp);
        return ps_fail(err, "%s: write failed: %s", af->path, strerror(e ? e : EIO));
    }
    if (rename(af->tmp, af->path) != 0) {
        e = errno;
        unlink(af->tmp);
        return ps_fail(err, "%s: cannot rename temporary file into place: %s", af->path, strerror(e));
    }
    /* Make the rename durable. */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", af->path);
    int dfd = open(dirname(dir), O_RDONLY | O_DIRECTORY);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return 0;
}

int ps_write_file_atomic(const char *path, const void *data, size_t len, ps_error *err) {
    ps_atomic_file af;
    if (ps_atomic_open(&af, path, err)) return -1;
    if (len && fwrite(data, 1, len, af.f) != len) {
        int e = errno;
        ps_atomic_abort(&af);
        return ps_fail(err, "%s: write failed: %s", path, strerror(e));
    }
    return ps_atomic_commit(&af, err);
}

int ps_path_join(char *out, size_t n, const char *dir, const char *name, ps_error *err) {
    size_t dl = strlen(dir);
    int w = (dl > 0 && dir[dl - 1] == '/') ? snprintf(out, n, "%s%s", dir, name) : snprintf(out, n, "%s/%s", dir, name);
    if (w < 0 || (size_t)w >= n) return ps_fail(err, "%s: path too long", dir);
    return 0;
}

int ps_mkdir(const char *path, ps_error *err) {
    if (mkdir(path, 0755) == 0) return 0;
    if (errno == EEXIST) {
        struct stat st;
        if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return 0;
        return ps_fail(err, "%s: exists and is not a directory", path);
    }
    return ps_fail(err, "%s: cannot create directory: %s", path, strerror(errno));
}

uint64_t ps_mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        unsigned long long kb;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
                fclose(f);
                return (uint64_t)kb * 1024;
            }
        fclose(f);
    }
    long pages = sysconf(_SC_AVPHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    return pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : 0;
}

void ps_clean_temp_files(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d));) {
        const char *t = strstr(e->d_name, ".tmp");
        if (!t || e->d_name[0] == '.') continue;
        char path[4200];
        if (ps_path_join(path, sizeof path, dir, e->d_name, NULL) == 0) unlink(path);
    }
    closedir(d);
}

int ps_write_text_atomic(const char *path, const char *s, ps_error *err) {
    size_t n = strlen(s);
    char *t = malloc(n + 1);
    if (!t) return ps_fail(err, "%s: out of memory", path);
    memcpy(t, s, n);
    t[n] = '\n';
    int rc = ps_write_file_atomic(path, t, n + 1, err);
    free(t);
    return rc;
}

const char *ps_json_type_name(const json_t *v) {
    if (!v) return "null";
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE: case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

json_t *ps_read_jsonl(const char *path, ps_error *err) {
    char *text;
    size_t len;
    if (ps_read_file(path, (size_t)1 << 32, &text, &len, err)) return NULL;
    json_t *recs = json_array();
    long line_no = 0;
    for (char *line = text, *next; line && *line; line = next) {
        line_no++;
        next = strchr(line, '\n');
        if (next) *next++ = '\0';
        if (strspn(line, " \t\r") == strlen(line)) continue;
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        if (!o) {
            ps_fail(err, "%s: line %ld is not valid JSON (%s)", path, line_no, je.text);
            json_decref(recs);
            free(text);
            return NULL;
        }
        json_array_append_new(recs, o);
    }
    free(text);
    return recs;
}

/* partial.c — partial results: per-unit arrays, MPI gather, part files and their merge (see partial.h). */
#include "scaleout/partial.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "scaleout/dist.h"
#include "core/fileio.h"
#include "core/safetensors.h"

#define PARTIAL_VERSION 1
#define META_KEY "phasescope.partial"

static const char *const TYPE_NAMES[] = {"I32", "F32", "F64"};

int ps_partial_type_size(int type) { return type == PS_PART_F64 ? 8 : 4; }

int ps_partial_init(ps_partial *p, const char *command, int64_t n_units, json_t *meta, ps_error *err) {
    memset(p, 0, sizeof *p);
    snprintf(p->command, sizeof p->command, "%s", command);
    p->n_units = n_units;
    p->u1 = n_units;
    p->n_shards = 1;
    p->meta = meta;
    if (!meta) return ps_fail(err, "out of memory for the description of a partial result");
    return 0;
}

int ps_partial_add(ps_partial *p, const char *name, int type, const int64_t *per_unit, ps_error *err) {
    if (p->n_arr == PS_PART_MAX_ARRAYS) return ps_fail(err, "internal error: more than %d arrays in a partial result", PS_PART_MAX_ARRAYS);
    ps_part_array *a = &p->arr[p->n_arr];
    memset(a, 0, sizeof *a);
    snprintf(a->name, sizeof a->name, "%s", name);
    a->type = type;
    a->off = malloc((size_t)(p->n_units + 1) * sizeof(int64_t));
    if (!a->off) return ps_fail(err, "out of memory for the layout of %lld work units", (long long)p->n_units);
    a->off[0] = 0;
    for (int64_t u = 0; u < p->n_units; u++) a->off[u + 1] = a->off[u] + per_unit[u];
    int64_t total = a->off[p->n_units];
    a->data = calloc((size_t)(total ? total : 1), (size_t)ps_partial_type_size(type));
    if (!a->data) {
        free(a->off);
        a->off = NULL;
        return ps_fail(err, "out of memory for %lld per-item values (%s)", (long long)total, name);
    }
    return p->n_arr++;
}

void *ps_partial_at(const ps_partial *p, int a, int64_t u) {
    return (char *)p->arr[a].data + p->arr[a].off[u] * ps_partial_type_size(p->arr[a].type);
}

int64_t ps_partial_count(const ps_partial *p, int a, int64_t u) { return p->arr[a].off[u + 1] - p->arr[a].off[u]; }

int ps_partial_find(const ps_partial *p, const char *name) {
    for (int i = 0; i < p->n_arr; i++)
        if (!strcmp(p->arr[i].name, name)) return i;
    return -1;
}

void ps_partial_free(ps_partial *p) {
    for (int i = 0; i < p->n_arr; i++) {
        free(p->arr[i].off);
        free(p->arr[i].data);
    }
    json_decref(p->meta);
    memset(p, 0, sizeof *p);
}

int ps_partial_gather(ps_partial *p, const int64_t *u0s, const int64_t *u1s, ps_error *err) {
    int P = ps_dist_size();
    if (P == 1) {
        p->u0 = u0s[0];
        p->u1 = u1s[0];
        return 0;
    }
    int64_t *off = malloc((size_t)P * sizeof *off), *n = malloc((size_t)P * sizeof *n);
    int rc = off && n ? 0 : ps_fail(err, "out of memory");
    for (int a = 0; a < p->n_arr && !rc; a++) {
        for (int r = 0; r < P; r++) {
            off[r] = p->arr[a].off[u0s[r]];
            n[r] = p->arr[a].off[u1s[r]] - off[r];
        }
        rc = ps_dist_gather_ranges(p->arr[a].data, ps_partial_type_size(p->arr[a].type), off, n, err);
    }
    free(off);
    free(n);
    if (rc) return -1;
    if (ps_dist_rank() == 0) {
        p->u0 = u0s[0];
        p->u1 = u1s[P - 1];
    }
    return 0;
}

void ps_partial_file_name(char *out, size_t n, const char *name, int i, int of) {
    snprintf(out, n, "%s.part-%d-of-%d.safetensors", name, i, of);
}

/* ---- part files ---- */

int ps_partial_write(const ps_partial *p, const char *path, ps_error *err) {
    json_t *hdr = json_object(), *info = json_object(), *arrays = json_array(), *md = json_object();
    int rc = -1;
    char *htext = NULL, *itext = NULL, *buf = NULL;
    if (!hdr || !info || !arrays || !md) {
        ps_fail(err, "%s: out of memory", path);
        goto done;
    }
    uint64_t pos = 0;
    for (int a = 0; a < p->n_arr; a++) {
        const ps_part_array *A = &p->arr[a];
        int64_t n = A->off[p->u1] - A->off[p->u0];
        uint64_t bytes = (uint64_t)n * (uint64_t)ps_partial_type_size(A->type), obytes = (uint64_t)(p->n_units + 1) * 8;
        char oname[64];
        snprintf(oname, sizeof oname, "%s.offsets", A->name);
        json_object_set_new(hdr, A->name, json_pack("{s:s, s:[I], s:[I,I]}", "dtype", TYPE_NAMES[A->type], "shape", (json_int_t)n,
                                                    "data_offsets", (json_int_t)pos, (json_int_t)(pos + bytes)));
        pos += bytes;
        json_object_set_new(hdr, oname, json_pack("{s:s, s:[I], s:[I,I]}", "dtype", "I64", "shape", (json_int_t)(p->n_units + 1),
                                                  "data_offsets", (json_int_t)pos, (json_int_t)(pos + obytes)));
        pos += obytes;
        json_array_append_new(arrays, json_pack("{s:s, s:s}", "name", A->name, "dtype", TYPE_NAMES[A->type]));
    }
    json_object_set_new(info, "version", json_integer(PARTIAL_VERSION));
    json_object_set_new(info, "command", json_string(p->command));
    json_object_set_new(info, "n_units", json_integer(p->n_units));
    json_object_set_new(info, "units", json_pack("[I,I]", (json_int_t)p->u0, (json_int_t)p->u1));
    json_object_set_new(info, "shard", json_pack("[i,i]", p->shard, p->n_shards));
    json_object_set_new(info, "arrays", arrays);
    arrays = NULL;
    json_object_set(info, "meta", p->meta);
    itext = json_dumps(info, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    if (!itext) {
        ps_fail(err, "%s: cannot serialise the partial result's description", path);
        goto done;
    }
    json_object_set_new(md, "format", json_string("phasescope-partial"));
    json_object_set_new(md, META_KEY, json_string(itext));
    json_object_set_new(hdr, "__metadata__", md);
    md = NULL;
    htext = json_dumps(hdr, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!htext) {
        ps_fail(err, "%s: cannot serialise the header", path);
        goto done;
    }
    uint64_t hlen = strlen(htext), padded = (hlen + 7) / 8 * 8;
    buf = malloc((size_t)(8 + padded + pos));
    if (!buf) {
        ps_fail(err, "%s: out of memory for %llu bytes", path, (unsigned long long)(8 + padded + pos));
        goto done;
    }
    for (int i = 0; i < 8; i++) buf[i] = (char)((padded >> (8 * i)) & 0xff); /* little-endian length */
    memcpy(buf + 8, htext, hlen);
    memset(buf + 8 + hlen, ' ', padded - hlen);
    char *d = buf + 8 + padded;
    for (int a = 0; a < p->n_arr; a++) {
        const ps_part_array *A = &p->arr[a];
        int es = ps_partial_type_size(A->type);
        size_t bytes = (size_t)(A->off[p->u1] - A->off[p->u0]) * (size_t)es;
        memcpy(d, (const char *)A->data + A->off[p->u0] * es, bytes);
        d += bytes;
        memcpy(d, A->off, (size_t)(p->n_units + 1) * 8);
        d += (size_t)(p->n_units + 1) * 8;
    }
    rc = ps_write_file_atomic(path, buf, (size_t)(8 + padded + pos), err);
done:
    free(buf);
    free(htext);
    free(itext);
    json_decref(hdr);
    json_decref(info);
    json_decref(arrays);
    json_decref(md);
    return rc;
}

static int type_of(const char *s) {
    for (int t = 0; t < 3; t++)
        if (!strcmp(s, TYPE_NAMES[t])) return t;
    return -1;
}

static ps_dtype st_type(int t) { return t == PS_PART_I32 ? PS_DT_I32 : t == PS_PART_F32 ? PS_DT_F32 : PS_DT_F64; }

/* One part file into p (whole arrays, the part's units filled). */
static int read_part(const char *path, ps_partial *p, ps_error *err) {
    ps_st_file f;
    memset(p, 0, sizeof *p);
    if (ps_st_open(path, &f, err)) return -1;
    int rc = -1;
    json_t *info = NULL;
    const char *text = ps_st_meta(&f, META_KEY);
    if (!text) {
        ps_fail(err, "%s: not a partial result (no %s in its metadata; part files are written by --shard I/N)", path, META_KEY);
        goto done;
    }
    json_error_t je;
    info = json_loads(text, JSON_REJECT_DUPLICATES, &je);
    json_t *arrays = json_object_get(info, "arrays"), *units = json_object_get(info, "units"), *shard = json_object_get(info, "shard");
    json_t *cmd = json_object_get(info, "command"), *nu = json_object_get(info, "n_units");
    if (!info || json_integer_value(json_object_get(info, "version")) != PARTIAL_VERSION || !json_is_string(cmd) ||
        !json_is_integer(nu) || json_integer_value(nu) < 0 || json_integer_value(nu) > ((int64_t)1 << 40) ||
        json_array_size(units) != 2 || json_array_size(shard) != 2 || !json_is_array(arrays) ||
        json_array_size(arrays) > PS_PART_MAX_ARRAYS || !json_is_object(json_object_get(info, "meta"))) {
        ps_fail(err, "%s: malformed partial-result description (%s)", path, META_KEY);
        goto done;
    }
    int64_t n_units = json_integer_value(nu), u0 = json_integer_value(json_array_get(units, 0)),
            u1 = json_integer_value(json_array_get(units, 1));
    int si = (int)json_integer_value(json_array_get(shard, 0)), sn = (int)json_integer_value(json_array_get(shard, 1));
    if (u0 < 0 || u1 < u0 || u1 > n_units || sn < 1 || si < 0 || si >= sn) {
        ps_fail(err, "%s: units [%lld, %lld) of %lld or shard %d/%d out of range", path, (long long)u0, (long long)u1,
                (long long)n_units, si, sn);
        goto done;
    }
    if (ps_partial_init(p, json_string_value(cmd), n_units, json_incref(json_object_get(info, "meta")), err)) goto done;
    p->u0 = u0;
    p->u1 = u1;
    p->shard = si;
    p->n_shards = sn;
    for (size_t i = 0; i < json_array_size(arrays); i++) {
        json_t *ai = json_array_get(arrays, i);
        const char *name = json_string_value(json_object_get(ai, "name")), *dt = json_string_value(json_object_get(ai, "dtype"));
        int t = dt ? type_of(dt) : -1;
        char oname[64];
        if (!name || strlen(name) >= sizeof p->arr[0].name || t < 0) {
            ps_fail(err, "%s: malformed array entry %zu", path, i);
            goto done;
        }
        snprintf(oname, sizeof oname, "%s.offsets", name);
        const ps_st_entry *e = ps_st_find(&f, name), *eo = ps_st_find(&f, oname);
        if (!e || !eo || e->dtype != st_type(t) || eo->dtype != PS_DT_I64 || eo->ndim != 1 || eo->shape[0] != n_units + 1 ||
            e->ndim != 1) {
            ps_fail(err, "%s: array \"%s\" or its offsets missing or of the wrong type or shape", path, name);
            goto done;
        }
        int64_t *off = malloc((size_t)(n_units + 1) * sizeof *off);
        if (!off) {
            ps_fail(err, "%s: out of memory", path);
            goto done;
        }
        memcpy(off, f.data + eo->begin, (size_t)(n_units + 1) * 8);
        int ok = off[0] == 0;
        for (int64_t u = 0; u < n_units && ok; u++) ok = off[u + 1] >= off[u] && off[u + 1] - off[u] <= ((int64_t)1 << 40);
        if (!ok || e->shape[0] != off[u1] - off[u0]) {
            free(off);
            ps_fail(err, "%s: array \"%s\": offsets inconsistent with its %lld elements", path, name, (long long)e->shape[0]);
            goto done;
        }
        int64_t *per = malloc((size_t)(n_units ? n_units : 1) * sizeof *per);
        if (!per) {
            free(off);
            ps_fail(err, "%s: out of memory", path);
            goto done;
        }
        for (int64_t u = 0; u < n_units; u++) per[u] = off[u + 1] - off[u];
        int a = ps_partial_add(p, name, t, per, err);
        free(per);
        free(off);
        if (a < 0) goto done;
        int es = ps_partial_type_size(t);
        memcpy((char *)p->arr[a].data + p->arr[a].off[u0] * es, f.data + e->begin, (size_t)e->shape[0] * (size_t)es);
    }
    rc = 0;
done:
    json_decref(info);
    ps_st_close(&f);
    if (rc) ps_partial_free(p);
    return rc;
}

/* meta without provenance.compute (which may differ between the machines that ran the shards) and
 * provenance.command (the shards may write to different --out directories; every parameter that shapes the
 * numbers is in the rest of the meta, or in the arrays' layout) */
static json_t *comparable(json_t *meta) {
    json_t *m = json_deep_copy(meta), *prov = json_object_get(m, "provenance");
    if (json_is_object(prov)) {
        json_object_del(prov, "compute");
        json_object_del(prov, "command");
    }
    return m;
}

int ps_partial_merge_files(const char *const *paths, int n, ps_partial *out, ps_error *err) {
    memset(out, 0, sizeof *out);
    if (n < 1) return ps_fail(err, "no part files given");
    ps_partial *parts = calloc((size_t)n, sizeof *parts);
    if (!parts) return ps_fail(err, "out of memory for %d parts", n);
    int rc = -1, got = 0;
    json_t *ref = NULL;
    for (; got < n; got++)
        if (read_part(paths[got], &parts[got], err)) goto done;
    const ps_partial *p0 = &parts[0];
    ref = comparable(p0->meta);
    for (int i = 0; i < n; i++) {
        const ps_partial *p = &parts[i];
        json_t *c = comparable(p->meta);
        int same_meta = json_equal(c, ref);
        json_decref(c);
        if (strcmp(p->command, p0->command) || p->n_units != p0->n_units || p->n_shards != p0->n_shards || p->n_arr != p0->n_arr) {
            ps_fail(err, "%s and %s are parts of different runs (command %s / %s, %lld / %lld units, %d / %d shards)", paths[0],
                    paths[i], p0->command, p->command, (long long)p0->n_units, (long long)p->n_units, p0->n_shards, p->n_shards);
            goto done;
        }
        if (!same_meta) {
            ps_fail(err, "%s and %s are parts of different runs (their provenance or parameters differ: model, seed, prompts, "
                         "flags)",
                    paths[0], paths[i]);
            goto done;
        }
        for (int a = 0; a < p->n_arr; a++)
            if (strcmp(p->arr[a].name, p0->arr[a].name) || p->arr[a].type != p0->arr[a].type ||
                memcmp(p->arr[a].off, p0->arr[a].off, (size_t)(p->n_units + 1) * 8)) {
                ps_fail(err, "%s and %s: array \"%s\" is laid out differently (different --batch or model?)", paths[0], paths[i],
                        p->arr[a].name);
                goto done;
            }
        for (int j = 0; j < i; j++)
            if (parts[j].shard == p->shard) {
                ps_fail(err, "%s and %s are both shard %d of %d", paths[j], paths[i], p->shard, p->n_shards);
                goto done;
            }
    }
    if (n != p0->n_shards) {
        char missing[256] = "";
        for (int s = 0; s < p0->n_shards && strlen(missing) < 200; s++) {
            int have = 0;
            for (int i = 0; i < n; i++) have |= parts[i].shard == s;
            if (!have) snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%s%d", missing[0] ? ", " : "", s);
        }
        ps_fail(err, "%d part file%s given, but the run has %d shards (missing: %s)", n, n == 1 ? "" : "s", p0->n_shards,
                missing[0] ? missing : "none: a shard is given twice");
        goto done;
    }
    /* the units must tile [0, n_units): in shard order, each begins where the previous ended */
    int64_t at = 0;
    for (int s = 0; s < p0->n_shards; s++)
        for (int i = 0; i < n; i++)
            if (parts[i].shard == s) {
                if (parts[i].u0 != at) {
                    ps_fail(err, "%s: shard %d covers units [%lld, %lld), expected to start at %lld (parts split differently)",
                            paths[i], s, (long long)parts[i].u0, (long long)parts[i].u1, (long long)at);
                    goto done;
                }
                at = parts[i].u1;
            }
    if (at != p0->n_units) {
        ps_fail(err, "the parts cover units [0, %lld) of %lld", (long long)at, (long long)p0->n_units);
        goto done;
    }
    /* out: part 0 with every other part's units copied in */
    *out = parts[0];
    memset(&parts[0], 0, sizeof parts[0]);
    for (int i = 1; i < n; i++)
        for (int a = 0; a < out->n_arr; a++) {
            int es = ps_partial_type_size(out->arr[a].type);
            int64_t o = out->arr[a].off[parts[i].u0], m = out->arr[a].off[parts[i].u1] - o;
            memcpy((char *)out->arr[a].data + o * es, (char *)parts[i].arr[a].data + o * es, (size_t)(m * es));
        }
    out->u0 = 0;
    out->u1 = out->n_units;
    out->shard = 0;
    out->n_shards = 1;
    json_t *prov = json_object_get(out->meta, "provenance");
    const char *cs = json_string_value(json_object_get(prov, "compute"));
    if (cs) {
        char buf[1024];
        snprintf(buf, sizeof buf, "%s; merged from %d shards", cs, n);
        json_object_set_new(prov, "compute", json_string(buf));
    }
    rc = 0;
done:
    json_decref(ref);
    for (int i = 0; i < got; i++) ps_partial_free(&parts[i]);
    free(parts);
    return rc;
}

/* Is name a part file's name: COMMAND.part-I-of-N.safetensors? */
static int is_part_name(const char *name) {
    const char *p = strstr(name, ".part-");
    if (!p || p == name) return 0;
    int i, of, used = 0;
    if (sscanf(p, ".part-%d-of-%d.safetensors%n", &i, &of, &used) != 2) return 0;
    return p[used] == '\0' && i >= 0 && of >= 1;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

int ps_partial_expand_paths(const char *const *paths, int n, char ***out, int *n_out, ps_error *err) {
    *out = NULL;
    *n_out = 0;
    int cap = 0, m = 0;
    char **list = NULL;
    for (int i = 0; i < n; i++) {
        struct stat st;
        if (stat(paths[i], &st) != 0) {
            ps_free_paths(list, m);
            return ps_fail(err, "%s: no such file or directory", paths[i]);
        }
        int n_here = 0, first = m;
        DIR *d = S_ISDIR(st.st_mode) ? opendir(paths[i]) : NULL;
        if (S_ISDIR(st.st_mode) && !d) {
            ps_free_paths(list, m);
            return ps_fail(err, "%s: cannot read the directory", paths[i]);
        }
        for (;;) {
            const char *name = NULL;
            struct dirent *e = NULL;
            if (d) {
                e = readdir(d);
                if (!e) break;
                if (!is_part_name(e->d_name)) continue;
                name = e->d_name;
            } else if (n_here) break;
            if (m == cap) {
                cap = cap ? 2 * cap : 16;
                char **nl = realloc(list, (size_t)cap * sizeof *nl);
                if (!nl) {
                    if (d) closedir(d);
                    ps_free_paths(list, m);
                    return ps_fail(err, "out of memory for the list of part files");
                }
                list = nl;
            }
            size_t len = strlen(paths[i]) + (name ? strlen(name) + 2 : 1);
            list[m] = malloc(len);
            if (!list[m]) {
                if (d) closedir(d);
                ps_free_paths(list, m);
                return ps_fail(err, "out of memory for the list of part files");
            }
            if (name) snprintf(list[m], len, "%s/%s", paths[i], name);
            else snprintf(list[m], len, "%s", paths[i]);
            m++;
            n_here++;
        }
        if (d) {
            closedir(d);
            if (!n_here) {
                ps_free_paths(list, m);
                return ps_fail(err, "%s: a directory with no part files (COMMAND.part-I-of-N.safetensors, written by --shard I/N)",
                               paths[i]);
            }
            qsort(list + first, (size_t)n_here, sizeof *list, cmp_str); /* the same order on any file system */
        }
    }
    *out = list;
    *n_out = m;
    return 0;
}

void ps_free_paths(char **paths, int n) {
    for (int i = 0; i < n; i++) free(paths[i]);
    free(paths);
}

/* textkv_prompt.c — key-value retrieval as text (textkv_prompt.h). */
#include "text/textkv_prompt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"

#define MAX_PAIRS 100000

void ps_textkv_defaults(ps_textkv *kv) {
    memset(kv, 0, sizeof *kv);
    kv->value_digits = 4;
    kv->n_pairs = 8;
    kv->n_queries = 1;
    kv->intro = "Below is a list of keys and their values. Remember them.\n";
    kv->pair_lead = "The value of";
    kv->pair_mid = " is";
    kv->pair_end = ".\n";
    kv->q_lead = "Question: what is the value of";
    kv->q_mid = "?\nAnswer: The value of";
    kv->q_end = ".\n";
    kv->pad_id = -1;
}

void ps_textkv_free(ps_textkv *kv) {
    ps_ids *fixed[] = {&kv->intro_ids, &kv->lead_ids, &kv->mid_ids, &kv->end_ids, &kv->ql_ids, &kv->qm_ids, &kv->qe_ids};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) ps_ids_free(fixed[i]);
    if (kv->key_ids)
        for (int64_t i = 0; i < kv->n_keys; i++) ps_ids_free(&kv->key_ids[i]);
    if (kv->value_ids)
        for (int64_t i = 0; i < kv->n_value_words; i++) ps_ids_free(&kv->value_ids[i]);
    free(kv->key_ids);
    free(kv->value_ids);
    kv->key_ids = kv->value_ids = NULL;
    kv->tok = NULL;
}

/* the ids of " word" */
static int word_ids(const ps_tokenizer *tok, const char *w, ps_ids *out, ps_error *err) {
    size_t l = strlen(w);
    char *s = malloc(l + 2);
    if (!s) return ps_fail(err, "out of memory");
    s[0] = ' ';
    memcpy(s + 1, w, l + 1);
    int rc = ps_ids_text(out, tok, s, l + 1, err);
    free(s);
    if (!rc && out->n == 0) rc = ps_fail(err, "\"%s\" gives no tokens", w);
    return rc;
}

static int64_t number_count(int64_t d) {
    int64_t lo = 1;
    for (int64_t i = 1; i < d; i++) lo *= 10;
    return d == 1 ? 10 : 9 * lo;
}

int ps_textkv_init(ps_textkv *kv, const ps_tokenizer *tok, ps_error *err) {
    kv->tok = tok;
    if (kv->n_pairs < 1 || kv->n_pairs > MAX_PAIRS)
        return ps_fail(err, "text-kv: %lld pairs: expected 1 to %d", (long long)kv->n_pairs, MAX_PAIRS);
    if (kv->n_queries < 1 || kv->n_queries > kv->n_pairs)
        return ps_fail(err, "text-kv: %lld queries: expected 1 to the number of pairs (%lld)", (long long)kv->n_queries,
                       (long long)kv->n_pairs);
    if (!kv->keys || kv->n_keys < kv->n_pairs)
        return ps_fail(err, "text-kv: %lld key words for %lld pairs: every pair needs its own key (more --words, or fewer "
                            "--pairs)",
                       (long long)kv->n_keys, (long long)kv->n_pairs);
    if (kv->value_words && kv->n_value_words < kv->n_pairs)
        return ps_fail(err, "text-kv: %lld value words for %lld pairs: every pair needs its own value", (long long)kv->n_value_words,
                       (long long)kv->n_pairs);
    if (!kv->value_words && (kv->value_digits < 1 || kv->value_digits > 18 || number_count(kv->value_digits) < kv->n_pairs))
        return ps_fail(err, "text-kv: values of %lld digits cannot give %lld distinct values", (long long)kv->value_digits,
                       (long long)kv->n_pairs);
    if (!kv->filler && kv->n_filler) return ps_fail(err, "text-kv: filler ids missing");
    struct {
        const char *s;
        ps_ids *ids;
    } fixed[] = {{kv->intro, &kv->intro_ids}, {kv->pair_lead, &kv->lead_ids}, {kv->pair_mid, &kv->mid_ids},
                 {kv->pair_end, &kv->end_ids}, {kv->q_lead, &kv->ql_ids},     {kv->q_mid, &kv->qm_ids},
                 {kv->q_end, &kv->qe_ids}};
    for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++)
        if (fixed[i].s && ps_ids_text(fixed[i].ids, tok, fixed[i].s, strlen(fixed[i].s), err)) goto fail;
    kv->key_ids = calloc((size_t)kv->n_keys, sizeof *kv->key_ids);
    if (!kv->key_ids) {
        ps_fail(err, "out of memory");
        goto fail;
    }
    for (int64_t i = 0; i < kv->n_keys; i++)
        if (word_ids(tok, kv->keys[i], &kv->key_ids[i], err)) {
            ps_fail_prefix(err, "text-kv: key %lld: ", (long long)i + 1);
            goto fail;
        }
    if (kv->value_words) {
        kv->value_ids = calloc((size_t)kv->n_value_words, sizeof *kv->value_ids);
        if (!kv->value_ids) {
            ps_fail(err, "out of memory");
            goto fail;
        }
        for (int64_t i = 0; i < kv->n_value_words; i++)
            if (word_ids(tok, kv->value_words[i], &kv->value_ids[i], err)) {
                ps_fail_prefix(err, "text-kv: value word %lld: ", (long long)i + 1);
                goto fail;
            }
    }
    return 0;
fail:
    ps_textkv_free(kv);
    return -1;
}

/* k distinct indices from [0, n) (partial Fisher-Yates over a scratch permutation) */
static int sample(ps_rng *r, int64_t n, int64_t k, int64_t *out, ps_error *err) {
    int64_t *perm = malloc((size_t)n * sizeof *perm);
    if (!perm) return ps_fail(err, "out of memory");
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    for (int64_t i = 0; i < k; i++) {
        int64_t j = i + ps_rng_below(r, n - i), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
        out[i] = perm[i];
    }
    free(perm);
    return 0;
}

int ps_textkv_prompt(const ps_textkv *kv, uint64_t seed, int64_t pre, int64_t before, int64_t after, ps_ids *out,
                     ps_query *q, ps_error *err) {
    out->n = 0;
    if (!kv->key_ids) return ps_fail(err, "internal error: text-kv not initialised");
    if (pre < 0 || before < 0 || after < 0 || pre > kv->n_filler || before + after > kv->n_filler)
        return ps_fail(err, "text-kv: %lld filler tokens needed, the filler text has %lld", (long long)(pre > before + after ? pre : before + after),
                       (long long)kv->n_filler);
    int64_t n = kv->n_pairs, nq = kv->n_queries;
    int64_t *key = malloc((size_t)n * sizeof *key), *val = malloc((size_t)n * sizeof *val), *order = malloc((size_t)n * sizeof *order),
            *kpos = malloc((size_t)n * sizeof *kpos);
    ps_ids *vids = calloc((size_t)n, sizeof *vids);
    int rc = key && val && order && kpos && vids ? 0 : ps_fail(err, "out of memory");
    ps_rng r;
    ps_rng_seed(&r, seed);
    if (!rc) rc = sample(&r, kv->n_keys, n, key, err);
    /* values: distinct words that are not one of the prompt's keys, or distinct numbers */
    for (int64_t i = 0; i < n && !rc; i++) {
        for (int tries = 0;; tries++) {
            if (tries > 10000) {
                rc = ps_fail(err, "text-kv: cannot draw %lld distinct values", (long long)n);
                break;
            }
            int64_t v = kv->value_words ? ps_rng_below(&r, kv->n_value_words) : ps_rng_below(&r, number_count(kv->value_digits));
            int clash = 0;
            for (int64_t j = 0; j < i && !clash; j++) clash = val[j] == v;
            if (kv->value_words)
                for (int64_t j = 0; j < n && !clash; j++) clash = !strcmp(kv->value_words[v], kv->keys[key[j]]);
            if (!clash) {
                val[i] = v;
                break;
            }
        }
        if (rc) break;
        if (kv->value_words)
            rc = ps_ids_push(&vids[i], kv->value_ids[val[i]].v, kv->value_ids[val[i]].n, err);
        else {
            char num[32];
            int64_t lo = kv->value_digits == 1 ? 0 : number_count(kv->value_digits) / 9;
            snprintf(num, sizeof num, " %lld", (long long)(lo + val[i]));
            rc = ps_ids_text(&vids[i], kv->tok, num, strlen(num), err);
        }
    }
    /* the queried pairs: nq distinct, the first is the one move mode moves */
    if (!rc) rc = sample(&r, n, nq, order, err);
    const int32_t *F = kv->filler;
#define PUSH(ids) (rc = rc ? rc : ps_ids_push(out, (ids).v, (ids).n, err))
    PUSH(kv->intro_ids);
    if (!rc && pre) rc = ps_ids_push(out, F, pre, err);
    for (int64_t j = 0; j < n && !rc; j++) {
        int moved = j == order[0];
        if (moved && before) rc = ps_ids_push(out, F, before, err);
        PUSH(kv->lead_ids);
        kpos[j] = out->n;
        PUSH(kv->key_ids[key[j]]);
        PUSH(kv->mid_ids);
        PUSH(vids[j]);
        PUSH(kv->end_ids);
        if (!rc && moved && after) rc = ps_ids_push(out, F + before, after, err);
    }
    for (int64_t i = 0; i < nq && !rc; i++) {
        int64_t j = order[i];
        PUSH(kv->ql_ids);
        PUSH(kv->key_ids[key[j]]);
        PUSH(kv->qm_ids);
        PUSH(kv->key_ids[key[j]]);
        PUSH(kv->mid_ids);
        q[i] = (ps_query){.key_pos = kpos[j], .answer_pos = out->n - 1, .answer_len = vids[j].n, .answer_src = out->n};
        PUSH(vids[j]);
        PUSH(kv->qe_ids);
    }
#undef PUSH
    if (vids)
        for (int64_t i = 0; i < n; i++) ps_ids_free(&vids[i]);
    free(vids);
    free(key);
    free(val);
    free(order);
    free(kpos);
    return rc;
}

uint64_t ps_textkv_prompt_seed(uint64_t seed, int64_t i) { return seed * 0x9e3779b97f4a7c15ULL ^ ((uint64_t)i * 0xbf58476d1ce4e5b9ULL) ^ 0x7e47ULL; }

int32_t ps_textkv_pad(const ps_textkv *kv, const ps_ids *prompt) {
    if (kv->pad_id >= 0) return kv->pad_id;
    if (kv->n_filler) return kv->filler[0];
    return prompt->n ? prompt->v[prompt->n - 1] : 0;
}

int ps_textkv_batch(const ps_textkv *kv, uint64_t seed, int64_t B, int64_t T, int loss_all, ps_batch *b, ps_error *err) {
    memset(b, 0, sizeof *b);
    int64_t nq = kv->n_queries;
    if (B < 1 || T < 2) return ps_fail(err, "text-kv batch: %lld sequences of %lld tokens", (long long)B, (long long)T);
    if (ps_batch_alloc(b, B, T, nq, err)) return -1;
    ps_ids pr = {0};
    int rc = 0;
    for (int64_t i = 0; i < B && !rc; i++) {
        uint64_t s = ps_textkv_prompt_seed(seed, i);
        ps_rng r;
        ps_rng_seed(&r, s ^ 0x5eedULL);
        rc = ps_textkv_prompt(kv, s, 0, 0, 0, &pr, b->queries + i * nq, err);
        if (!rc && pr.n > T)
            rc = ps_fail(err, "text-kv batch: a prompt of %lld tokens does not fit sequences of %lld (fewer pairs, or a longer T)",
                         (long long)pr.n, (long long)T);
        if (rc) break;
        int64_t room = T - pr.n, most = room < kv->n_filler ? room : kv->n_filler, pre = ps_rng_below(&r, most + 1);
        if (pre) rc = ps_textkv_prompt(kv, s, pre, 0, 0, &pr, b->queries + i * nq, err);
        if (rc) break;
        int32_t *dst = b->tokens + i * T, pad = ps_textkv_pad(kv, &pr);
        memcpy(dst, pr.v, (size_t)pr.n * sizeof *dst);
        for (int64_t t = pr.n; t < T; t++) dst[t] = pad;
        for (int64_t t = 0; t < T; t++) b->targets[i * T + t] = loss_all && t + 1 < pr.n ? dst[t + 1] : -1;
        b->n_q[i] = nq;
        for (int64_t k = 0; k < nq; k++) {
            const ps_query *q = &b->queries[i * nq + k];
            for (int64_t a = 0; a < q->answer_len; a++) b->targets[i * T + q->answer_pos + a] = dst[q->answer_src + a];
        }
    }
    ps_ids_free(&pr);
    if (rc) ps_batch_free(b);
    return rc;
}

int64_t ps_textkv_max_value_ids(const ps_textkv *kv, ps_error *err) {
    int64_t m = 0;
    if (kv->value_words) {
        for (int64_t i = 0; i < kv->n_value_words; i++) m = kv->value_ids[i].n > m ? kv->value_ids[i].n : m;
        return m;
    }
    /* numbers: the longest of a few spellings (the tokenizer splits digits into runs; every run length
       appears among the smallest, the largest and the repdigits) */
    int64_t lo = kv->value_digits == 1 ? 0 : number_count(kv->value_digits) / 9, hi = lo + number_count(kv->value_digits) - 1;
    for (int d = -2; d < 10; d++) {
        char num[40];
        if (d == -2) snprintf(num, sizeof num, " %lld", (long long)lo);
        else if (d == -1) snprintf(num, sizeof num, " %lld", (long long)hi);
        else {
            if (d == 0 && kv->value_digits > 1) continue;
            num[0] = ' ';
            for (int64_t k = 0; k < kv->value_digits; k++) num[1 + k] = (char)('0' + d);
            num[1 + kv->value_digits] = 0;
        }
        ps_ids ids = {0};
        if (ps_ids_text(&ids, kv->tok, num, strlen(num), err)) return -1;
        m = ids.n > m ? ids.n : m;
        ps_ids_free(&ids);
    }
    return m;
}

int64_t ps_textkv_max_prompt_ids(const ps_textkv *kv, ps_error *err) {
    int64_t mk = 0, mv = ps_textkv_max_value_ids(kv, err);
    if (mv < 0) return -1;
    for (int64_t i = 0; i < kv->n_keys; i++) mk = kv->key_ids[i].n > mk ? kv->key_ids[i].n : mk;
    return kv->intro_ids.n + kv->n_pairs * (kv->lead_ids.n + mk + kv->mid_ids.n + mv + kv->end_ids.n) +
           kv->n_queries * (kv->ql_ids.n + 2 * mk + kv->qm_ids.n + kv->mid_ids.n + mv + kv->qe_ids.n);
}

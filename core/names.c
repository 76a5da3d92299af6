/* names.c — a name looked up in a list (names.h). */
#include "core/names.h"

#include <stdio.h>
#include <string.h>

int ps_choice(const char *flag, const char *v, const char *const *choices, int *idx, ps_error *err) {
    int n = 0;
    for (; choices[n]; n++)
        if (!strcmp(choices[n], v)) {
            *idx = n;
            return 0;
        }
    char list[512];
    size_t len = 0;
    list[0] = '\0';
    for (int i = 0; i < n && len < sizeof list; i++)
        len += (size_t)snprintf(list + len, sizeof list - len, "%s%s", i == 0 ? "" : i == n - 1 ? " or " : ", ", choices[i]);
    return ps_fail_usage(err, "%s %s: expected %s", flag, v, list);
}

int ps_family_by_name(const void *items, int n, ps_name_of_fn name_of, const char *name, const char *what, int *idx,
                      ps_error *err) {
    if (!name) {
        *idx = 0;
        return 0;
    }
    char list[512] = "";
    for (int i = 0; i < n; i++) {
        const char *ni = name_of(items, i);
        if (!strcmp(ni, name)) {
            *idx = i;
            return 0;
        }
        size_t l = strlen(list);
        snprintf(list + l, sizeof list - l, "%s%s", i ? ", " : "", ni);
    }
    return ps_fail(err, "--family %s: unknown %s (families: %s)", name, what, list);
}

/* job_name.c: see job_name.h. */
#include "job_name.h"

#include <stddef.h>

bool job_name_ok(const char *name) {
    if (!name) return false;
    size_t n = 0;
    for (; name[n]; n++) {
        if (n == JOB_NAME_MAX) return false;
        char c = name[n];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return false;
    }
    return n > 0;
}

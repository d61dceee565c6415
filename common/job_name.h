/* job_name.h: the one rule for job names. A job name says whose blobs a
 * ballastd session touches (OpenSession, ListKeys, Release; the workers'
 * --offload-job, `ballast store --job`), so the service, the client library
 * and the command-line tools all check it with job_name_ok(). Each caller
 * writes its own message, naming its flag or RPC field; JOB_NAME_RULE is the
 * wording of the rule for those messages. */
#ifndef BALLAST_JOB_NAME_H
#define BALLAST_JOB_NAME_H

#include <stdbool.h>

#define JOB_NAME_MAX  63  /* longest job name, chars (a buffer needs JOB_NAME_MAX + 1) */
#define JOB_NAME_RULE "1..63 characters of [A-Za-z0-9._-]"

/* Whether name is 1..JOB_NAME_MAX characters, each an ASCII letter, digit,
 * '.', '_' or '-'. NULL is not a name. */
bool job_name_ok(const char *name);

#endif

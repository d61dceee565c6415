/* cli.h: the subcommands of the `ballast` program. Each lives in its own
 * workers/cli/cmd_NAME.c and returns the process exit status. */
#ifndef BALLAST_CLI_H
#define BALLAST_CLI_H

int cmd_train(int argc, char **argv);  /* local launcher: ballastd if needed + N workers */
int cmd_data(int argc, char **argv);   /* synth | pack | info | tokenize for token shards */
int cmd_data_tokenize(int argc, char **argv); /* text/JSONL -> shards (cmd_data_tokenize.c) */
int cmd_ckpt(int argc, char **argv);   /* export | info for checkpoints */
int cmd_plan(int argc, char **argv);   /* choose and predict the parallel layout */
int cmd_status(int argc, char **argv); /* ballastd pool, spill and sessions */
int cmd_store(int argc, char **argv);  /* put | get | ls | rm blobs in ballastd */
int cmd_doctor(int argc, char **argv); /* what this machine supports */
int cmd_report(int argc, char **argv); /* HTML report from a run's JSON log */
int cmd_eval(int argc, char **argv);   /* loss and perplexity of a model on token shards */
int cmd_generate(int argc, char **argv); /* sample text from a model (KV-cached, CPU) */

#endif

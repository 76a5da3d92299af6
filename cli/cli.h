/* cli.h — the program (cli/main.c) and its command lines: argv into a command's request (instruments/command.h),
 * --help, the error line "phasescope CMD: message" on stderr and the exit status. Nothing below cli/ parses a
 * command line: the library takes requests as JSON (api/instr_call.c). */
#ifndef PS_CLI_H
#define PS_CLI_H

#include <stdio.h>

#include "instruments/command.h"

/* Runs a command: help, parsing, usage errors, the error line and the exit status (0; 2 for a usage error; 1 for
 * any other error: ps_cli_status). */
int ps_command_main(const ps_command *cmd, int argc, char **argv);
/* The same without the help, the error line and the exit status: parses argv (argv[0] the command's name),
 * checks and runs; 0, or -1 with err set (err->usage for a usage error). */
int ps_command_call(const ps_command *cmd, int argc, char **argv, const ps_call *call, ps_error *err);
/* Writes the command's --help text (generated from its table) to f. */
void ps_command_help(const ps_command *cmd, FILE *f);

#endif

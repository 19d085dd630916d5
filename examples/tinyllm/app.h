/* tinyllm's subcommands. */
#ifndef TINYLLM_APP_H
#define TINYLLM_APP_H

#include "tinyllm.h"

int tl_eval_main(int argc, char **argv);
/* argv[0] is "demo": the options are parsed with getopt_long. */
int tl_demo_main(int argc, char **argv);
int tl_tour_main(int argc, char **argv);

#endif

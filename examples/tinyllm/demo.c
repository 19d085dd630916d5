/* tinyllm demo: placeholder until the end-to-end demo lands. */
#include <stdio.h>

#include "app.h"

int tl_demo_main(int argc, char **argv) {
    (void)argc;
    (void)argv;
    fprintf(stderr, "tinyllm demo: not yet\n");
    return 1;
}

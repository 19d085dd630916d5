#include "commands.h"

extern const kvm_command kvm_cmd_demo;
extern const kvm_command kvm_cmd_bench;
extern const kvm_command kvm_cmd_backends;
extern const kvm_command kvm_cmd_version;
/* persistence: inspect */
extern const kvm_command kvm_cmd_inspect;

/* real model: eval */


const kvm_command *const kvm_commands[] = {
    &kvm_cmd_demo,
    &kvm_cmd_bench,
    &kvm_cmd_backends,
    &kvm_cmd_version,
    /* persistence: inspect */
    &kvm_cmd_inspect,

    /* real model: eval */

    0,
};

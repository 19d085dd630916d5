/* Agent ids: the one rule, below everything that names agents by id (the
 * pool, the stores' keys, the agent file's metadata). */
#include "kvmem.h"

int32_t kvmem_agent_id_valid(const char *id) {
    if (!id || id[0] == '\0' || id[0] == '.') return 0;
    size_t n = 0;
    for (const char *c = id; *c; c++, n++) {
        if (n >= KVMEM_MAX_AGENT_ID) return 0;
        char ch = *c;
        int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                 ch == '.' || ch == '_' || ch == '-';
        if (!ok) return 0;
    }
    return 1;
}

/* cmd_bench.c — `moeserve bench` (filled in below). */
#include "base/log.h"
#include "cli/commands.h"

int cmd_bench(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    LOG_ERROR("bench: not implemented yet");
    return 1;
}

/*
 * ferry_spank: a SPANK plugin that puts a SLURM job step under Ferry's care.
 *
 *   sbatch --ferry [--ferry-every=10m] job.sh     (or #SBATCH --ferry, or srun --ferry ...)
 *
 * With --ferry, the step's task does not exec the user's program directly: it execs Ferry's
 * launcher (`ferry slurm-task`), which runs the program as `ferry run --here` (a Ferry job that
 * stays the task's descendant, in the step's cgroups, under SLURM's limits and accounting) or,
 * when SLURM starts the job again (SLURM_RESTART_COUNT > 0) and Ferry holds a checkpoint of it,
 * restores it in place (`ferry restore --here`). On SIGTERM (preemption, requeue, scancel) the
 * launcher checkpoints the job before it stops. All decisions are the launcher's (Python, unit
 * tested); this plugin only registers the options, checks them, and swaps the program.
 *
 * plugstack.conf:
 *   optional /usr/lib/x86_64-linux-gnu/slurm-wlm/ferry_spank.so ferry=/opt/ferry/.venv/bin/ferry \
 *            [addr=127.0.0.1:7070] [token_file=/etc/ferry/slurm.token] [node=NAME]
 *
 * How the program is swapped: slurm_spank_task_init runs in the forked task just before SLURM
 * execs it (after the task plugins, before TaskProlog, TMPDIR and the user's limits), as the
 * job's user. The plugin replaces argv[0] of the step with the launcher and passes the original
 * argv[0] in FERRY_SLURM_ARGV0, so SLURM's own exec path (limits, prolog, environment) is kept.
 */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <slurm/slurm.h>
#include <slurm/spank.h>

SPANK_PLUGIN(ferry, 1);

#define TOKEN_MAX 4096

static int want_ferry;                 /* --ferry (or --ferry-every) was given */
static char every[64];                 /* --ferry-every's value, checked */
static char *launcher;                 /* plugin argument ferry= */
static char *addr;                     /* plugin argument addr= */
static char *token_file;               /* plugin argument token_file= */
static char *node;                     /* plugin argument node= */
static char token[TOKEN_MAX];          /* read as root in task_init_privileged */

static int opt_ferry(int val, const char *optarg, int remote);
static int opt_every(int val, const char *optarg, int remote);

static struct spank_option options[] = {
    {"ferry", NULL,
     "Run this job (or step) under Ferry: it is checkpointed when SLURM preempts, requeues or "
     "cancels it, and continues from its checkpoint when SLURM starts it again.",
     0, 0, opt_ferry},
    {"ferry-every", "DURATION",
     "With --ferry: also checkpoint every DURATION (90s, 10m, 1h30m), so that a job whose node "
     "fails continues from its last periodic checkpoint.",
     1, 0, opt_every},
    SPANK_OPTIONS_TABLE_END};

/* The grammar of Ferry's durations (ferry.common.units.parse_duration): a plain number of
 * seconds, or number-unit parts such as 1h30m, with units ms, s, m, h, d. Returns 0 if valid. */
static int ferry_check_duration(const char *text)
{
    const char *p = text;
    int parts = 0;
    char *end;

    if (p == NULL || *p == '\0' || strlen(p) >= sizeof(every))
        return -1;
    errno = 0;
    double plain = strtod(p, &end);
    if (end != p && *end == '\0')
        return (errno == 0 && plain >= 0) ? 0 : -1;
    while (*p) {
        const char *digits = p;
        while (isdigit((unsigned char)*p) || *p == '.')
            p++;
        if (p == digits)
            return -1;
        if (strncmp(p, "ms", 2) == 0)
            p += 2;
        else if (*p == 's' || *p == 'm' || *p == 'h' || *p == 'd')
            p++;
        else
            return -1;
        parts++;
    }
    return parts > 0 ? 0 : -1;
}

static int opt_ferry(int val, const char *optarg, int remote)
{
    (void)val; (void)optarg; (void)remote;
    want_ferry = 1;
    return ESPANK_SUCCESS;
}

static int opt_every(int val, const char *optarg, int remote)
{
    (void)val; (void)remote;
    if (ferry_check_duration(optarg) != 0) {
        slurm_error("--ferry-every=%s: not a duration; give a number with a unit, like 90s, 10m "
                    "or 1h30m", optarg ? optarg : "");
        return ESPANK_BAD_ARG;
    }
    snprintf(every, sizeof(every), "%s", optarg);
    want_ferry = 1;
    return ESPANK_SUCCESS;
}

static int parse_args(int ac, char **av)
{
    for (int i = 0; i < ac; i++) {
        if (strncmp(av[i], "ferry=", 6) == 0)
            launcher = av[i] + 6;
        else if (strncmp(av[i], "addr=", 5) == 0)
            addr = av[i] + 5;
        else if (strncmp(av[i], "token_file=", 11) == 0)
            token_file = av[i] + 11;
        else if (strncmp(av[i], "node=", 5) == 0)
            node = av[i] + 5;
        else {
            slurm_error("ferry_spank: unknown argument %s in plugstack.conf (known: ferry=, addr=, "
                        "token_file=, node=)", av[i]);
            return -1;
        }
    }
    return 0;
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
    if (parse_args(ac, av) != 0)
        return -1;
    for (struct spank_option *o = options; o->name; o++) {
        if (spank_option_register(sp, o) != ESPANK_SUCCESS) {
            slurm_error("ferry_spank: cannot register --%s", o->name);
            return -1;
        }
    }
    return 0;
}

/* Remote only: the options as the step received them (sbatch passes them in the environment). */
static int step_wants_ferry(spank_t sp)
{
    char *optarg = NULL;

    if (spank_option_getopt(sp, &options[1], &optarg) == ESPANK_SUCCESS && optarg) {
        if (ferry_check_duration(optarg) != 0)
            return 0;  /* sbatch checked it already; never start a job on a value Ferry refuses */
        snprintf(every, sizeof(every), "%s", optarg);
        want_ferry = 1;
    }
    if (spank_option_getopt(sp, &options[0], &optarg) == ESPANK_SUCCESS)
        want_ferry = 1;
    return want_ferry;
}

/* As root, in the task, before SLURM drops to the job's user: the token the launcher uses. */
int slurm_spank_task_init_privileged(spank_t sp, int ac, char **av)
{
    (void)ac; (void)av;
    if (!spank_remote(sp) || !step_wants_ferry(sp) || token_file == NULL)
        return 0;
    FILE *f = fopen(token_file, "r");
    if (f == NULL) {
        slurm_info("ferry: cannot read %s (%s): the job runs without Ferry's token", token_file,
                   strerror(errno));
        return 0;
    }
    size_t n = fread(token, 1, sizeof(token) - 1, f);
    fclose(f);
    token[n] = '\0';
    while (n > 0 && isspace((unsigned char)token[n - 1]))
        token[--n] = '\0';
    return 0;
}

static void unset_options(spank_t sp)
{
    /* A step started inside a --ferry batch job must not inherit --ferry: the batch job's tree
     * is already one Ferry job, and srun's own steps run under other slurmstepds. */
    static const char *names[] = {"SPANK__SLURM_SPANK_OPTION_ferry_ferry",
                                  "SPANK__SLURM_SPANK_OPTION_ferry_ferry_every",
                                  "_SLURM_SPANK_OPTION_ferry_ferry",
                                  "_SLURM_SPANK_OPTION_ferry_ferry_every", NULL};
    for (const char **n = names; *n; n++)
        spank_unsetenv(sp, *n);
}

int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
    (void)ac; (void)av;
    int argc = 0;
    char **argv = NULL;
    uint32_t job_id = 0, step_id = 0, ntasks = 0;
    char buf[32];

    if (!spank_remote(sp) || !step_wants_ferry(sp))
        return 0;
    unset_options(sp);
    if (launcher == NULL) {
        slurm_info("ferry: plugstack.conf gives no ferry= launcher: the job runs without Ferry");
        return 0;
    }
    if (access(launcher, X_OK) != 0) {
        slurm_info("ferry: %s cannot be run (%s): the job runs without Ferry", launcher,
                   strerror(errno));
        return 0;
    }
    if (spank_get_item(sp, S_JOB_ARGV, &argc, &argv) != ESPANK_SUCCESS || argc < 1 || !argv[0]) {
        slurm_info("ferry: the step has no program: the job runs without Ferry");
        return 0;
    }
    spank_get_item(sp, S_JOB_ID, &job_id);
    spank_get_item(sp, S_JOB_STEPID, &step_id);
    spank_get_item(sp, S_JOB_LOCAL_TASK_COUNT, &ntasks);
    if (ntasks > 1) {
        slurm_info("ferry: step %u.%u has %u tasks on this node; Ferry takes single-task steps "
                   "only: it runs without Ferry", job_id, step_id, ntasks);
        return 0;
    }

    spank_setenv(sp, "FERRY_SLURM_ARGV0", argv[0], 1);
    snprintf(buf, sizeof(buf), "%u", job_id);
    spank_setenv(sp, "FERRY_SLURM_JOB_ID", buf, 1);
    snprintf(buf, sizeof(buf), "%u", step_id);
    spank_setenv(sp, "FERRY_SLURM_STEP_ID", buf, 1);
    spank_setenv(sp, "FERRY_SLURM_EVERY", every, 1);
    if (addr)
        spank_setenv(sp, "FERRY_ADDR", addr, 1);
    if (node)
        spank_setenv(sp, "FERRY_NODE_ID", node, 1);
    if (token[0])
        spank_setenv(sp, "FERRY_TOKEN", token, 1);
    /* the launcher is `ferry slurm-task ARGS...`: it needs its own word, so it reads the step's
     * arguments after argv[0] itself (FERRY_SLURM_LAUNCH tells it it was started this way) */
    spank_setenv(sp, "FERRY_SLURM_LAUNCH", "1", 1);
    argv[0] = launcher;  /* the step's own copy, in this forked task: SLURM execs it next */
    return 0;
}

/* rollfleet-launch: start one sandbox command in its session's cgroups, under its rlimits,
 * apart from the other sessions' mounts, then exec it (envs/launcher.py builds this file).
 *
 *   rollfleet-launch [--cgroup DIR]... [--rlimit NAME=N]... [--apart REPO MOUNTS STAGE] -- ARGV
 *
 * --cgroup: join DIR (its cgroup.procs); --rlimit: soft = hard = N, NAME as prlimit(1) names
 * it (cpu, as, fsize, nofile, core, nproc); --apart: in a mount namespace of its own, bind REPO
 * at STAGE and detach MOUNTS (every session's tmpfs), so that bwrap walks a short mount table.
 * One exec does what a shell, prlimit, unshare, a second shell, mount and umount did: at 1,000
 * sessions umount alone parsed the whole mount table at every sandbox start. A failure to set
 * any of it up is said on stderr after "rollfleet-sandbox: " (envs/sandbox.py::LAUNCH_FAILED),
 * exit status 1 (a command that cannot be run included: it is bwrap or git, never the agent's).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <unistd.h>

static const char *FAILED = "rollfleet-sandbox: ";

static int fail(const char *what, const char *arg) {
    fprintf(stderr, "%s%s %s: %s\n", FAILED, what, arg, strerror(errno));
    return 1;
}

static int join(const char *dir) {
    char path[4096], pid[32];
    int n = snprintf(pid, sizeof pid, "%d\n", (int)getpid());
    snprintf(path, sizeof path, "%s/cgroup.procs", dir);
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0 || write(fd, pid, n) != n)
        return fail("could not join the session's cgroup", dir);
    close(fd);
    return 0;
}

static const struct { const char *name; int resource; } LIMITS[] = {
    {"cpu", RLIMIT_CPU}, {"as", RLIMIT_AS}, {"fsize", RLIMIT_FSIZE},
    {"nofile", RLIMIT_NOFILE}, {"core", RLIMIT_CORE}, {"nproc", RLIMIT_NPROC},
};

static int limit(const char *spec) {
    const char *eq = strchr(spec, '=');
    for (size_t i = 0; eq && i < sizeof LIMITS / sizeof LIMITS[0]; i++) {
        if (strlen(LIMITS[i].name) != (size_t)(eq - spec) || strncmp(spec, LIMITS[i].name, eq - spec))
            continue;
        char *end;
        errno = 0;
        unsigned long long n = strtoull(eq + 1, &end, 10);
        if (errno || *end) break;
        struct rlimit r = {n, n};
        return setrlimit(LIMITS[i].resource, &r) ? fail("could not set the rlimit", spec) : 0;
    }
    errno = EINVAL;
    return fail("no such rlimit", spec);
}

static int apart(const char *repo, const char *mounts, const char *stage) {
    static const char *APART = "could not set the session's mounts apart";
    if (unshare(CLONE_NEWNS) || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL))
        return fail(APART, "(unshare)");
    if (mount(repo, stage, NULL, MS_BIND, NULL))
        return fail(APART, repo);
    if (umount2(mounts, MNT_DETACH))
        return fail(APART, mounts);
    return chdir("/") ? fail(APART, "/") : 0;
}

int main(int argc, char **argv) {
    int i = 1;
    for (; i < argc && strcmp(argv[i], "--"); i++) {
        int bad;
        if (!strcmp(argv[i], "--cgroup") && i + 1 < argc)
            bad = join(argv[++i]);
        else if (!strcmp(argv[i], "--rlimit") && i + 1 < argc)
            bad = limit(argv[++i]);
        else if (!strcmp(argv[i], "--apart") && i + 3 < argc)
            bad = apart(argv[i + 1], argv[i + 2], argv[i + 3]), i += 3;
        else {
            fprintf(stderr, "%sunknown or incomplete option %s\n", FAILED, argv[i]);
            return 1;
        }
        if (bad) return 1;
    }
    if (i + 1 >= argc) {
        fprintf(stderr, "%sno command after --\n", FAILED);
        return 1;
    }
    execvp(argv[i + 1], argv + i + 1);
    return fail("could not run", argv[i + 1]);
}

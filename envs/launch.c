/* rollfleet-launch: start one sandbox command in its session's cgroups, under its rlimits,
 * apart from the other sessions' mounts, then exec it (envs/launcher.py builds this file).
 *
 *   rollfleet-launch [--cgroup DIR]... [--rlimit NAME=N]... [--apart REPO TEMPLATE STAGE] -- ARGV
 *   rollfleet-launch --hold POINT...
 *
 * --cgroup: join DIR (its cgroup.procs); --rlimit: soft = hard = N, NAME as prlimit(1) names
 * it (cpu, as, fsize, nofile, core, nproc); --apart: take a clone of the mount at REPO (the
 * session's tmpfs), enter a copy of the mount namespace TEMPLATE (a /proc/PID/ns/mnt) and put
 * the clone at STAGE, so that bwrap walks a short mount table. --hold makes such a template and
 * keeps it: a private mount namespace of its own where each POINT (every session's tmpfs) is
 * detached; it writes "ready" and lives until its standard input closes (envs/mount_template.py).
 * Copying the host's namespace and detaching the sessions' mounts at every start instead cost
 * O(open sessions): 6% of the host's CPU at 1,024 sessions (perf). One exec does what a shell,
 * prlimit, unshare, a second shell, mount and umount did. A failure to set any of it up is said
 * on stderr after "rollfleet-sandbox: " (envs/sandbox.py::LAUNCH_FAILED), exit status 1 (a
 * command that cannot be run included: it is bwrap or git, never the agent's).
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

static int apart(const char *repo, const char *template, const char *stage) {
    static const char *APART = "could not set the session's mounts apart";
    int tree = open_tree(AT_FDCWD, repo, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
    if (tree < 0)
        return fail(APART, repo);
    int ns = open(template, O_RDONLY | O_CLOEXEC);
    if (ns < 0 || setns(ns, CLONE_NEWNS))
        return fail(APART, template);
    close(ns);
    if (unshare(CLONE_NEWNS))  /* the template itself stays as it is */
        return fail(APART, "(unshare)");
    if (move_mount(tree, "", AT_FDCWD, stage, MOVE_MOUNT_F_EMPTY_PATH))
        return fail(APART, stage);
    close(tree);
    return chdir("/") ? fail(APART, "/") : 0;
}

static int hold(int n, char **points) {
    static const char *HOLD = "could not make the mount template";
    if (unshare(CLONE_NEWNS) || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL))
        return fail(HOLD, "(unshare)");
    for (int i = 0; i < n; i++)  /* one may have gone since it was listed, or with a parent */
        if (umount2(points[i], MNT_DETACH) && errno != EINVAL && errno != ENOENT)
            return fail(HOLD, points[i]);
    if (write(1, "ready\n", 6) != 6)
        return fail(HOLD, "(stdout)");
    char c;
    while (read(0, &c, 1) > 0) {}
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--hold"))
        return hold(argc - 2, argv + 2);
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

#!/usr/bin/python3
"""A second local user attacks root's ddprun and train through shared folders.

Real processes: the test creates an unprivileged user (useradd, removed with
userdel at the end), makes a sticky world-writable folder like /tmp, and as
that user plants symlinks where root's `ddprun --log-dir` and `train
--checkpoint-dir` will write, each pointing at a root-only canary file (and a
root-only folder). Root then runs ddprun and train there. The canary must stay
byte-identical and nothing may appear in the root-only folder; every refusal
is one line naming the path. A folder the user owns is refused as a log or
checkpoint folder, and a --log-dir with a newline is refused in one line.

Root only (it creates a user): exits 77 (skipped) otherwise.
Debian's /usr/bin/python3, standard library only.
Usage: local_user_test.py DDPRUN TRAIN
"""
import hashlib
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile

SKIP = 77
DEADLINE_S = 300  # per process: generous, the machine may be busy


def run(argv, user=None, env=None):
    """Runs argv (as `user`'s uid/gid when given) with a deadline."""
    kwargs = {}
    if user is not None:
        uid, gid = user

        def drop():
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)

        kwargs["preexec_fn"] = drop
    return subprocess.run(argv, capture_output=True, text=True, timeout=DEADLINE_S,
                          env=env, **kwargs)


def run_train(argv, env):
    """train as rank 0 of 1, which binds MASTER_PORT for its TCPStore before
    it opens the checkpoint folder: a port another test's connection took
    meanwhile (EADDRINUSE, seen under ctest -j2 at load) is not what this
    test checks, so such a run is repeated on a fresh port, twice at most."""
    for tries in range(3):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        r = run(argv, env=dict(env, MASTER_PORT=str(port)))
        if "Address already in use" not in r.stdout + r.stderr:
            break
    return r


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def main():
    if os.geteuid() != 0 or not shutil.which("useradd"):
        print("skipped: needs root and useradd to create a second user")
        return SKIP
    ddprun, train = sys.argv[1], sys.argv[2]
    name = "ddpt" + secrets.token_hex(4)
    made = subprocess.run(["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                          capture_output=True, text=True, timeout=60)
    if made.returncode != 0:
        print("skipped: useradd failed: " + made.stderr.strip())
        return SKIP
    failures = []
    top = tempfile.mkdtemp(prefix="ddprun-localuser-")
    try:
        import pwd
        pw = pwd.getpwnam(name)
        her = (pw.pw_uid, pw.pw_gid)
        os.chmod(top, 0o755)
        # Root's secrets: a root-only folder with a canary file in it.
        vault = os.path.join(top, "vault")
        os.mkdir(vault, 0o700)
        canary = os.path.join(vault, "canary")
        with open(canary, "wb") as f:
            f.write(secrets.token_bytes(4096))
        canary_sum = digest(canary)
        # The shared folder, like /tmp.
        shared = os.path.join(top, "shared")
        os.mkdir(shared)
        os.chmod(shared, 0o1777)

        def check(cond, what):
            if not cond:
                failures.append(what)
                print("FAIL: " + what)

        def as_her(*argv):
            r = run(list(argv), user=her)
            check(r.returncode == 0, "planting %s as %s: %s" % (argv, name, r.stderr.strip()))

        def refused(r, culprit, what):
            lines = [l for l in r.stderr.splitlines() if l.strip()]
            check(r.returncode != 0, what + ": exit status 0, expected a refusal")
            check(any(culprit in l and "refusing" in l for l in lines),
                  what + ": no one-line refusal naming %s in: %s" % (culprit, r.stderr))

        env = dict(os.environ)
        env.pop("XDG_RUNTIME_DIR", None)

        # 1. --log-dir is a symlink she planted to root's folder.
        as_her("ln", "-s", vault, os.path.join(shared, "logs"))
        r = run([ddprun, "--standalone", "--nproc-per-node", "1", "--log-dir",
                 os.path.join(shared, "logs"), "/bin/true"], env=env)
        refused(r, os.path.join(shared, "logs"), "planted --log-dir symlink")

        # 2. A log folder she owns, with attempt_0/0/stdout.log pre-planted
        #    as a symlink to the canary (every run folder name guessed is moot:
        #    the folder itself is refused).
        herlogs = os.path.join(shared, "herlogs")
        as_her("mkdir", "-m", "0777", herlogs)
        r = run([ddprun, "--standalone", "--nproc-per-node", "1", "--log-dir", herlogs,
                 "/bin/true"], env=env)
        refused(r, herlogs, "log folder owned by another user")

        # 3. A root log folder in the shared one works, and its run folder is
        #    closed to her: she cannot plant anything below it.
        rootlogs = os.path.join(shared, "rootlogs")
        r = run([ddprun, "--standalone", "--nproc-per-node", "1", "--log-dir", rootlogs,
                 "/bin/echo", "hello"], env=env)
        check(r.returncode == 0, "root's own log folder in a sticky one: " + r.stderr)
        runs = os.listdir(rootlogs) if os.path.isdir(rootlogs) else []
        check(len(runs) == 1, "one run folder, got %s" % runs)
        if runs:
            run_dir = os.path.join(rootlogs, runs[0])
            check(os.stat(run_dir).st_mode & 0o777 == 0o700, "run folder mode 0700")
            out = os.path.join(run_dir, "attempt_0", "0", "stdout.log")
            check(os.path.isfile(out) and open(out).read() == "hello\n", "stdout.log written")
            p = run(["ln", "-s", canary, os.path.join(run_dir, "attempt_1")], user=her)
            check(p.returncode != 0, "she could plant in root's run folder")

        # 4. A --log-dir with a newline: one line, the newline escaped.
        r = run([ddprun, "--standalone", "--nproc-per-node", "1", "--log-dir",
                 os.path.join(shared, "x\nINFO forged"), "/bin/true"], env=env)
        check(r.returncode == 2, "newline --log-dir: exit %d, expected 2" % r.returncode)
        check("INFO forged" not in [l.strip() for l in r.stderr.splitlines()] and
              "x\\nINFO forged" in r.stderr, "newline --log-dir is one line: " + r.stderr)

        # 5. A checkpoint folder she pre-created, with the names the old
        #    writer used planted as symlinks to the canary.
        herckpt = os.path.join(shared, "herckpt")
        as_her("mkdir", "-m", "0777", herckpt)
        for n in ["step-0000000010.bin", "step-0000000010.json",
                  "step-0000000010.bin.tmp.%d" % os.getpid(), "lock"]:
            as_her("ln", "-s", canary, os.path.join(herckpt, n))
        train_argv = [train, "--backend", "gloo", "--log-every", "0", "--steps", "20",
                      "--checkpoint-every", "10", "--checkpoint-dir"]
        tenv = dict(env, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                    MASTER_ADDR="127.0.0.1")
        r = run_train(train_argv + [herckpt], tenv)
        check(r.returncode != 0, "train in her checkpoint folder: exit 0")
        check("owned by uid %d" % her[0] in r.stdout + r.stderr,
              "train names the folder's owner: " + (r.stdout + r.stderr)[-2000:])

        # 6. The checkpoint folder is a symlink she planted to root's folder.
        as_her("ln", "-s", vault, os.path.join(shared, "ckpt"))
        r = run_train(train_argv + [os.path.join(shared, "ckpt")], tenv)
        check(r.returncode != 0, "train through her checkpoint symlink: exit 0")
        check("symlink owned by uid %d" % her[0] in r.stdout + r.stderr,
              "train names the planted symlink: " + (r.stdout + r.stderr)[-2000:])

        check(digest(canary) == canary_sum, "the canary changed")
        check(sorted(os.listdir(vault)) == ["canary"],
              "root's folder gained %s" % sorted(os.listdir(vault)))
    finally:
        shutil.rmtree(top, ignore_errors=True)
        subprocess.run(["userdel", name], capture_output=True, timeout=60)
    if failures:
        print("%d failure(s)" % len(failures))
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())

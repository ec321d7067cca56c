#!/usr/bin/env python3
"""The include graph against the layers README.md draws:

    base < rendezvous < agent < watchdog < introspect < observe < launcher, trainer

A component's files may include its own headers and those of the layers
below it, never one above (or beside: launcher and trainer do not include
each other). The build runs this (target ddprun_layers), so a stray upward
include fails it; ctest's `layers` runs it and `layers.planted` proves that a
planted upward include is rejected.

Usage: check_layers.py [ROOT]      exit 0, or 1 listing each violation
       check_layers.py --self-test exit 0 when a planted violation is caught
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

# What each component may include (besides the standard library and
# third-party headers). watchdog sits on agent (its hook implements the
# agent's AgentHooks); the trainer's workers use the watchdog's heartbeat
# client and the store, never the agent.
ALLOWED = {
    "base": {"base"},
    "rendezvous": {"base", "rendezvous"},
    "agent": {"base", "rendezvous", "agent"},
    "watchdog": {"base", "rendezvous", "agent", "watchdog"},
    "introspect": {"base", "rendezvous", "agent", "watchdog", "introspect"},
    "observe": {"base", "rendezvous", "agent", "watchdog", "introspect", "observe"},
    "launcher": {"base", "rendezvous", "agent", "watchdog", "introspect", "observe", "launcher"},
    "trainer": {"base", "rendezvous", "watchdog", "trainer"},
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([a-z_]+)/')
SOURCES = (".h", ".cc", ".cpp", ".hpp")


def violations(root):
    found = []
    for component, allowed in sorted(ALLOWED.items()):
        top = os.path.join(root, component)
        for folder, dirs, files in os.walk(top):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for name in sorted(files):
                if not name.endswith(SOURCES):
                    continue
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8", errors="replace") as f:
                    for number, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if m and m.group(1) in ALLOWED and m.group(1) not in allowed:
                            found.append(
                                f"{os.path.relpath(path, root)}:{number}: includes {m.group(1)}/, "
                                f"above {component}/ (it may include {', '.join(sorted(allowed))})")
    return found


def self_test():
    here = os.path.abspath(__file__)
    with tempfile.TemporaryDirectory() as tmp:
        os.makedirs(os.path.join(tmp, "rendezvous"))
        os.makedirs(os.path.join(tmp, "agent"))
        with open(os.path.join(tmp, "agent", "ok.cc"), "w") as f:
            f.write('#include "rendezvous/store.h"\n#include "base/scoped_fd.h"\n')
        clean = subprocess.run([sys.executable, here, tmp], capture_output=True, text=True)
        if clean.returncode != 0:
            print("a tree with downward includes only was rejected:\n" + clean.stdout)
            return 1
        with open(os.path.join(tmp, "rendezvous", "planted.h"), "w") as f:
            f.write('#pragma once\n#include <string>\n#include "agent/hooks.h"\n')
        planted = subprocess.run([sys.executable, here, tmp], capture_output=True, text=True)
        want = "rendezvous/planted.h:3: includes agent/, above rendezvous/"
        if planted.returncode != 1 or want not in planted.stdout:
            print(f"the planted upward include passed (status {planted.returncode}):\n{planted.stdout}")
            return 1
    print("a planted upward include (rendezvous/ -> agent/) is rejected, naming file and line")
    return 0


def main(argv):
    if argv[1:] == ["--self-test"]:
        return self_test()
    root = argv[1] if len(argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    found = violations(root)
    for v in found:
        print(v)
    if found:
        print(f"{len(found)} upward include(s): the layers are base < rendezvous < agent < watchdog "
              "< introspect < launcher, trainer (scripts/check_layers.py)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

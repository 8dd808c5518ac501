"""Each submission in a container of its own (docker or podman), for a class you do not trust.

    docker build -t course-grader -f tools/grader/Containerfile .      # once per course version
    python -m tools.grade SUBMISSIONS_DIR --container docker -j 2      # or --container podman

The image holds what a student has (``emulator/``, ``lessons/``), the runner
(``tools/grader/``) and the course's pinned packages; never ``solutions/`` or the rest of
``tools/``. The grader assembles each notebook on the host (that needs the sources) and
mounts only that job's folder; the container has no network, no capabilities, a read-only
root, a memory and process limit, and is removed when it ends, taking every process the
submission started with it.
"""

import os
import shutil

ENGINES = ("docker", "podman")
IMAGE = "course-grader"
COURSE_IN_IMAGE = "/opt/course"


def available(engine):
    return shutil.which(engine) is not None


def name_for(token):
    return f"course-grade-{token}"


def command(engine, image, job, memory_mb, token):
    """The command that runs the runner on ``job`` (a host folder) in a fresh container."""
    if engine not in ENGINES:
        raise ValueError(f"container engine {engine!r}: use one of {', '.join(ENGINES)}")
    limits = [f"--memory={memory_mb + 512}m", f"--memory-swap={memory_mb + 512}m"] if memory_mb else []
    return [engine, "run", "--rm", f"--name={name_for(token)}", "--network=none", "--cap-drop=ALL",
            "--security-opt=no-new-privileges", "--read-only", "--tmpfs=/tmp:rw,exec,size=2g", "--pids-limit=256",
            "--cpus=1", *limits, f"--user={os.getuid()}:{os.getgid()}", "--env=HOME=/tmp",
            f"--volume={os.path.abspath(job)}:/job:rw", f"--workdir={COURSE_IN_IMAGE}", image,
            "python", "-m", "tools.grader.runner", "/job", "--course", COURSE_IN_IMAGE]


def kill_command(engine, token):
    return [engine, "kill", name_for(token)]

"""Runs first inside the sandbox, as ``python -I -S -u -c <this file's source> <settings json>``.

It reads the job from stdin — a decimal byte count on the first line, then that many bytes of
JSON ``{"code": str, "files": {relative path: base64}}``, read unbuffered so the rest of stdin
stays in the pipe for the program — writes ``main.py`` and the files into the working
directory, applies the resource limits, switches to the run's own uid when one is given, and
replaces itself with ``python -I -u main.py``. Standard library only.
"""

import base64
import json
import os
import resource
import sys


def _read_exact(fd, count):
    chunks = []
    while count > 0:
        chunk = os.read(fd, min(count, 1 << 16))
        if not chunk:
            break
        chunks.append(chunk)
        count -= len(chunk)
    return b"".join(chunks)


def _read_header(fd):
    line = b""
    while not line.endswith(b"\n"):
        byte = os.read(fd, 1)
        if not byte:
            break
        line += byte
    return int(line.strip() or b"0")


def _write(workdir, name, data, uid):
    path = os.path.normpath(os.path.join(workdir, name))
    if not path.startswith(workdir + os.sep):
        sys.exit(f"sandbox: file name {name!r} leaves the working directory")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
    if uid is not None:
        os.chown(path, uid, uid)


def main():
    settings = json.loads(sys.argv[1])
    workdir, uid = settings["workdir"], settings.get("uid")
    job = json.loads(_read_exact(0, _read_header(0)))
    _write(workdir, "main.py", job["code"].encode("utf-8"), uid)
    for name, content in job.get("files", {}).items():
        _write(workdir, name, base64.b64decode(content), uid)
    for name, (soft, hard) in settings["rlimits"].items():
        resource.setrlimit(getattr(resource, name), (soft, hard))
    if uid is not None:
        os.chown(workdir, uid, uid)
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    os.chdir(workdir)
    os.execv(settings["python"], [settings["python"], "-I", "-u", "main.py"])


main()

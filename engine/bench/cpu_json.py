#!/usr/bin/env python3
"""Run a command that prints one JSON object on stdout; print that object with the command's
CPU time added: "engine" (argv[1]), "cpu_s" (user + system seconds of the child and its threads,
from getrusage(RUSAGE_CHILDREN)). Used by decode_vs_llamacpp.sh for the load-insensitive
CPU-time comparison (CPU of an N-token run minus CPU of a 1-token run = CPU of N-1 decode steps).

Usage: cpu_json.py ENGINE_NAME COMMAND [ARGS...]
"""

import json
import resource
import subprocess
import sys


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit("usage: cpu_json.py ENGINE_NAME COMMAND [ARGS...]")
    proc = subprocess.run(sys.argv[2:], stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        sys.exit(f"error: {sys.argv[2]} exited with {proc.returncode}")
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        obj = json.loads(proc.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError) as e:
        sys.exit(f"error: {sys.argv[2]} printed no JSON object on its last line: {e}")
    obj["engine"] = sys.argv[1]
    obj["cpu_s"] = ru.ru_utime + ru.ru_stime
    print(json.dumps(obj))


if __name__ == "__main__":
    main()

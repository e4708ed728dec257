"""What the benchmark scripts share: running a command, and an `oxpool serve` started for
one run and stopped by its process id."""

import re
import signal
import subprocess
import sys
import threading
import time


def run(cmd, **kw):
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed: {r.stderr.strip()[-500:]}")
    return r


class Server:
    def __init__(self, oxpool, cache, args, start_timeout_s=120):
        self.proc = subprocess.Popen(
            [oxpool, "--cache-file", cache, "serve", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.uri = None
        self.timeout_s = start_timeout_s
        deadline = time.time() + start_timeout_s
        for line in self.proc.stdout:
            m = re.search(r"(nbd://\S+/tank/vol0)\b", line)
            if m and self.uri is None:
                self.uri = m.group(1)
            if line.startswith("ready"):
                break
            if time.time() > deadline:
                break
        if self.uri is None:
            self.stop()
            sys.exit("the server printed no URI for tank/vol0")
        threading.Thread(target=lambda: [None for _ in self.proc.stdout], daemon=True).start()

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()

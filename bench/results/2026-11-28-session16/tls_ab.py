#!/usr/bin/env python3
"""A/B two oxpool binaries over TLS (or plain): each its own pool, warm cache, alternating fio runs.
env: BIN_A BIN_B N RT SIZE FIOARGS PLAIN=1"""
import json, os, shutil, subprocess, sys, time
W = "/var/tmp/tlsab"
shutil.rmtree(W, ignore_errors=True)
os.makedirs(f"{W}/pki/server"); os.makedirs(f"{W}/home/.pki/libnbd")
N = int(os.environ.get("N", 4)); RT = os.environ.get("RT", "6"); SIZE = os.environ.get("SIZE", "1G")
FIO = os.environ["FIOARGS"].split(); PLAIN = os.environ.get("PLAIN") == "1"
def sh(cmd, **kw): return subprocess.run(cmd, shell=True, check=True, capture_output=True, text=True, cwd=f"{W}/pki", **kw)
sh("certtool --generate-privkey --bits 2048 --outfile ca-key.pem")
sh("printf 'cn = bench CA\\nca\\ncert_signing_key\\nexpiration_days = 10\\n' > ca.info")
sh("certtool --generate-self-signed --load-privkey ca-key.pem --template ca.info --outfile server/ca-cert.pem")
sh("certtool --generate-privkey --bits 2048 --outfile server/server-key.pem")
sh("printf 'cn = localhost\\ndns_name = localhost\\nip_address = 127.0.0.1\\ntls_www_server\\nencryption_key\\nsigning_key\\nexpiration_days = 10\\n' > s.info")
sh("certtool --generate-certificate --load-ca-certificate server/ca-cert.pem --load-ca-privkey ca-key.pem --load-privkey server/server-key.pem --template s.info --outfile server/server-cert.pem")
shutil.copy(f"{W}/pki/server/ca-cert.pem", f"{W}/home/.pki/libnbd/")
env = dict(os.environ, HOME=f"{W}/home")
servers = {}
try:
    for name, binary, port in [("a", os.environ["BIN_A"], 10901), ("b", os.environ["BIN_B"], 10902)]:
        c = [binary, "--cache-file", f"{W}/{name}.cache"]
        subprocess.run(c + ["create", name, f"{W}/{name}.img", "--size", "3G"], check=True, capture_output=True)
        subprocess.run(c + ["vol", "create", f"{name}/vol0", "--size", SIZE], check=True, capture_output=True)
        tls = [] if PLAIN else ["--tls", "require", "--tls-certificates", f"{W}/pki/server"]
        log = open(f"{W}/{name}.log", "w")
        p = subprocess.Popen(c + ["serve", name, "--listen", f"127.0.0.1:{port}"] + tls, stdout=log, stderr=log)
        for _ in range(100):
            if "ready" in open(f"{W}/{name}.log").read(): break
            time.sleep(0.1)
        uri = f"{'nbd' if PLAIN else 'nbds'}://localhost:{port}/{name}/vol0"
        servers[name] = (p, uri)
        for rw, bs in [("write", "1m"), ("read", "1m")]:
            subprocess.run(["fio", "--name=fill", "--ioengine=nbd", f"--uri={uri}", f"--rw={rw}", f"--bs={bs}", "--iodepth=4", f"--size={SIZE}"], check=True, capture_output=True, env=env)
    def ticks(pid):
        f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return int(f[11]) + int(f[12])
    res = {"a": [], "b": []}
    for i in range(N):
        for name in ("a", "b"):
            p, uri = servers[name]
            t0 = ticks(p.pid)
            r = subprocess.run(["fio", "--name=x", "--ioengine=nbd", f"--uri={uri}", f"--size={SIZE}", f"--runtime={RT}", "--time_based", "--output-format=json"] + FIO, capture_output=True, text=True, env=env)
            t1 = ticks(p.pid)
            t = r.stdout; j = json.loads(t[t.index("{"):])["jobs"][0]
            ios = j["read"]["total_ios"] + j["write"]["total_ios"]; iops = j["read"]["iops"] + j["write"]["iops"]
            cpu = (t1 - t0) * 1e6 / os.sysconf("SC_CLK_TCK") / max(ios, 1)
            res[name].append((iops, cpu))
            print(f"{name} {iops:8.0f} IOPS  server {cpu:6.1f} us/IO", flush=True)
    for name in ("a", "b"):
        iops = sorted(x[0] for x in res[name]); cpu = sorted(x[1] for x in res[name])
        print(f"median {name}: {iops[len(iops)//2]:.0f} IOPS, {cpu[len(cpu)//2]:.1f} us/IO")
finally:
    for p, _ in servers.values():
        p.terminate(); p.wait()
    shutil.rmtree(W, ignore_errors=True)

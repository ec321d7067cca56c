"""One rank of bench/beat_cost_bench.py: automatic beats every BEAT_STEP_MS
for BEAT_WARMUP + BEAT_SECONDS, straight to the agent's heartbeat socket
(the bytes of watchdog/heartbeat_wire.h). Rank 0 marks the measured window
with the files "warm" and "cold"; each rank writes how many beats it sent
inside it."""
import os
import socket
import time

rank = int(os.environ["RANK"])
out = os.environ["BEAT_DIR"]
step = float(os.environ["BEAT_STEP_MS"]) / 1000
warmup = float(os.environ["BEAT_WARMUP"])
seconds = float(os.environ["BEAT_SECONDS"])
sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
sock.connect(os.environ["DDPRUN_HEARTBEAT_SOCKET"])
start = time.monotonic()
warm_at, cold_at = start + warmup, start + warmup + seconds
n, counted, marked = 0, 0, False
while True:
    now = time.monotonic()
    if now >= cold_at:
        break
    n += 1
    try:
        sock.send(b"ab %d %d\n" % (rank, n))
    except OSError:
        pass
    if now >= warm_at:
        counted += 1
        if rank == 0 and not marked:
            open(os.path.join(out, "warm"), "w").close()
            marked = True
    time.sleep(step)
if rank == 0:
    open(os.path.join(out, "cold"), "w").close()
with open(os.path.join(out, "beats_%d" % rank), "w") as f:
    f.write(str(counted))
sock.close()

"""For the attach heartbeat test, run directly (not under ddprun): beats every
20 ms; once the heartbeat socket exists and a beat has gone to it, prints
"heard"; when the file argv[1] exists it stops beating and burns CPU, so only
the missing beats show the hang."""
import os
import sys
import time

import ddprun_heartbeat

sock = os.environ["DDPRUN_HEARTBEAT_SOCKET"]
announced = False
step = 0
while not os.path.exists(sys.argv[1]):
    bound = os.path.exists(sock)
    ddprun_heartbeat.beat(step)
    if bound and not announced:
        print("heard", flush=True)
        announced = True
    step += 1
    time.sleep(0.02)


def spin_without_beating():
    while True:
        pass


spin_without_beating()

# torch's own watchdog: a step wrapped in timer.expires(after=1) that never
# finishes in attempt 0. ddprun serves TORCHELASTIC_TIMER_FILE when it runs
# with TORCHELASTIC_ENABLE_FILE_TIMER=1, exactly as torchrun does.
import os
import time

import torch.distributed.elastic.timer as timer

timer.configure(timer.FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
first = os.environ["TORCHELASTIC_RESTART_COUNT"] == "0"


def train_step_that_never_returns():
    while True:
        time.sleep(1)


for step in range(3):
    with timer.expires(after=1, scope="train_step"):
        if first and step == 2:
            train_step_that_never_returns()
print("done", flush=True)

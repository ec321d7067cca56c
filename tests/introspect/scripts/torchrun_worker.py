"""A rank under torchrun for the attach test: rank 1 stops making progress
(sleeps in stuck()) after a few steps; the others print a step every 20 ms
until they are killed."""
import os
import time


def stuck():
    print("rank 1 stuck", flush=True)
    time.sleep(3600)  # the attach test looks for this function


def main():
    rank = int(os.environ["RANK"])
    for step in range(1000000):
        if rank == 1 and step == 10:
            stuck()
        print("rank %d step %d" % (rank, step), flush=True)
        time.sleep(0.02)


main()

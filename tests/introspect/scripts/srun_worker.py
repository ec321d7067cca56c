"""A task srun starts directly (no launcher) for the Slurm attach test: its
rank is SLURM_PROCID. Rank $STUCK_RANK stops making progress (sleeps in
stuck()) after 10 steps and says so in $OUT/stuck; the others print a step
every 20 ms until they are killed."""
import os
import time


def stuck(out):
    with open(os.path.join(out, "stuck.tmp"), "w") as f:
        f.write("%d\n" % os.getpid())
    os.rename(os.path.join(out, "stuck.tmp"), os.path.join(out, "stuck"))
    time.sleep(3600)  # the test looks for this function in the report


def main():
    rank = int(os.environ["SLURM_PROCID"])
    for step in range(1000000):
        if rank == int(os.environ["STUCK_RANK"]) and step == 10:
            stuck(os.environ["OUT"])
        print("rank %d step %d" % (rank, step), flush=True)
        time.sleep(0.02)


main()

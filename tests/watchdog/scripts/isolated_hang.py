"""A worker run as `python -I` (ddprun's bootstrap and PYTHONFAULTHANDLER are
ignored): prints once, then hangs in a known function; the test looks for
its name and line in the hang report, read from outside by py-spy."""
import time


def wait_here_forever():
    print("isolated worker waiting", flush=True)
    time.sleep(3600)  # line checked by the test


wait_here_forever()

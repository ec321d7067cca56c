"""A worker whose main is wrapped in torch's @record and raises: torch writes
the exception and its traceback to $TORCHELASTIC_ERROR_FILE, which ddprun
reads for its failure summary."""
from torch.distributed.elastic.multiprocessing.errors import record


@record
def main():
    raise RuntimeError("loss is NaN at step 7")


if __name__ == "__main__":
    main()

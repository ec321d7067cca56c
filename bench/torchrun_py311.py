#!/usr/bin/python3
# torchrun from Debian's python3-torch (1.13), made usable on Python 3.11:
# Python 3.11 no longer yields the zero and composite members when iterating
# an IntFlag, so Std.from_str("0") returns None and every launch crashes
# ("'NoneType' object has no attribute 'get'"). This repairs Std.from_str and
# runs the stock torch.distributed.run; same flags as torchrun 1.13. The
# bench's reference point only.
import re
import sys

from torch.distributed.elastic.multiprocessing import api


def _from_str(cls, vm):
    if re.match(api._VALUE_REGEX, vm):
        return api.Std(int(vm))
    if re.match(api._MAPPING_REGEX, vm):
        return {int(i): api.Std(int(v)) for i, v in (m.split(":") for m in vm.split(","))}
    raise ValueError(f"{vm} does not match {api._VALUE_REGEX} or {api._MAPPING_REGEX}")


api.Std.from_str = classmethod(_from_str)

from torch.distributed.run import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())

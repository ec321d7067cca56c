"""`from ddprun import recovery`: rank-scoped recovery (ddprun
--restart-scope=rank) for Python scripts, docs/RECOVERY.md "Python".

The same module as `import ddprun_recovery` (its names re-exported here: one
channel, one state, whichever name a script uses); see its docstring for the
whole training loop. Outside ddprun every helper is a no-op.
"""

from ddprun_recovery import *  # noqa: F401,F403
from ddprun_recovery import __all__, __doc__  # noqa: F401

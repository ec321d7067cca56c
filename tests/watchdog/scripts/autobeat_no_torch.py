# A Python worker that never imports torch: ddprun's bootstrap must not import
# it (nor the heartbeat client) for it; the import hook is only installed.
import sys

hooked = any(type(f).__module__ == "ddprun_autobeat" for f in sys.meta_path)
print("torch=%s hook=%s client=%s" % ("torch" in sys.modules, hooked,
                                      "ddprun_heartbeat" in sys.modules), flush=True)

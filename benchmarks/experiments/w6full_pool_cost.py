import sys, os; sys.path.insert(0, os.getcwd())
import gc, resource, statistics, time, torch
torch.set_num_threads(1)
from benchmarks import cases
from benchmarks.overhead import parity_runner
from benchmarks.models import plain_forwards
from parity_tracker.capture import buffers, snapshot
from parity_tracker.compare import hashing
torch.backends.mha.set_fastpath_enabled(False)
pair = cases.transformer(False)
flag = [True]
buffers.POOL.usable = lambda: flag[0]
acc = {}
def wrap(mod, name, key):
    f = getattr(mod, name)
    def g(*a, **k):
        t0 = time.process_time(); r = f(*a, **k); acc[key] = acc.get(key, 0) + time.process_time() - t0; return r
    setattr(mod, name, g)
wrap(buffers.BufferPool, "copy", "pool.copy")
wrap(snapshot, "storage_digest", "storage_digest(snap)")
wrap(snapshot, "content_hash_in_place", "cow hash")
wrap(snapshot.Snapshotter, "take", "take")
mod = parity_runner(pair, False)[0]
for v in (True, False, True, False, True, False):
    flag[0] = v; acc.clear(); gc.collect(); t0 = time.process_time(); mod(); t = time.process_time() - t0
    print("pool" if v else "cow ", f"{t:.3f}", {k: round(x * 1000, 1) for k, x in acc.items()})

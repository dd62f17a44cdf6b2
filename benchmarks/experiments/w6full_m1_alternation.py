"""The benchmark's own alternation on the full transformer: plain, plain_fast_path, module, ops."""
import sys, os; sys.path.insert(0, os.getcwd())
import gc, resource, statistics, time, torch
torch.set_num_threads(1)
from benchmarks import cases
from benchmarks.overhead import parity_runner, _fast_path_forwards
from benchmarks.models import plain_forwards
torch.backends.mha.set_fastpath_enabled(False)
import parity_tracker.capture.buffers as _b
if os.environ.get("NOPOOL"): _b.POOL_MAX_BYTES = 0
reps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
pair = cases.transformer(False)
c = {"plain": lambda: plain_forwards(pair), "plain_fast_path": lambda: _fast_path_forwards(pair),
     "module": parity_runner(pair, False)[0], "ops": parity_runner(pair, True)[0]}
def once(fn):
    gc.collect()
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t0 = time.process_time(); fn(); t = time.process_time() - t0
    return t, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
c["module"](); c["ops"]()
for fn in c.values(): once(fn)
res = {k: [] for k in c}
items = list(c.items())
for r in range(reps):
    for k, fn in (items if r % 2 == 0 else items[::-1]):
        res[k].append(once(fn))
rat = statistics.median(m[0] / p[0] for m, p in zip(res["module"], res["plain"]))
rop = statistics.median(m[0] / p[0] for m, p in zip(res["ops"], res["plain"]))
med = {k: statistics.median(t for t, _ in v) for k, v in res.items()}
flt = {k: statistics.median(f for _, f in v) for k, v in res.items()}
print(f"{os.getcwd().split('/')[-1]:7s} m1 {rat:.3f} (m2 {rop:.3f})  module {med['module']:.3f} plain {med['plain']:.3f} ops {med['ops']:.3f}  faults module {flt['module']:.0f} plain {flt['plain']:.0f} ops {flt['ops']:.0f}", flush=True)

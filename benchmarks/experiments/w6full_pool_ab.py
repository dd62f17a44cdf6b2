"""In one process: module run with the pool vs copy-on-write, in the benchmark's alternation."""
import sys, os; sys.path.insert(0, os.getcwd())
import gc, resource, statistics, time, torch
torch.set_num_threads(1)
from benchmarks import cases
from benchmarks.overhead import parity_runner, _fast_path_forwards
from benchmarks.models import plain_forwards
from parity_tracker.capture import buffers
torch.backends.mha.set_fastpath_enabled(False)
reps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
pair = cases.transformer(False)
flag = [True]
buffers.POOL.usable = lambda: flag[0]
mod = parity_runner(pair, False)[0]
def with_pool(v):
    def f():
        flag[0] = v; mod()
    return f
c = {"plain": lambda: plain_forwards(pair), "plain_fast_path": lambda: _fast_path_forwards(pair),
     "pool": with_pool(True), "ops": parity_runner(pair, True)[0], "cow": with_pool(False)}
def once(fn):
    gc.collect()
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t0 = time.process_time(); fn(); t = time.process_time() - t0
    return t, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
for fn in c.values(): once(fn)
res = {k: [] for k in c}
items = list(c.items())
for r in range(reps):
    for k, fn in (items if r % 2 == 0 else items[::-1]):
        res[k].append(once(fn))
def rat(k): return statistics.median(m[0] / p[0] for m, p in zip(res[k], res["plain"]))
med = {k: statistics.median(t for t, _ in v) for k, v in res.items()}
flt = {k: statistics.median(f for _, f in v) for k, v in res.items()}
print(f"pool {rat('pool'):.3f} cow {rat('cow'):.3f} | module pool {med['pool']:.3f} cow {med['cow']:.3f} plain {med['plain']:.3f} | faults pool {flt['pool']:.0f} cow {flt['cow']:.0f} plain {flt['plain']:.0f} ops {flt['ops']:.0f}", flush=True)

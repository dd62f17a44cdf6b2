import sys, os; sys.path.insert(0, os.getcwd())
import gc, ctypes, torch
torch.set_num_threads(1)
from benchmarks import cases
from benchmarks.overhead import parity_runner
from benchmarks.models import plain_forwards
torch.backends.mha.set_fastpath_enabled(False)
class MI(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
libc = ctypes.CDLL("libc.so.6"); libc.mallinfo2.restype = MI
pair = cases.transformer(False)
mod = parity_runner(pair, False)[0]
trace = []
def post(name):
    def f(m, a, o):
        mi = libc.mallinfo2(); trace.append((name, mi.uordblks >> 20, mi.arena >> 20))
    return f
for side, m in (("ref", pair.reference), ("cand", pair.candidate)):
    for name, sub in m.named_modules():
        if name.count(".") == 1:
            sub.register_forward_hook(post(side + ":" + name))
for i in range(2): mod(); plain_forwards(pair)
for what, fn in (("plain", lambda: plain_forwards(pair)), ("module", mod)):
    trace.clear(); gc.collect(); fn()
    print(what, " ".join(f"{t[0].split(':')[0][0]}{t[0][-1]}:{t[1]}/{t[2]}" for t in trace))

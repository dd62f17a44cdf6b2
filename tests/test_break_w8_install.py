"""Adversarial cases for wave 8 (w8row): the kept install plan, small copies, training flags.

Every case hooks a model, changes it between two installs, hooks it again and compares what
the second forward captured with an oracle that never reads the plan: torch's own
``named_modules`` / ``named_parameters`` / ``named_buffers`` of the model as it is now, and its
own forward hooks (registered last, so they see what any user hook made), values as numpy.
The small-copies cases count the bytes the captures really hold (walking every capture, not
the store's counter) and check every row against numpy.

The file imports only what main also has (``install_plan`` is optional), so it can be run
against main's checkout to tell an older bug from a new one.
"""

from __future__ import annotations

import copy
import gc
import warnings
import weakref

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn.utils import parametrize, prune

from parity_tracker.capture.leaves import NonTensor
from parity_tracker.capture.tags import input_tag, module_tag, output_tag, param_tag
from parity_tracker.compare.batch import HeldBytes
from parity_tracker.compare.pairing import load
from parity_tracker.errors import InputError
from parity_tracker.run.run import run_parity
from parity_tracker.statuses import PASSING
from parity_tracker.tensor_checker import TensorChecker, module_register_tensor_checker

try:  # w8row's module; main has none (then the cases run against a fresh walk each time)
    from parity_tracker.capture import install_plan
except ImportError:  # pragma: no cover - main
    install_plan = None

X = np.array([[1.0, -2.0, 0.5], [0.25, 3.0, -1.5]], dtype=np.float32)


@pytest.fixture(autouse=True)
def _fresh_plans():
    if install_plan is not None:
        install_plan.forget_plans()
    yield
    if install_plan is not None:
        install_plan.forget_plans()


# ----------------------------------------------------------------------------- the oracle


def _np(t: torch.Tensor) -> np.ndarray:
    if t.is_quantized:
        t = t.dequantize()
    return t.detach().cpu().clone().numpy()


def oracle(model: nn.Module, x: torch.Tensor) -> dict[str, np.ndarray]:
    """``{tag: value}`` the contract (design.md, "Public names") says one forward registers.

    Built from torch's walk of the model as it is now and torch's own hooks (each module is
    called at most once in these models); weights under every qualified name
    (``remove_duplicate=False``), a ``None`` slot has none.
    """
    root = "root" if any(n == "model" for n, _ in model.named_children()) else "model"
    out: dict[str, np.ndarray] = {}
    handles = []
    for name, mod in model.named_modules():
        if isinstance(mod, torch.jit.ScriptModule):
            continue  # TorchScript takes no Python hooks (its weights are still registered)
        if mod is not model and type(mod).forward is nn.Module.forward:
            continue  # a pure container: not hooked
        disp = name or root

        def pre(m, args, disp=disp):
            assert module_tag(disp) not in out, "oracle models call each module once"
            for i, a in enumerate(args):
                out[input_tag(disp, str(i))] = _np(a)

        def post(m, args, output, disp=disp):
            out[module_tag(disp)] = _np(output)

        handles.append(mod.register_forward_pre_hook(pre))
        handles.append(mod.register_forward_hook(post))
    try:
        with torch.no_grad():
            model(x.clone())
    finally:
        for h in handles:
            h.remove()
    for qname, p in model.named_parameters(remove_duplicate=False):
        out[param_tag(qname)] = _np(p)
    for qname, b in model.named_buffers(remove_duplicate=False):
        out[param_tag(qname)] = _np(b)
    return out


def captured(model: nn.Module, x: torch.Tensor, **kw) -> dict[str, np.ndarray]:
    """``{tag: value}`` one hooked forward of ``model`` registered (one side, deferred)."""
    checker = TensorChecker(verbose=False, **kw)
    with module_register_tensor_checker(model, checker, side=0), torch.no_grad():
        model(x.clone())
    out = {}
    for (tag, _step), g in checker._log.groups.items():
        value = g.captures[0].value
        if value is not None and not isinstance(value, NonTensor):  # a tensor leaf
            out[tag] = _np(load(value))
    return out


def assert_same(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert sorted(got) == sorted(want)
    for tag, value in want.items():
        assert got[tag].dtype == value.dtype, tag
        np.testing.assert_array_equal(got[tag], value, err_msg=tag)


def kept(model: nn.Module) -> bool:
    """A plan is kept for ``model`` (main: no plans; the case then checks a fresh walk)."""
    if install_plan is None:
        return True
    plan = install_plan._PLANS.get(id(model))
    return plan is not None and plan._refs[0]() is model


# ----------------------------------------------------------------------------- the models


def lin(seed: int, n: int = 3) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(n, n)


class Doubler(nn.Module):
    def forward(self, x):
        return 2 * x


class Tripled(nn.Linear):
    """A Linear whose output is tripled (a ``__class__`` swap target)."""

    def forward(self, x):
        return 3 * super().forward(x)


class Neg(nn.Module):
    def forward(self, w):
        return -w


class Net(nn.Module):
    """Runs ``x * scale + shift`` then every child in order (ModuleLists item by item).

    A child with ``idle = True`` is not called (its weights are still registered).
    """

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        self.a = lin(seed + 1)
        self.inner = nn.Sequential(lin(seed + 2), nn.Tanh())
        self.blocks = nn.ModuleList([lin(seed + 3), lin(seed + 4)])
        self.register_buffer("shift", torch.tensor([0.5, -0.25, 1.0]))
        self.scale = nn.Parameter(torch.tensor([1.0, 2.0, -1.0]))

    def forward(self, x):
        if self.scale is not None:
            x = x * self.scale
        if self.shift is not None:
            x = x + self.shift
        for m in self.children():
            if isinstance(m, nn.ModuleList | nn.ModuleDict):
                for b in m.values() if isinstance(m, nn.ModuleDict) else m:
                    x = b(x)
            elif not getattr(m, "idle", False):
                x = m(x)
        return x


def _nonpersistent(m: Net) -> None:
    t = m.shift
    del m.shift
    m.register_buffer("shift", t + 1, persistent=False)


def _set_(m: Net) -> None:
    with torch.no_grad():
        m.a.weight.set_(torch.arange(9.0).reshape(3, 3) / 7)


def _swap_blocks(m: Net) -> None:
    b0, b1 = m.blocks[0], m.blocks[1]
    m.blocks[0], m.blocks[1] = b1, b0


def _unused_param(m: Net) -> None:
    m.a.register_parameter("extra", nn.Parameter(torch.tensor([4.0, 5.0])))


def _idle_child(m: Net) -> None:
    m.side_branch = lin(9)
    m.side_branch.idle = True


def _parametrize(m: Net) -> None:
    parametrize.register_parametrization(m.a, "weight", Neg())


def _prune(m: Net) -> None:
    prune.l1_unstructured(m.inner[0], "weight", amount=0.5)


def _load(m: Net) -> None:
    m.load_state_dict({k: v * 2 + 1 for k, v in m.state_dict().items()})


def _pre_hook(m: Net) -> None:
    m.inner.register_forward_pre_hook(lambda mod, args: (args[0] + 1,))


def _post_hook(m: Net) -> None:
    m.a.register_forward_hook(lambda mod, args, out: out * -5)


def _child_named_model(m: Net) -> None:
    m.model = lin(11)


def _swap_in_modules_dict(m: Net) -> None:
    # the same names, another object, written into _modules directly
    m._modules["a"] = lin(12)


def _tie(m: Net) -> None:
    m.blocks[1].weight = m.blocks[0].weight  # the same Parameter object under two names


def _seq_del(m: Net) -> None:
    m.inner.insert(0, lin(15))
    del m.inner[1]  # Sequential renumbers its children


def _module_dict(m: Net) -> None:
    m.d = nn.ModuleDict({"p": lin(16)})
    m.d["p"] = lin(17)  # replaced under the same key before the next install


def _modules_dict_replaced(m: Net) -> None:
    m.inner._modules = dict(m.inner._modules)
    m.inner._modules["9"] = Doubler()


#: name -> mutation applied between the two installs
MUTATIONS = {
    "add_child": lambda m: setattr(m, "c", lin(7)),
    "add_module_nested": lambda m: m.inner.add_module("extra", lin(8)),
    "del_child": lambda m: delattr(m, "a"),
    "replace_other_class": lambda m: setattr(m, "a", Doubler()),
    "replace_same_class": lambda m: setattr(m, "a", lin(13)),
    "replace_in_modules_dict": _swap_in_modules_dict,
    "modules_dict_replaced": _modules_dict_replaced,
    "modulelist_append": lambda m: m.blocks.append(lin(14)),
    "modulelist_swap": _swap_blocks,
    "modulelist_pop": lambda m: m.blocks.pop(0),
    "register_unused_param": _unused_param,
    "param_reassigned": lambda m: setattr(m.a, "weight", nn.Parameter(torch.eye(3) * 2)),
    "param_none": lambda m: setattr(m.a, "bias", None),
    "root_param_none": lambda m: setattr(m, "scale", None),
    "buffer_reassigned": lambda m: setattr(m, "shift", torch.tensor([9.0, 8.0, 7.0])),
    "buffer_none": lambda m: m.register_buffer("shift", None),
    "buffer_nonpersistent": _nonpersistent,
    "data_swap": lambda m: setattr(m.a.weight, "data", torch.full((3, 3), 0.125)),
    "set_": _set_,
    "class_swap": lambda m: setattr(m.a, "__class__", Tripled),
    "shared_added": lambda m: setattr(m, "alias", m.a),
    "idle_child_added": _idle_child,
    "child_named_model": _child_named_model,
    "parametrize": _parametrize,
    "prune": _prune,
    "load_state_dict": _load,
    "user_pre_hook": _pre_hook,
    "user_post_hook": _post_hook,
    "double": lambda m: m.double(),
    "tie_weights": _tie,
    "sequential_insert_del": _seq_del,
    "module_dict": _module_dict,
}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_change_between_installs_is_seen(name: str) -> None:
    model = Net()
    x = torch.from_numpy(X)
    assert_same(captured(model, x), oracle(model, x))
    assert kept(model)  # the second install may reuse a plan: the case tests the plan
    MUTATIONS[name](model)
    if name == "double":
        x = x.double()
    assert_same(captured(model, x), oracle(model, x))
    assert_same(captured(model, x), oracle(model, x))  # a third install, plan re-made


def test_buffer_slot_none_then_set_between_installs() -> None:
    model = Net()
    model.register_buffer("late", None)
    model.a.register_parameter("late_p", None)
    x = torch.from_numpy(X)
    assert_same(captured(model, x), oracle(model, x))
    model.late = torch.tensor([3.0, 1.0])
    model.a.late_p = nn.Parameter(torch.tensor([-2.0]))
    got = captured(model, x)
    assert "checker_late" in got and "checker_a.late_p" in got
    assert_same(got, oracle(model, x))


def test_user_hook_removed_between_installs() -> None:
    model = Net()
    x = torch.from_numpy(X)
    h = model.a.register_forward_hook(lambda mod, args, out: out + 100)
    first = captured(model, x)
    assert_same(first, oracle(model, x))
    h.remove()
    second = captured(model, x)
    assert_same(second, oracle(model, x))
    assert not np.array_equal(first["checker_a"], second["checker_a"])


def test_shared_child_unshared_between_installs() -> None:
    model = Net()
    model.alias = model.inner
    x = torch.from_numpy(X)
    assert_same(captured(model, x), oracle(model, x))
    assert "checker_alias.0.weight" in oracle(model, x)
    del model.alias
    assert_same(captured(model, x), oracle(model, x))


def test_shared_child_first_name_deleted_between_installs() -> None:
    """The module is hooked under its first name; once that name goes, under the other."""
    model = Net()
    model.z = model.a  # called once (children() lists it once), named "a" first
    x = torch.from_numpy(X)
    assert_same(captured(model, x), oracle(model, x))
    del model.a
    got = captured(model, x)
    assert "checker_z" in got and "checker_a" not in got
    assert_same(got, oracle(model, x))


class _Forwarding(nn.Module):
    """A PEFT-like wrapper: unknown attributes are looked up on the wrapped model."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner_model = inner

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.inner_model, name)

    def forward(self, v):
        return self.inner_model(v)


@pytest.mark.parametrize("kind", ["getattr_wrapper", "scripted_part"])
def test_models_the_plan_does_not_cover_are_walked_each_time(kind: str) -> None:
    model: nn.Module = Net()
    if kind == "getattr_wrapper":
        model = _Forwarding(model)
        inner = model.inner_model
    else:
        model.inner = torch.jit.script(model.inner)
        inner = model
    x = torch.from_numpy(X)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        captured(model, x)
        assert install_plan is None or id(model) not in install_plan._PLANS  # not planned
        inner.a = Doubler()
        inner.blocks.append(lin(70))
        got = captured(model, x)
    want = oracle(model, x)
    assert_same(got, want)


def test_dynamic_quantization_in_place_between_installs() -> None:
    """Linear modules swapped for packed quantized ones: the plan must not be reused."""
    model = Net()
    x = torch.from_numpy(X)
    assert_same(captured(model, x), oracle(model, x))
    torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, inplace=True)
    got = captured(model, x)
    want = {  # the oracle's module calls; packed weights are methods, not parameters
        t: v for t, v in oracle(model, x).items() if "_packed_params" not in t
    }
    for name in ("a", "inner.0", "blocks.0", "blocks.1"):
        mod = model.get_submodule(name)
        want[param_tag(f"{name}.weight")] = _np(mod.weight())
        want[param_tag(f"{name}.bias")] = _np(mod.bias())
    assert_same(got, want)


@pytest.mark.parametrize("keep", [False, True])
def test_parametrization_removed_between_installs(keep: bool) -> None:
    model = Net()
    parametrize.register_parametrization(model.a, "weight", Neg())
    x = torch.from_numpy(X)
    assert_same(captured(model, x), oracle(model, x))
    parametrize.remove_parametrizations(model.a, "weight", leave_parametrized=keep)
    got = captured(model, x)
    assert "checker_a.weight" in got and "checker_a.parametrizations.weight.original" not in got
    assert_same(got, oracle(model, x))


def test_weight_norm_added_between_installs() -> None:
    model = Net()
    x = torch.from_numpy(X)
    assert_same(captured(model, x), oracle(model, x))
    torch.nn.utils.parametrizations.weight_norm(model.blocks[1])
    got = captured(model, x)
    assert "checker_blocks.1.parametrizations.weight.original0" in got
    assert_same(got, oracle(model, x))


def test_global_module_hook_added_and_removed_between_installs() -> None:
    model = Net()
    x = torch.from_numpy(X)
    assert_same(captured(model, x), oracle(model, x))

    def hook(mod, args, out):
        return out + 7 if isinstance(mod, nn.Linear) else None

    h = torch.nn.modules.module.register_module_forward_hook(hook)
    try:
        got, want = captured(model, x), oracle(model, x)
    finally:
        h.remove()
    assert_same(got, want)
    assert_same(captured(model, x), oracle(model, x))


def test_class_gains_a_forward_between_installs() -> None:
    """A container class given a ``forward`` (on the class) is hooked at the next install."""
    box_cls = type("Box", (nn.Module,), {})
    model = Net()
    model.box = box_cls()
    model.box.lin = lin(21)
    model.box.idle = True
    x = torch.from_numpy(X)
    assert_same(captured(model, x), oracle(model, x))
    box_cls.forward = lambda self, v: self.lin(v)
    model.box.idle = False
    got = captured(model, x)
    assert "checker_box" in got and "checker_box_input_0" in got
    assert_same(got, oracle(model, x))


def test_class_forward_replaced_between_installs() -> None:
    sub = type("Sub", (nn.Linear,), {"forward": lambda self, v: nn.Linear.forward(self, v)})
    model = Net()
    model.a.__class__ = sub
    x = torch.from_numpy(X)
    assert_same(captured(model, x), oracle(model, x))
    sub.forward = lambda self, v: nn.Linear.forward(self, v) - 1
    assert_same(captured(model, x), oracle(model, x))


def test_training_flip_between_installs_warns_each_time_it_matters() -> None:
    model = Net()
    model.drop = nn.Dropout(0.5)  # mode-dependent (p > 0)
    x = torch.from_numpy(X)

    def warned() -> bool:
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            captured(model, x)
        return any("training mode" in str(m.message) for m in w)

    model.eval()
    assert not warned()
    model.drop.train()  # one submodule only
    assert warned()
    model.eval()
    assert not warned()
    model.train()
    assert warned()
    model.drop.p = 0.0  # training, but nothing depends on the mode any more
    assert not warned()


def test_deepcopy_of_a_planned_model_is_its_own_model() -> None:
    model = Net()
    x = torch.from_numpy(X)
    captured(model, x)
    twin = copy.deepcopy(model)
    twin.a = Doubler()
    assert_same(captured(twin, x), oracle(twin, x))
    assert_same(captured(model, x), oracle(model, x))
    assert "checker_a.weight" in captured(model, x) and "checker_a.weight" not in oracle(twin, x)


def test_two_models_of_one_structure_each_capture_their_own_values() -> None:
    one, two = Net(0), Net(100)
    x = torch.from_numpy(X)
    for _ in range(2):
        for m in (one, two, one):
            assert_same(captured(m, x), oracle(m, x))
    assert not np.array_equal(captured(one, x)["checker_a"], captured(two, x)["checker_a"])


def test_dataparallel_like_wrapper_of_a_planned_model() -> None:
    class Wrapper(nn.Module):
        def __init__(self, module):
            super().__init__()
            self.module = module

        def forward(self, v):
            return self.module(v)

    model = Net()
    x = torch.from_numpy(X)
    captured(model, x)
    wrapped = Wrapper(model)
    assert_same(captured(wrapped, x), oracle(wrapped, x))
    model.a = lin(31)  # changed through the inner model: the wrapper's next install sees it
    assert_same(captured(wrapped, x), oracle(wrapped, x))
    assert_same(captured(model, x), oracle(model, x))


@pytest.mark.parametrize("blocks", [1, 2, 3])
def test_models_made_and_dropped_in_turn_never_get_another_models_plan(blocks: int) -> None:
    """Ids are reused once a model is collected: each new model is captured as itself."""
    x = torch.from_numpy(X)
    for i in range(12):
        model = Net(i)
        for _ in range((i + blocks) % 3):
            model.blocks.append(lin(40 + i))
        if i % 2:
            model.a = Doubler()
        assert_same(captured(model, x), oracle(model, x))
        del model
        gc.collect()


@pytest.mark.parametrize("cycle", [False, True])
def test_plan_keeps_no_model_alive(cycle: bool) -> None:
    model = Net()
    if cycle:  # a child that refers back to its root (not as a submodule)
        object.__setattr__(model.a, "owner", model)
    x = torch.from_numpy(X)
    captured(model, x)
    captured(model, x)
    ref = weakref.ref(model)
    subs = [weakref.ref(m) for m in model.modules()]
    del model
    gc.collect()
    assert ref() is None
    assert all(r() is None for r in subs)
    if install_plan is not None:
        assert not install_plan._PLANS


def test_handle_left_installed_then_model_dropped_is_collected() -> None:
    model = Net()
    x = torch.from_numpy(X)
    checker = TensorChecker(verbose=False)
    handle = module_register_tensor_checker(model, checker, side=0)
    with torch.no_grad():
        model(x)
    handle.remove()
    checker.clear()
    ref = weakref.ref(model)
    del model, handle
    gc.collect()
    assert ref() is None


def test_model_with_hooks_never_removed_is_collected_with_its_checker() -> None:
    model = Net()
    x = torch.from_numpy(X)
    checker = TensorChecker(verbose=False)
    handle = module_register_tensor_checker(model, checker, side=0)
    with torch.no_grad():
        model(x)
    ref = weakref.ref(model)
    del model, handle, checker
    gc.collect()
    assert ref() is None
    assert install_plan is None or not install_plan._PLANS


@pytest.mark.parametrize("kept_models", [17, 40])
def test_more_models_than_plans_kept(kept_models: int) -> None:
    x = torch.from_numpy(X)
    models = [Net(i) for i in range(kept_models)]
    for m in models:
        captured(m, x)
    for i, m in enumerate(models):
        if i % 3 == 0:
            m.blocks.append(lin(60 + i))
        assert_same(captured(m, x), oracle(m, x))


@pytest.mark.slow
def test_compiled_wrapper_of_a_planned_model() -> None:
    model = Net().eval()
    x = torch.from_numpy(X)
    captured(model, x)
    compiled = torch.compile(model, backend="eager")
    got = captured(compiled, x)
    want = oracle(model, x)
    assert sorted(got) == sorted(want)
    model.a = Doubler()  # the original changes after a plan was made for it
    assert_same(captured(model, x), oracle(model, x))


# ----------------------------------------------------------------------------- run_parity twice


def _expected_rows(ref: nn.Module, cand: nn.Module, x: torch.Tensor) -> dict[str, bool]:
    """``{tag: passes}`` from the oracle: every tag of either side; a one-sided tag fails."""
    r, c = oracle(ref.eval(), x), oracle(cand.eval(), x)
    tags = set(r) | set(c)
    return {
        t: t in r
        and t in c
        and r[t].shape == c[t].shape
        and r[t].dtype == c[t].dtype
        and np.array_equal(r[t], c[t])
        for t in tags
    }


def _rows(result) -> dict[str, bool]:
    rows = result.modules.to_pylist()
    assert len({r["tag"] for r in rows}) == len(rows)
    return {r["tag"]: r["status"] in PASSING for r in rows}


RUN_MUTATIONS = {
    "cand_child_replaced": lambda ref, cand: setattr(cand, "a", lin(50)),
    "cand_child_added": lambda ref, cand: setattr(cand, "c", lin(51)),
    "ref_child_deleted": lambda ref, cand: delattr(ref, "a"),
    "cand_weight_data": lambda ref, cand: setattr(cand.inner[0].weight, "data", torch.ones(3, 3)),
    "cand_bias_none": lambda ref, cand: setattr(cand.blocks[1], "bias", None),
    "cand_class_swap": lambda ref, cand: setattr(cand.a, "__class__", Tripled),
    "ref_hook": lambda ref, cand: ref.blocks[0].register_forward_hook(lambda m, a, o: o + 1),
}


@pytest.mark.parametrize("name", sorted(RUN_MUTATIONS))
def test_run_parity_twice_sees_the_change(name: str) -> None:
    ref = Net()
    cand = copy.deepcopy(ref)
    x = torch.from_numpy(X)
    first = run_parity(ref, cand, (x.clone(),), mode="equal")
    assert _rows(first) == _expected_rows(ref, cand, x)
    assert all(_rows(first).values())
    RUN_MUTATIONS[name](ref, cand)
    second = run_parity(ref, cand, (x.clone(),), mode="equal")
    want = _expected_rows(ref, cand, x)
    assert _rows(second) == want
    assert not all(want.values())
    for row in second.modules.to_pylist():  # the max abs diff of each compared pair, numpy
        r, c = oracle(ref, x).get(row["tag"]), oracle(cand, x).get(row["tag"])
        if r is not None and c is not None and r.shape == c.shape and row["max_abs_diff"]:
            want_diff = np.abs(r.astype(np.float64) - c.astype(np.float64)).max()
            assert row["max_abs_diff"] == pytest.approx(want_diff, rel=1e-6)


@pytest.mark.parametrize("name", ["cand_child_replaced", "cand_child_added"])
def test_op_level_run_twice_sees_the_change(name: str) -> None:
    ref = Net()
    cand = copy.deepcopy(ref)
    x = torch.from_numpy(X)
    first = run_parity(ref, cand, (x.clone(),), mode="equal", capture_ops=True)
    assert _rows(first) == _expected_rows(ref, cand, x)
    RUN_MUTATIONS[name](ref, cand)
    second = run_parity(ref, cand, (x.clone(),), mode="equal", capture_ops=True)
    want = _expected_rows(ref, cand, x)
    assert _rows(second) == want and not all(want.values())
    ops = second.ops.to_pylist()
    assert ops and not all(r["status"] in PASSING for r in ops)


@pytest.mark.parametrize("name", ["add_child", "del_child", "class_swap", "param_none"])
def test_run_parity_of_one_model_against_itself_is_refused(name: str) -> None:
    """One object as both sides: refused (it gave extra '@1' rows comparing a forward with
    itself, main e6f4452 and before), before and after a structural change."""
    model = Net()
    x = torch.from_numpy(X)
    with pytest.raises(InputError, match=r"shares module objects.*<root>.*deepcopy"):
        run_parity(model, model, (x.clone(),), mode="equal")
    MUTATIONS[name](model)
    with pytest.raises(InputError, match=r"shares module objects.*<root>.*deepcopy"):
        run_parity(model, model, (x.clone(),), mode="equal")
    other = copy.deepcopy(model)  # the fix the message names
    assert _rows(run_parity(model, other, (x.clone(),), mode="equal")) == dict.fromkeys(
        oracle(model.eval(), x), True
    )


# ----------------------------------------------------------------------------- small copies

N = 16  # elements: 64 bytes, held as bytes in a bulk round
BUDGET = 32 * 4096  # the least budget whose bulk bound (1/16) holds two 4 KiB sides


def held_bytes(checker: TensorChecker) -> int:
    """Bytes the captures really hold in memory: distinct HeldBytes and snapshot storages.

    Counted from the captures (not the store's counter): what a budget must bound.
    """
    seen: dict[int, int] = {}
    for g in checker._log.groups.values():
        for cap in g.captures:
            v = cap.value
            if type(v) is HeldBytes:
                seen[id(v)] = len(v.data)
            elif isinstance(v, torch.Tensor) and not isinstance(v, nn.Parameter):
                seen[id(v)] = v.untyped_storage().nbytes()
    return sum(seen.values())


def small_values(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, N)).astype(np.float32)


@pytest.mark.parametrize("count", [2600, pytest.param(5000, marks=pytest.mark.slow)])
def test_thousands_of_small_reference_copies_spill_within_the_budget(count: int) -> None:
    ref = small_values(count, 1)
    cand = ref.copy()
    bad = set(range(0, count, 97)) | {count - 1}
    for i in bad:
        cand[i, i % N] += 0.5
    checker = TensorChecker(verbose=False, eager_mode="equal", max_resident_bytes=BUDGET)
    for i in range(count):
        checker.register_tensor(f"t{i}", torch.from_numpy(ref[i].copy()), side=0)
        if i % 500 == 0:
            assert held_bytes(checker) <= BUDGET
    assert held_bytes(checker) <= BUDGET
    assert checker.resident_bytes == held_bytes(checker)
    assert checker.peak_resident_bytes <= BUDGET
    assert checker.spilled_bytes >= count * N * 4 - BUDGET  # the rest had to go to disk
    for i in range(count):
        checker.register_tensor(f"t{i}", torch.from_numpy(cand[i].copy()), side=1)
        if i % 500 == 0:
            assert held_bytes(checker) <= BUDGET
    rows = checker.check("equal").to_rows()
    assert len(rows) == count
    for r in rows:
        i = int(r["tag"][1:])
        assert (r["status"] in PASSING) == (i not in bad), r["tag"]
        want = float(np.abs(ref[i].astype(np.float64) - cand[i]).max())
        assert (r["max_abs_diff"] or 0.0) == pytest.approx(want), r["tag"]


def test_small_copies_freed_and_remade_across_rounds() -> None:
    checker = TensorChecker(verbose=False, eager_mode="equal", max_resident_bytes=BUDGET)
    for rnd in range(3):
        ref = small_values(2200, 10 + rnd)  # 2048 fit: the rest spill
        live = [torch.from_numpy(ref[i].copy()) for i in range(2200)]
        for i, t in enumerate(live):
            checker.register_tensor(f"r{rnd}_{i}", t, side=0)
        del live  # the sources die; only the copies may hold the values
        gc.collect()
        assert checker.resident_bytes == held_bytes(checker) <= BUDGET
        for i in range(2200):
            v = ref[i].copy()
            if i == rnd:
                v[0] = -v[0] + 1
            checker.register_tensor(f"r{rnd}_{i}", torch.from_numpy(v), side=1)
        rows = checker.check("equal").to_rows()
        assert len(rows) == 2200
        failing = sorted(int(r["tag"].split("_")[1]) for r in rows if r["status"] not in PASSING)
        assert failing == [rnd]
        checker.clear()
        assert checker.resident_bytes == 0


def test_module_level_small_activations_under_a_budget_run_parity() -> None:
    """A model of 600 tiny modules (no weights): run_parity's rows against numpy."""

    class Step(nn.Module):
        def __init__(self, k: float) -> None:
            super().__init__()
            self.k = k

        def forward(self, v):
            return v * self.k + 1

    class Chain(nn.Module):
        def __init__(self, ks) -> None:
            super().__init__()
            self.steps = nn.ModuleList(Step(k) for k in ks)

        def forward(self, v):
            for s in self.steps:
                v = s(v)
            return v

    ks = [1.0 - (i % 5) * 0.125 for i in range(600)]
    ref, cand = Chain(ks), Chain(ks)
    cand.steps[300].k = 0.5 if ks[300] != 0.5 else 0.25
    x = torch.from_numpy(small_values(1, 3))
    checker = TensorChecker(verbose=False, eager_mode="equal", max_resident_bytes=BUDGET)
    for _round in range(2):  # twice: the second round reuses the plans
        with torch.no_grad():
            with module_register_tensor_checker(ref, checker, side=0):
                ref(x.clone())
            assert held_bytes(checker) <= BUDGET
            with module_register_tensor_checker(cand, checker, side=1):
                cand(x.clone())
        rows = {r["tag"]: r["status"] in PASSING for r in checker.check("equal").to_rows()}
        assert rows == _expected_rows(ref, cand, x)
        assert not all(rows.values())
        checker.clear()


def _small_only(checker: TensorChecker) -> int:
    """2600 small reference copies, 2048 fit: each one past the budget spills the oldest."""
    values = small_values(2600, 5)
    for i in range(2600):
        checker.register_tensor(f"t{i}", torch.from_numpy(values[i].copy()), side=0)
    # at least the copies past the budget (as on main); a little more: small copies spill
    # down to SMALL_SLACK below the budget at once (amortized look-ups)
    assert checker._store.spilled_count >= 2600 - BUDGET // (N * 4)
    return 2600


def _big_past_small(checker: TensorChecker) -> int:
    """1500 small copies stay live; then 60 regular 16 KiB snapshots, most of them spilled."""
    values = small_values(1500, 6)
    for i in range(1500):
        checker.register_tensor(f"s{i}", torch.from_numpy(values[i].copy()), side=0)
    for i in range(60):
        checker.register_tensor(f"b{i}", torch.full((4096,), float(i)), side=0)
    assert checker._store.spilled_count > 0
    return 1560


@pytest.mark.parametrize("fill", [_small_only, _big_past_small], ids=["small", "big_past_small"])
def test_spilling_looks_at_each_small_copy_a_bounded_number_of_times(
    monkeypatch: pytest.MonkeyPatch, fill
) -> None:
    """Work, not time: entries the store's bookkeeping scans, per capture admitted."""
    store_mod = pytest.importorskip("parity_tracker.capture.store")
    small = getattr(store_mod, "SmallCopies", None)
    if small is None:
        pytest.skip("main: one store entry per small copy, nothing rescanned")
    scanned = [0]
    live = small.live

    def counting(self):
        scanned[0] += len(self.entries)
        return live(self)

    monkeypatch.setattr(small, "live", counting)
    checker = TensorChecker(verbose=False, eager_mode="equal", max_resident_bytes=BUDGET)
    admitted = fill(checker)
    assert held_bytes(checker) <= BUDGET
    assert scanned[0] <= 8 * admitted  # amortized: a few looks per copy (SmallCopies' promise)


def _kinds() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """name -> (reference, candidate): small tensors of every layout the bulk path sees."""
    g = torch.Generator().manual_seed(7)
    base = torch.randn(4, 6, generator=g)
    z = torch.complex(base, base.flip(0))
    other = base.clone()
    other[1, 2] += 0.25
    return {
        "contiguous": (base.clone(), base.clone()),
        "contiguous_diff": (base.clone(), other),
        "transposed": (base.t(), base.clone().t()),
        "transposed_diff": (base.t(), other.t()),
        "offset_slice": (base[1:, 2:], base.clone()[1:, 2:]),
        "expanded": (base[0].expand(40, 6), base[0].clone().expand(40, 6)),
        "expanded_diff": (base[0].expand(40, 6), other[1].expand(40, 6)),
        "conj_vs_physical": (z.conj(), torch.conj_physical(z)),
        "conj_vs_plain": (z.conj(), z.clone()),
        "neg_bit": (torch._neg_view(base), -base),
        "neg_bit_diff": (torch._neg_view(base), base.clone()),
        "bool": (base > 0, base.clone() > 0),
        "bool_diff": (base > 0, other > 0.1),
        "int8": (base.mul(10).to(torch.int8), base.mul(10).to(torch.int8)),
        "float16_diff": (base.half(), other.half()),
        "bfloat16_diff": (base.bfloat16(), other.bfloat16()),
        "parameter": (nn.Parameter(base.clone()), base.clone()),
        "zero_dim": (base[0, 0].clone(), base[0, 0].clone() + 1),
        "empty": (base[:0], base.clone()[:0]),
        "largest_held": (torch.ones(1024), torch.ones(1024)),
        "just_past_held": (torch.ones(1025), torch.ones(1025).index_fill(0, torch.tensor([3]), 2)),
    }


def _want_pass(r: torch.Tensor, c: torch.Tensor) -> bool:
    rv = (
        r.detach().resolve_conj().resolve_neg().to(torch.float64 if not r.is_complex() else r.dtype)
    )
    cv = c.detach().resolve_conj().resolve_neg().to(rv.dtype)
    return r.dtype == c.dtype and r.shape == c.shape and np.array_equal(rv.numpy(), cv.numpy())


@pytest.mark.parametrize("eager", ["equal", None])
def test_bulk_small_pairs_of_every_layout_against_numpy(eager: str | None) -> None:
    kinds = _kinds()
    checker = TensorChecker(verbose=False, eager_mode=eager, max_resident_bytes=BUDGET)
    for tag, (r, _c) in kinds.items():
        checker.register_tensor(tag, r, side=0)
    for tag, (_r, c) in kinds.items():
        checker.register_tensor(tag, c, side=1)
    rows = {r["tag"]: r["status"] in PASSING for r in checker.check("equal").to_rows()}
    assert rows == {tag: _want_pass(r, c) for tag, (r, c) in kinds.items()}


class _Small(nn.Module):
    def forward(self, v):
        return v + 1


class _Big(nn.Module):
    def __init__(self, k: float) -> None:
        super().__init__()
        self.k = k

    def forward(self, v):
        return v * 1, torch.full((16 << 10,), float(v.sum()) * self.k)  # a 64 KiB output


class _Mixed(nn.Module):
    """1200 small steps; every 60th also makes a 64 KiB tensor (regular snapshots)."""

    def __init__(self, ks) -> None:
        super().__init__()
        self.s = nn.ModuleList(_Small() for _ in range(1200))
        self.b = nn.ModuleList(_Big(k) for k in ks)

    def forward(self, v):
        for i, m in enumerate(self.s):
            v = m(v)
            if i % 60 == 0:
                v, _ = self.b[i // 60](v)
        return v


def test_small_and_regular_snapshots_spilled_together_stay_within_the_budget() -> None:
    ks = [1.0] * 20
    ref, cand = _Mixed(ks), _Mixed([*ks[:7], 2.0, *ks[8:]])
    x = torch.from_numpy(small_values(1, 9)[0])
    checker = TensorChecker(verbose=False, eager_mode="equal", max_resident_bytes=BUDGET * 2)
    with torch.no_grad():
        with module_register_tensor_checker(ref, checker, side=0):
            ref(x.clone())
        assert held_bytes(checker) <= BUDGET * 2
        assert checker.resident_bytes == held_bytes(checker)
        assert checker._store.spilled_count > 0
        with module_register_tensor_checker(cand, checker, side=1):
            cand(x.clone())
    rows = {r["tag"]: r["status"] in PASSING for r in checker.check("equal").to_rows()}
    r_out, c_out = oracle_outputs(ref, x), oracle_outputs(cand, x)
    assert sorted(rows) == sorted(r_out)
    for tag, ok in rows.items():
        assert ok == np.array_equal(r_out[tag], c_out[tag]), tag
    assert rows["checker_b.7_output_1"] is False and rows["checker_b.6_output_1"] is True


def oracle_outputs(model: nn.Module, x: torch.Tensor) -> dict[str, np.ndarray]:
    """The oracle's tags for models whose outputs may be tuples (``_output_{i}``)."""
    out: dict[str, np.ndarray] = {}
    handles = []
    for name, mod in model.named_modules():
        if mod is not model and type(mod).forward is nn.Module.forward:
            continue
        disp = name or "model"

        def pre(m, args, disp=disp):
            for i, a in enumerate(args):
                out[input_tag(disp, str(i))] = _np(a)

        def post(m, args, output, disp=disp):
            if isinstance(output, tuple):
                for i, o in enumerate(output):
                    out[output_tag(disp, str(i))] = _np(o)
            else:
                out[module_tag(disp)] = _np(output)

        handles += [mod.register_forward_pre_hook(pre), mod.register_forward_hook(post)]
    try:
        with torch.no_grad():
            model(x.clone())
    finally:
        for h in handles:
            h.remove()
    return out


@pytest.mark.slow
def test_hf_model_resized_embeddings_between_installs() -> None:
    """A tiny Llama: its embeddings and head replaced by ``resize_token_embeddings``."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        vocab_size=32,
        hidden_size=8,
        intermediate_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.tensor([[1, 5, 7]])
    first = captured(model, ids)
    assert first["checker_model.embed_tokens.weight"].shape == (32, 8)
    assert kept(model)
    model.resize_token_embeddings(40)
    got = captured(model, ids)
    for qname in ("model.embed_tokens.weight", "lm_head.weight"):
        want = model.get_parameter(qname).detach().numpy()
        assert want.shape[0] == 40
        np.testing.assert_array_equal(got[param_tag(qname)], want)
    logits = model(ids).logits.detach().numpy()  # the root is "root": a child is "model"
    np.testing.assert_array_equal(got["checker_root_output_logits"], logits)

"""torch.compile candidates compared module by module (parity_tracker.adapters.compiled)."""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch
from torch import nn

from parity_tracker.adapters import compiled
from parity_tracker.capture.tags import output_tag
from parity_tracker.errors import InputError
from parity_tracker.run import run_parity
from parity_tracker.tensor_checker import TensorChecker, module_register_tensor_checker

pytestmark = pytest.mark.slow  # every test compiles (Dynamo; one runs Inductor)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.norm = nn.GroupNorm(2, 8)
        self.act = nn.ReLU(inplace=True)  # rewrites its input: captures must be copies

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.norm(self.conv(x)))


class Net(nn.Module):
    def __init__(self, graph_break: bool = False) -> None:
        super().__init__()
        self.block = Block()
        self.head = nn.Linear(8 * 6 * 6, 5)
        self.graph_break = graph_break

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.block(x)
        if self.graph_break:
            torch._dynamo.graph_break()
        return self.head(y.flatten(1))


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _pair(graph_break: bool = False):
    with torch.random.fork_rng():
        torch.manual_seed(0)
        ref = Net(graph_break).eval()
        x = torch.rand(2, 3, 6, 6, generator=torch.Generator().manual_seed(1))
    return ref, copy.deepcopy(ref), x


def _rows(result):
    return {r["tag"]: r for r in result.modules.to_pylist()}


def _leaf_outputs(model: nn.Module) -> set[str]:
    return {output_tag(n) for n, m in model.named_modules() if n and not list(m.children())}


def test_compiled_copy_is_equal_module_by_module_and_tags_drop_orig_mod():
    ref, cand, x = _pair()
    result = run_parity(ref, torch.compile(cand, backend="eager"), (x,), dump_mode="not")
    rows = _rows(result)
    assert not [t for t in rows if "_orig_mod" in t]
    # every leaf module's output and the root's are compared, and equal (eager backend)
    wanted = _leaf_outputs(ref) | {"checker_block", "checker_model"}
    assert wanted <= set(rows)
    assert {rows[t]["status"] for t in rows} == {"equal"}
    assert result.settings["implementation"] == "same"  # eager backend: the sanity check
    assert result.settings["compile_backend"] == "eager"
    assert result.settings["compile_graph_breaks"] == 0
    assert result.settings["compile_graphs"] == 1


def test_values_come_from_the_compiled_graph_not_an_eager_rerun(monkeypatch):
    ref, cand, x = _pair()
    opt = torch.compile(cand, backend="eager")
    calls = []
    real = Block.forward
    monkeypatch.setattr(Block, "forward", lambda s, y: calls.append(1) or real(s, y))
    result = run_parity(ref, opt, (x,), dump_mode="not")
    assert result.passed
    # Dynamo traced Block.forward once into the graph (reference: 1 eager call; candidate:
    # 1 call while tracing); no extra eager forward ran to produce the captured values
    assert len(calls) == 2


def test_one_module_bug_is_the_first_divergence():
    ref, cand, x = _pair()
    with torch.no_grad():
        cand.block.norm.bias[3] += 1e-3
    result = run_parity(ref, torch.compile(cand, backend="eager"), (x,), dump_mode="not")
    first = result.first_divergence
    assert first["tag"] == "checker_block.norm"
    # independent value: the nudge passes unchanged through GroupNorm's affine output
    with torch.no_grad():
        expected = (cand.block.norm(ref.block.conv(x)) - ref.block.norm(ref.block.conv(x))).abs()
    assert first["max_abs_diff"] == pytest.approx(float(expected.max()), abs=1e-7)
    assert _rows(result)["checker_block.conv"]["status"] == "equal"


def test_graph_breaks_are_counted_and_capture_still_complete():
    ref, cand, x = _pair(graph_break=True)
    result = run_parity(ref, torch.compile(cand, backend="eager"), (x,), dump_mode="not")
    assert result.settings["compile_graph_breaks"] >= 1
    assert result.settings["compile_graphs"] >= 2
    assert result.passed
    assert _leaf_outputs(ref) <= set(_rows(result))


def test_warmed_then_hooked_is_recompiled_with_a_warning_and_captured():
    ref, cand, x = _pair()
    opt = torch.compile(cand, backend="eager")
    with torch.no_grad():
        opt(x)  # compiled and run before any hook: its code has no hooks in it
    with pytest.warns(UserWarning, match=r"torch\._dynamo\.reset\(\)"):
        result = run_parity(ref, opt, (x,), dump_mode="not")
    rows = _rows(result)
    assert _leaf_outputs(ref) <= set(rows)
    assert {r["status"] for r in rows.values()} == {"equal"}
    assert result.settings["compile_recompiled"] is True


def test_seed_api_on_a_warmed_compiled_model():
    ref, cand, x = _pair()
    opt = torch.compile(cand, backend="eager")
    with torch.no_grad():
        opt(x)
    checker = TensorChecker(verbose=False)
    module_register_tensor_checker(ref, checker)
    with pytest.warns(UserWarning, match="recompiles with the hooks traced in"):
        module_register_tensor_checker(opt, checker)
    with torch.no_grad():
        ref(x)
        opt(x)
    result = checker.check_equal()
    assert result.passed
    assert {r.tag for r in result.results} >= _leaf_outputs(ref)


def test_stale_code_that_cannot_be_discarded_fails_loudly(monkeypatch):
    ref, cand, x = _pair()
    opt = torch.compile(cand, backend="eager")
    with torch.no_grad():
        opt(x)
    from parity_tracker.capture import compiled as capture_compiled  # the hooking half

    monkeypatch.setattr(capture_compiled, "_discard_stale_code", lambda model: False)
    result = run_parity(ref, opt, (x,), dump_mode="not")
    assert result.status == "failed"
    assert "torch._dynamo.reset()" in result.error["message"]
    rows = _rows(result)
    inner = [rows[t] for t in _leaf_outputs(ref)]
    assert all(r["status"] == "missing_candidate" for r in inner)  # nothing uncaptured passes
    assert not result.passed


def test_inductor_without_a_cxx_compiler_is_an_input_error():
    from torch._inductor import config

    ref, cand, x = _pair()
    with config.patch({"cpp.cxx": (None, "no-such-c++-compiler")}):
        with pytest.raises(InputError, match="apt-get install g\\+\\+") as info:
            run_parity(ref, torch.compile(cand, backend="inductor"), (x,), dump_mode="not")
        assert info.value.exit_code == 2
        with pytest.raises(InputError, match="no-such-c"):
            compiled.compile_model(cand, "inductor")


def test_inductor_copy_is_close_module_by_module():
    pytest.importorskip("torch._inductor")
    if not compiled.shutil.which("g++"):
        pytest.skip("no C++ compiler")
    ref, cand, x = _pair()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = run_parity(ref, compiled.compile_model(cand, "inductor"), (x,), dump_mode="not")
    rows = _rows(result)
    assert result.mode == "budget"  # implementation=inductor: another implementation (issue 15)
    assert result.settings["compile_backend"] == "inductor"
    assert _leaf_outputs(ref) <= set(rows)
    assert result.passed
    # independent bound: inductor reorders float32 sums; the output stays within float32
    # rounding of the eager value (|diff| <= 1e-5 * (1 + |ref|) on this 5-logit head)
    with torch.no_grad():
        want = ref(x).numpy()
    diff = rows["checker_model"]["max_abs_diff"]
    assert diff <= 1e-5 * (1 + np.abs(want).max())


def test_a_raising_compiled_forward_keeps_what_ran_before():
    ref, cand, x = _pair()

    def boom(module, args, output):
        raise RuntimeError("engine failure in head")

    cand.head.register_forward_hook(boom)  # present at compile time: traced, raises at run
    result = run_parity(ref, torch.compile(cand, backend="eager"), (x,), dump_mode="not")
    assert result.status == "failed"
    assert "engine failure in head" in result.error["message"]
    rows = _rows(result)
    assert rows["checker_block.norm"]["status"] == "equal"  # captured before the failure
    assert rows["checker_model"]["status"] == "missing_candidate"
    assert not result.passed

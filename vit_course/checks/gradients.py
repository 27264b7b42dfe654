"""Gradient flow (the differentiable exercises of chapters 01-05 and 07): a right output is not enough, the model
must be able to learn through it.

``gradient_flow`` backpropagates a random projection of the learner's output and of the reference's, and asks
that every input and parameter that should learn gets a finite, non-zero gradient, the reference's. Code that
cuts the graph (``.detach()``, ``.data``, ``torch.no_grad()``, a detour through numpy) gives the right numbers
and no gradient; the message names the input that gets none and the lines of the learner's code that may cut it.
"""

import inspect
import re

import torch
from einops import rearrange

CUT = "look for `.detach()`, `.data`, `torch.no_grad()` or a detour through numpy"
NOT_TRAINED = "a plain tensor or a buffer is not trained"
CUT_AT = "in your code, line "  # the likely cause of a cut: the lines of learner code that may cut the graph
CUTS = (  # what, on a line of learner code, may cut the graph
    r"\.detach\(", r"\.data\b", r"no_grad|inference_mode|set_grad_enabled", r"\.numpy\(|\bnp\.|\bnumpy\b",
    r"torch\.(tensor|as_tensor|from_numpy)\(|\.tolist\(|\.item\(",
    r"requires_grad_?\(\s*False|requires_grad\s*=\s*False",
)


def _sources(learner):
    """The learner's function, or the methods of its class on the way of a forward pass: __init__, forward and the
    methods they call on self, each with the definitions it overrides (``super().forward(...)`` reaches them); not
    torch's or the course's, nor methods given for other uses, like to_conv."""
    if not isinstance(learner, type):
        return _with_helpers([learner])
    methods = {}  # name -> the learner's definitions of it along the MRO
    for klass in learner.__mro__:
        if not klass.__module__.startswith(("torch", "builtins", "vit_course")) or klass.__module__.startswith(
                "vit_course.checks."):  # the records' slips are a learner's code
            for name, f in vars(klass).items():
                if inspect.isfunction(f):
                    methods.setdefault(name, []).append(f)
    todo, seen, found = ["__init__", "forward"], set(), []
    while todo:
        name = todo.pop()
        if name in seen or name not in methods:
            continue
        seen.add(name)
        for f in methods[name]:
            try:
                source = inspect.getsource(f)
            except (OSError, TypeError):
                source = ""
            found.append(f)
            todo += re.findall(r"self\.(\w+)\(", source)
    return _with_helpers(found)


def _with_helpers(functions):
    """``functions`` and the learner's helpers they reach: the functions they close over or call by a global name
    (a lambda or a function of another cell), not torch's or the course's."""
    found, todo = [], list(functions)
    while todo:
        f = todo.pop()
        if f in found or not inspect.isfunction(f):
            continue
        found.append(f)
        cells = []
        for cell in f.__closure__ or ():
            try:
                cells.append(cell.cell_contents)
            except ValueError:  # an empty cell
                continue
        named = [g for g in map(f.__globals__.get, f.__code__.co_names) if inspect.isfunction(g) and not
                 g.__module__.startswith("vit_course")]
        todo += [g for g in cells + named if inspect.isfunction(g) and not g.__module__.startswith(
            ("torch", "einops", "numpy"))]
    return found


def cut_lines(learner):
    """[(line number, code)] of the learner's function or class (line numbers of its cell or file) that may cut
    the graph; [] when its source cannot be read."""
    found = set()
    for source in _sources(learner):
        try:
            lines, start = inspect.getsourcelines(source)
        except (OSError, TypeError):
            continue
        for i, line in enumerate(lines):
            code = line.split("#")[0]
            if any(re.search(pattern, code) for pattern in CUTS):
                found.add((max(start, 1) + i, line.strip()))
    return sorted(found)


def cut_hint(learner):
    """The likely cause of a gradient that does not arrive: the lines of the learner's code that may cut it."""
    found = cut_lines(learner)
    if not found:
        return None
    shown = "; ".join(f"line {n}: `{code}`" for n, code in found[:3])
    return CUT_AT + shown[len("line "):]


def _reaches(c, name, got, expected, hint):
    """A gradient reaches ``name`` (where the reference's is not zero everywhere), and it is finite."""
    if (got is None or not bool((got != 0).any())) and bool((expected != 0).any()):
        c.fail(f"no gradient reaches `{name}`: {CUT}" if got is None else
               f"the gradient reaching `{name}` is zero everywhere: {CUT}", hint)
    if got is not None and not bool(torch.isfinite(got).all()):
        c.fail(f"the gradient reaching `{name}` contains {'NaN' if torch.isnan(got).any() else 'inf'}",
               hint or "an -inf that does not go through masked_fill or torch.where (0 * inf is NaN), or a "
                       "division by a number that can be 0")


def _compare(c, name, got, expected, hint):
    """The gradient reaching ``name`` is the reference's."""
    got = torch.zeros_like(expected) if got is None else got
    if got.shape != expected.shape and got.ndim == 4 and expected.ndim == 2:  # a Conv2d patch projection
        got = rearrange(got, "d c p1 p2 -> d (p1 p2 c)")
    scale = float(expected.abs().max()) or 1.0
    if got.shape != expected.shape or not torch.allclose(got, expected, rtol=1e-3, atol=1e-4 * scale):
        diff = (got - expected).abs().max().item() if got.shape == expected.shape else float("nan")
        c.fail(f"the gradient reaching `{name}` differs from the reference's (largest difference {diff:.3g}), "
               f"though the output is right: part of the path to `{name}` is cut from the graph, or goes "
               "through an operation without a useful gradient (rounding, argmax, a comparison); " + CUT, hint)


def same_gradient(c, name, got, expected, learner):
    """Fail unless the gradient ``got`` reaching ``name`` is finite, non-zero and ``expected``."""
    hint = cut_hint(learner)
    _reaches(c, name, got, expected, hint)
    _compare(c, name, got, expected, hint)


def gradient_flow(c, learner, run, reference_run, inputs, model=None, reference=None, what="the output"):
    """Backpropagate through the learner's code and the reference's; fail unless the same gradients arrive.

    ``learner``: the function or class, to point at lines that may cut the graph; ``run(leaves)`` and
    ``reference_run(leaves)`` compute the two outputs from ``leaves``, copies of ``inputs`` ({name: tensor})
    that require grad; ``model`` and ``reference``: modules whose parameters must all get the reference's
    gradients (the learner's by the same names). Failures belong to the rule "gradient".
    """
    before = c.rule
    c.phase("gradient")
    mine, theirs = ({k: v.detach().clone().requires_grad_() for k, v in inputs.items()} for _ in range(2))
    for module in (model, reference):
        if module is not None:
            module.zero_grad(set_to_none=True)
    hint = cut_hint(learner)
    with torch.enable_grad():
        expected = reference_run(theirs)
        out = c.tensor(run(mine), what, expected.shape)
        if not out.requires_grad:
            c.fail(f"{what} carries no gradient at all (it does not require grad), so nothing before it would "
                   f"ever learn: {CUT}", hint)
        weight = torch.randn(expected.shape, generator=torch.Generator().manual_seed(99))
        (expected * weight).sum().backward()
        try:
            (out * weight).sum().backward()
        except Exception as error:  # e.g. a tensor the backward pass needs was changed in place
            c._raised(error)
    pairs = []  # parameters first: the closest to a cut
    if reference is not None:
        learned = dict(model.named_parameters())
        for name, parameter in reference.named_parameters():
            if name not in learned:
                c.fail(f"`{name}` is not a trainable parameter of your module: it would never learn",
                       f"make it an nn.Parameter (`self.{name} = nn.Parameter(...)`): {NOT_TRAINED}")
            pairs.append((name, learned[name].grad, parameter.grad))
    pairs += [(name, mine[name].grad, theirs[name].grad) for name in inputs]
    for name, got, expected in pairs:
        _reaches(c, name, got, expected, hint)
    for name, got, expected in pairs:
        _compare(c, name, got, expected, hint)
    c.passed()
    c.rule = before
